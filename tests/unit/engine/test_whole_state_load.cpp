// Resuming a whole training state (engine/checkpoint/whole_state_load.h) and a DeepSpeed
// checkpoint's mapping onto it (engine/checkpoint/deepspeed_resume.h), issue 27:
//
//   - a one-rank run's whole state (its checkpoint read back whole: masters, exp_avg, exp_avg_sq,
//     counters, schedule) loaded with load_whole_state into TP x DP meshes at other ZeRO stages: the
//     loaded whole masters and states are the given ones exactly (the states read back from a
//     checkpoint saved right after the load), and one more step equals the original run's within
//     test_checkpoint_tensor_parallel's one-step tolerance;
//   - every Error of load_whole_state (missing / extra name, size, non-finite, state names,
//     optimizer step) leaves the engine as it was;
//   - map_hf_tensors: GPT-2's Conv1D weights transposed (a master and a moment alike), Llama's
//     q/k/v fused into qkv_proj, a tied lm_head; Errors for missing / unmapped / mis-shaped names
//     and a tied weight saved twice with different values;
//   - deepspeed_resume_state: what cannot carry over is refused, the loss scale under bf16 noted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_test_files.h"
#include "tp_mesh_run.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/checkpoint/deepspeed_resume.h"
#include "engine/checkpoint/whole_state_load.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;
using namespace checkpoint_testing;
using namespace zero_testing;
using Params = std::map<std::string, std::vector<float>>;

using namespace mesh_run;

// The runs here: the Llama model (GQA, tied embeddings) with a warmup schedule, so that the
// schedule's position is part of the state.
MeshSegment segment() {
  MeshSegment s;
  s.model = kLlamaModel;
  s.extra_json = R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 4}})";
  return s;
}

// A dstrain checkpoint read back whole: every parameter's master and Adam states, the counters and
// the schedule's position.
WholeTrainingState whole_state_of(const fs::path& dir, const std::string& tag) {
  CheckpointReader rd(dir, tag);
  const config::Json& m = rd.manifest();
  WholeTrainingState ws;
  ws.source = "test state " + tag;
  for (const config::Json& p : m.at("model").at("params")) {
    const std::string name = p.at("name").get<std::string>();
    const std::int64_t n = whole_numel(p.at("shape").get<std::vector<std::int64_t>>());
    for (const std::string buffer : {"master", "exp_avg", "exp_avg_sq"}) {
      std::vector<float> v(static_cast<std::size_t>(n));
      rd.read(buffer, name, 0, n, v.data());
      (buffer == "master" ? ws.masters[name] : ws.states[buffer][name]) = std::move(v);
    }
  }
  ws.global_steps = m.at("engine").at("global_steps").get<std::int64_t>();
  ws.global_samples = m.at("engine").at("global_samples").get<std::int64_t>();
  ws.skipped_steps = m.at("engine").at("skipped_steps").get<std::int64_t>();
  ws.optimizer_step = ws.global_steps - ws.skipped_steps;
  ws.lr_last_batch_iteration = m.at("lr_scheduler").at("last_batch_iteration").get<std::int64_t>();
  return ws;
}


TEST(WholeStateLoad, OneRankStateLoadsAtOtherMeshesExactly) {
  TempDir dir("whole_state");
  MeshSegment a = segment();
  a.stage = 1;
  a.to = 2;
  a.save_dir = dir.path;
  a.save_mid_after = 1;
  const MeshResult saved = run_mesh(a);
  const WholeTrainingState ws = whole_state_of(dir.path, "mid");
  for (const auto& [name, v] : saved.at_mid) ASSERT_TRUE(ws.masters.at(name) == v) << name;
  for (const auto& [tp, dp, stage] : std::vector<std::tuple<int, int, int>>{{1, 1, 0}, {1, 2, 3}, {2, 2, 1}, {4, 1, 2}, {2, 1, 3}}) {
    SCOPED_TRACE(fmt::format("load at TP {} x DP {}, stage {}", tp, dp, stage));
    TempDir out("whole_state_out");
    MeshSegment b = segment();
    b.tp = tp;
    b.dp = dp;
    b.stage = stage;
    b.from = 1;
    b.to = 2;
    b.whole = &ws;
    b.save_loaded = true;
    b.save_dir = out.path;
    const MeshResult r = run_mesh(b);
    // The loaded masters and states: the given ones exactly.
    for (const auto& [name, v] : ws.masters) EXPECT_TRUE(r.loaded.at(name) == v) << name;
    const WholeTrainingState back = whole_state_of(out.path, "loaded");
    EXPECT_TRUE(back.states == ws.states) << "the optimizer states written are not the given ones";
    EXPECT_EQ(back.global_steps, 1);
    EXPECT_EQ(back.lr_last_batch_iteration, ws.lr_last_batch_iteration);
    // One more step: the original run's within the reduction-order tolerance.
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_LE(std::abs(r.losses[0] - saved.losses[1]), 1e-6 * std::abs(saved.losses[1]));
    const Tolerance tol = one_step_tolerance();
    const ParamDiff d = compare_params(r.final, saved.final, saved.at_mid, tol.atol, tol.rtol);
    EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
    EXPECT_LE(d.update_rel, tol.update_rel);
  }
}

// Each broken state: an Error naming what is wrong, and the engine as initialize made it.
TEST(WholeStateLoad, ErrorsLeaveTheEngineUnchanged) {
  TempDir dir("whole_state_err");
  MeshSegment a = segment();
  a.to = 1;
  a.save_dir = dir.path;
  a.save_mid_after = 1;
  run_mesh(a);
  const WholeTrainingState good = whole_state_of(dir.path, "mid");
  const std::string p0 = good.masters.begin()->first;
  std::vector<std::pair<std::string, std::function<void(WholeTrainingState&)>>> cases = {
      {"no fp32 master for parameter '" + p0 + "'", [&](WholeTrainingState& w) { w.masters.erase(p0); }},
      {"which this model does not have", [](WholeTrainingState& w) { w.masters["bogus.weight"] = {1.0f}; }},
      {"elements, but the parameter is", [&](WholeTrainingState& w) { w.masters[p0].pop_back(); }},
      {"is not finite at element 3", [&](WholeTrainingState& w) { w.states["exp_avg"][p0][3] = NAN; }},
      {"optimizer states [exp_avg]", [](WholeTrainingState& w) { w.states.erase("exp_avg_sq"); }},
      {"optimizer has taken 5 steps", [](WholeTrainingState& w) { w.optimizer_step = 5; }},
      {"inconsistent", [](WholeTrainingState& w) { w.skipped_steps = 3; }},
  };
  for (const auto& [want, mutate] : cases) {
    SCOPED_TRACE(want);
    WholeTrainingState bad = good;
    mutate(bad);
    std::vector<Params> before(2), after(2);
    std::vector<std::string> errors(2);
    run_local_ranks(2, [&](Communicator& comm) {
      RunSpec s;
      s.stage = 2;
      s.world = 2;
      s.knobs.extra_json = R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 4}})";
      config::ConfigOptions copts;
      copts.world_size = 2;
      const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(s)), copts);
      EngineOptions o;
      o.seed = 11;
      o.comm = &comm;
      o.sequence_length = kT;
      Engine e = initialize(build_model(kLlamaModel, {0, 1}), c, o);
      CheckpointManager checkpoints(e);
      const std::size_t r = static_cast<std::size_t>(comm.rank());
      e.gather_master_params([&](const std::string& n, const Tensor& v) { before[r][n] = values(v); });
      try {
        checkpoints.load_whole_state(bad);
      } catch (const Error& ex) {
        errors[r] = ex.what();
      }
      e.gather_master_params([&](const std::string& n, const Tensor& v) { after[r][n] = values(v); });
      EXPECT_EQ(e.state().global_steps, 0);
    });
    for (std::size_t r = 0; r < 2; ++r) {
      EXPECT_NE(errors[r].find(want), std::string::npos) << "rank " << r << ": " << errors[r];
      EXPECT_TRUE(before[r] == after[r]) << "rank " << r << ": the engine changed";
    }
  }
}

// ---- Hugging Face names ----

std::vector<float> iota(std::int64_t n, float from) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = from + 0.001f * static_cast<float>(i);
  return v;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no Error)";
}

// GPT-2 (unpadded vocabulary): each Conv1D weight saved (in, out) — a master and a moment alike —
// comes out (out, in); transformer.-prefixed names; the tied lm_head saved once or twice alike.
TEST(DeepSpeedNames, Gpt2Conv1DTransposedAndTiedHead) {
  const auto arch = gpt2_family().from_spec("gpt2:L1-C8-H2-V16-T8");
  Params ours, hf;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  float base = 0.0f;
  bool saw_transposed = false;
  for (const auto& layer : arch->make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      const std::int64_t n = ps.shape.numel();
      ours[ps.name] = iota(n, base += 1.0f);
      std::vector<std::int64_t> dims;
      for (int d = 0; d < ps.shape.rank; ++d) dims.push_back(ps.shape[d]);
      std::vector<float> v = ours[ps.name];
      if (ps.hf_transposed) {
        saw_transposed = true;
        const std::int64_t o = dims[0], in = dims[1];
        for (std::int64_t i = 0; i < o; ++i)
          for (std::int64_t j = 0; j < in; ++j) v[static_cast<std::size_t>(j * o + i)] = ours[ps.name][static_cast<std::size_t>(i * in + j)];
        std::swap(dims[0], dims[1]);
      }
      if (ps.name == "wte.weight") {
        // The Hugging Face table has the real vocabulary; dstrain's padded rows come out zero.
        dims[0] = arch->vocab_size();
        v.resize(static_cast<std::size_t>(dims[0] * dims[1]));
        std::fill(ours[ps.name].begin() + dims[0] * dims[1], ours[ps.name].end(), 0.0f);
      }
      hf["transformer." + ps.name] = v;
      shapes["transformer." + ps.name] = dims;
    }
  }
  ASSERT_TRUE(saw_transposed);
  EXPECT_TRUE(map_hf_tensors(*arch, hf, shapes, "src", "exp_avg") == ours);
  // The tied head saved too, alike: the same; unlike: an Error naming both.
  Params twice = hf;
  twice["lm_head.weight"] = hf.at("transformer.wte.weight");
  EXPECT_TRUE(map_hf_tensors(*arch, twice, {}, "src", "fp32 master") == ours);
  twice["lm_head.weight"][0] += 1.0f;
  const std::string e = error_of([&] { map_hf_tensors(*arch, twice, {}, "src", "fp32 master"); });
  EXPECT_NE(e.find("tied weights 'transformer.wte.weight' and 'lm_head.weight'"), std::string::npos) << e;
  // A Conv1D weight saved as (out, in): mis-shaped, named.
  Params wrong_shape = hf;
  auto wrong_shapes = shapes;
  std::swap(wrong_shapes.at("transformer.h.0.attn.c_attn.weight")[0], wrong_shapes.at("transformer.h.0.attn.c_attn.weight")[1]);
  const std::string e2 = error_of([&] { map_hf_tensors(*arch, wrong_shape, wrong_shapes, "src", "exp_avg"); });
  EXPECT_NE(e2.find("'transformer.h.0.attn.c_attn.weight' is"), std::string::npos) << e2;
}

// Llama: q_proj / k_proj / v_proj are the row blocks of qkv_proj, in order; errors name the tensor.
TEST(DeepSpeedNames, LlamaQkvFusedAndErrors) {
  const auto arch = llama_family().from_spec(kLlamaModel);
  Params hf, ours;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::int64_t> rows_done;
  float base = 0.0f;
  for (const auto& layer : arch->make_layers())
    for (const ParamSpec& ps : layer->params())
      if (!ps.tied()) ours[ps.name] = std::vector<float>(static_cast<std::size_t>(ps.shape.numel()), 0.0f);
  bool saw_block = false;
  for (const HfParamName& p : arch->hf_param_names()) {
    if (p.name == "lm_head.weight" && p.param != "lm_head.weight") continue;  // tied: saved once, as the embedding
    const std::int64_t n = p.shape.numel();
    hf[p.name] = iota(n, base += 1.0f);
    shapes[p.name] = p.shape.rank == 2 ? std::vector<std::int64_t>{p.shape[0], p.shape[1]} : std::vector<std::int64_t>{p.shape[0]};
    std::int64_t& at = rows_done[p.param];
    const std::int64_t cols = p.shape.rank == 2 ? p.shape[1] : 1;
    std::copy(hf[p.name].begin(), hf[p.name].end(), ours[p.param].begin() + at * cols);
    at += p.shape[0];
    saw_block = saw_block || p.name.ends_with("k_proj.weight");
  }
  ASSERT_TRUE(saw_block);
  EXPECT_TRUE(map_hf_tensors(*arch, hf, shapes, "src", "fp32 master") == ours);
  {
    Params missing = hf;
    missing.erase("model.layers.1.self_attn.k_proj.weight");
    const std::string e = error_of([&] { map_hf_tensors(*arch, missing, shapes, "src", "fp32 master"); });
    EXPECT_NE(e.find("no fp32 master for 'model.layers.1.self_attn.k_proj.weight'"), std::string::npos) << e;
  }
  {
    Params extra = hf;
    extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = {1.0f};
    const std::string e = error_of([&] { map_hf_tensors(*arch, extra, shapes, "src", "exp_avg_sq"); });
    EXPECT_NE(e.find("'model.layers.0.self_attn.rotary_emb.inv_freq' is no tensor of this model"), std::string::npos) << e;
  }
  {
    Params short_v = hf;
    short_v["model.layers.0.self_attn.v_proj.weight"].pop_back();
    const std::string e = error_of([&] { map_hf_tensors(*arch, short_v, {}, "src", "exp_avg"); });
    EXPECT_NE(e.find("'model.layers.0.self_attn.v_proj.weight' has"), std::string::npos) << e;
  }
}

// What cannot carry over is refused; the loss scale under bf16 is a note; the scalars carry.
TEST(DeepSpeedResume, RefusesWhatCannotCarryOver) {
  const auto arch = gpt2_family().from_spec("gpt2:L1-C8-H2-V16-T8");
  DeepSpeedTrainingState ds;
  ds.dir = "/ds/global_step7";  // the reader gives the tag folder itself
  ds.tag = "global_step7";
  ds.zero_stage = 2;
  ds.dp_world_size = 4;
  ds.dtype = "bf16";
  for (const auto& layer : arch->make_layers()) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) continue;
      std::vector<std::int64_t> dims;
      for (int d = 0; d < ps.shape.rank; ++d) dims.push_back(ps.shape[d]);
      if (ps.hf_transposed) std::swap(dims[0], dims[1]);
      if (ps.name == "wte.weight") dims[0] = arch->vocab_size();
      const std::string n = "transformer." + ps.name;
      ds.names.push_back(n);
      ds.shapes[n] = dims;
      ds.master[n] = iota(whole_numel(dims), 1.0f);
      ds.optimizer_states["exp_avg"][n] = iota(whole_numel(dims), 0.0f);
      ds.optimizer_states["exp_avg_sq"][n] = iota(whole_numel(dims), 0.5f);
    }
  }
  ds.optimizer_step = 7;
  ds.optimizer_type = "FusedAdam";
  ds.global_steps = 7;
  ds.global_samples = 56;
  ds.loss_scaler = DeepSpeedLossScaler{65536.0, 7, -1, 2, true};
  ds.lr_scheduler_json = R"({"last_batch_iteration": 6})";
  const auto config_of = [](const std::string& extra) {
    return config::parse_ds_config(config::Json::parse(
        R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})" + extra + "}"),
                                   config::ConfigOptions{});
  };
  const std::string sched = R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}})";
  const DeepSpeedResume ok = deepspeed_resume_state(ds, *arch, config_of(sched));
  EXPECT_EQ(ok.state.global_steps, 7);
  EXPECT_EQ(ok.state.lr_last_batch_iteration, 6);
  EXPECT_FALSE(ok.state.loss_scaler.has_value());
  EXPECT_EQ(ok.carried, "masters, exp_avg, exp_avg_sq, step 7, lr schedule at iteration 6");
  EXPECT_EQ(ok.summary, "DeepSpeed checkpoint /ds/global_step7 (global_step 7, ZeRO stage 2 on 4 ranks, bf16)");
  ASSERT_EQ(ok.notes.size(), 1u);
  EXPECT_NE(ok.notes[0].find("dynamic loss scale 65536 is ignored: the config trains in bf16"), std::string::npos) << ok.notes[0];
  // The saved optimizer's lr against the config's schedule at the saved iteration: WarmupLR's log
  // warmup gives lr · ln(it + 1) / ln(W) (docs/lr_schedules.md), so the saved run at it 6 of W = 10
  // held 1e-3 · ln 7 / ln 10. The same schedule continues without a word; W = 20 would jump to
  // 1e-3 · ln 7 / ln 20, which a note says before step 1, with both schedules.
  DeepSpeedTrainingState at_lr = ds;
  at_lr.param_group["lr"] = 1e-3 * std::log(7.0) / std::log(10.0);
  at_lr.ds_config_json = R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}})";
  EXPECT_EQ(deepspeed_resume_state(at_lr, *arch, config_of(sched)).notes.size(), 1u);
  const DeepSpeedResume jump =
      deepspeed_resume_state(at_lr, *arch, config_of(R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 20}})"));
  ASSERT_EQ(jump.notes.size(), 2u);
  EXPECT_NE(jump.notes[0].find(fmt::format("its optimizer was at lr {:.6g}, but this config gives lr {:.6g} at iteration 6",
                                           1e-3 * std::log(7.0) / std::log(10.0), 1e-3 * std::log(7.0) / std::log(20.0))),
            std::string::npos)
      << jump.notes[0];
  EXPECT_NE(jump.notes[0].find(R"(its run's scheduler was {"type":"WarmupLR","params":{"warmup_num_steps":10}})"), std::string::npos) << jump.notes[0];
  const auto refused = [&](DeepSpeedTrainingState d, const std::string& extra, const std::string& want) {
    const std::string e = error_of([&] { deepspeed_resume_state(d, *arch, config_of(extra)); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  };
  DeepSpeedTrainingState lamb = ds;
  lamb.optimizer_type = "FusedLamb";
  refused(lamb, sched, "saved by optimizer FusedLamb, but the config's optimizer is \"AdamW\"");
  DeepSpeedTrainingState torch_sched = ds;
  torch_sched.lr_scheduler_json = R"({"last_epoch": 6, "base_lrs": [0.001]})";
  refused(torch_sched, sched, "is not one of DeepSpeed's schedulers");
  refused(ds, "", "but the config has no scheduler");
  DeepSpeedTrainingState step = ds;
  step.optimizer_step = 6;
  refused(step, sched, "its optimizer has taken 6 steps");
  DeepSpeedTrainingState sgd = ds;
  sgd.optimizer_states.erase("exp_avg_sq");
  refused(sgd, sched, "optimizer states [exp_avg]");
}

}  // namespace
}  // namespace dstrain
