// Training checkpoints through the engine (docs/checkpoints.md):
//   - resume bit for bit: N steps in one engine == N/2 steps, save, a new engine, load, N/2 steps —
//     the same loss every step, and the same parameters, 16-bit copies, optimizer states, counters,
//     loss scaler and LR schedule (the final checkpoints' rank files are byte-identical and their
//     manifests' scalars equal), over stages × worlds × dtypes × GAS × activation checkpointing ×
//     optimizers, fp16 saved in the middle of a hysteresis window;
//   - reshard: a checkpoint saved at (s, W) and loaded at (s', W') holds, saved again, exactly the
//     same values in parameter space; its continuation equals the (s, W) continuation within the
//     ZeRO equivalence tolerances (reduction order); the loss scaler crosses the ZeRO / non-ZeRO rules;
//   - corrupt, truncated, missing and foreign files, another model, an unknown tag: each an Error
//     naming the file (and tensor), the engine unchanged;
//   - tag validation, `latest`, a failed save leaving the previous checkpoint loadable.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_test_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manifest.h"
#include "models/model_registry.h"
#include "ops/crc32c.h"
#include "zero_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace checkpoint_testing;

namespace fs = std::filesystem;
using namespace zero_testing;

// A fresh folder under the test temp dir, removed at the end of the test.

struct Segment {
  std::optional<fs::path> load_dir;  // load latest from here first
  std::string load_tag;
  LoadCheckpointOptions load_options{};
  int from = 0, to = 0;              // optimizer steps [from, to) (global step numbers)
  std::optional<fs::path> save_dir;  // save at the end (tag "final" unless save_tag)
  std::string save_tag = "final";
  bool stochastic_rounding = false;
  int save_mid_at = -1;        // also save (tag "mid") after this step, and train on
  std::string extra_config{};  // keys added to the config, e.g. R"("checkpoint": {...})"
};

struct SegmentResult {
  std::vector<float> losses;
  std::vector<double> loss_scales;
  std::map<std::string, std::vector<float>> params;
  std::int64_t global_steps = 0, skipped = 0;
  config::Json client_state;
};

// Trains `seg` on s.world local ranks, feeding global step k's slots as run_zero does.
SegmentResult run_segment(const RunSpec& s, const Segment& seg) {
  SegmentResult out;
  std::string json = zero_config_json(s);
  if (!seg.extra_config.empty()) json.insert(json.size() - 1, ", " + seg.extra_config);
  run_local_ranks(s.world, [&](Communicator& comm) {
    const int r = comm.rank();
    config::ConfigOptions copts;
    copts.world_size = s.world;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = &comm;
    o.sequence_length = kT;
    o.checkpoint_activations = s.ckpt;
    o.bf16_stochastic_rounding = seg.stochastic_rounding;
    if (static_cast<std::size_t>(r) < s.inject_overflow.size()) o.inject_overflow_steps = s.inject_overflow[static_cast<std::size_t>(r)];
    Engine e = initialize(make_gpt2_model(model_config(s.dropout)), c, o);
    CheckpointManager e_checkpoints(e);
    if (seg.load_dir) {
      const LoadedCheckpoint l = e_checkpoints.load(*seg.load_dir, seg.load_tag, seg.load_options);
      EXPECT_TRUE(l.loaded());
      if (r == 0) out.client_state = l.client_state;
    }
    EXPECT_EQ(e.state().global_steps, seg.from);
    for (int step = seg.from; step < seg.to; ++step) {
      for (int m = 0; m < s.gas; ++m) {
        Tokens t = slot_batch(step, m * s.world + r);
        e.forward(t.batch());
        e.backward();
        e.step();
      }
      if (r == 0) {
        out.losses.push_back(e.state().last_step_loss);
        out.loss_scales.push_back(e.state().loss_scale);
      }
      if (step + 1 == seg.save_mid_at) e_checkpoints.save(*seg.save_dir, "mid", config::Json{{"step", step + 1}});
    }
    if (seg.save_dir) e_checkpoints.save(*seg.save_dir, seg.save_tag, config::Json{{"step", seg.to}, {"note", "client"}});
    e_checkpoints.wait();
    std::map<std::string, std::vector<float>> params;
    e.gather_master_params([&](const std::string& n, const Tensor& t) { params[n] = values(t); });
    if (r == 0) {
      out.params = std::move(params);
      out.global_steps = e.state().global_steps;
      out.skipped = e.state().skipped_steps;
    }
  });
  return out;
}


config::Json manifest_of(const fs::path& dir) { return config::Json::parse(file_bytes(dir / "checkpoint.json")); }

std::string describe(const RunSpec& s, const std::string& extra = "") {
  return fmt::format("stage {} world {} gas {} {} ckpt {} {}{}", s.stage, s.world, s.gas, precision_name(s.precision), s.ckpt,
                     s.knobs.optimizer_json.empty() ? "AdamW" : s.knobs.optimizer_json, extra);
}

// N steps == N/2, save, new engine, load, N/2: bitwise.
void expect_resume_bitwise(RunSpec s, int n, bool stochastic_rounding = false, const std::string& extra_config = "") {
  SCOPED_TRACE(describe(s, (stochastic_rounding ? " stochastic rounding " : " ") + extra_config));
  TempDir whole("whole"), split("split");
  Segment a;
  a.extra_config = extra_config;
  a.to = n;
  a.save_dir = whole.path;
  a.stochastic_rounding = stochastic_rounding;
  const SegmentResult ra = run_segment(s, a);

  Segment b1 = a;
  b1.to = n / 2;
  b1.save_dir = split.path;
  b1.save_tag = "";  // default: global_step<N>
  run_segment(s, b1);
  ASSERT_TRUE(fs::exists(split.path / fmt::format("global_step{}", n / 2) / "checkpoint.json"));
  ASSERT_EQ(file_bytes(split.path / "latest"), fmt::format("global_step{}", n / 2));
  Segment b2 = a;
  b2.load_dir = split.path;
  b2.from = n / 2;
  b2.save_dir = split.path;
  const SegmentResult rb = run_segment(s, b2);
  EXPECT_EQ(rb.client_state, (config::Json{{"step", n / 2}, {"note", "client"}}));

  ASSERT_EQ(rb.losses.size(), static_cast<std::size_t>(n - n / 2));
  for (std::size_t i = 0; i < rb.losses.size(); ++i) {
    EXPECT_EQ(rb.losses[i], ra.losses[n / 2 + i]) << "loss of step " << n / 2 + i + 1;
    EXPECT_EQ(rb.loss_scales[i], ra.loss_scales[n / 2 + i]) << "loss scale after step " << n / 2 + i + 1;
  }
  EXPECT_EQ(rb.params, ra.params);
  EXPECT_EQ(rb.skipped, ra.skipped);
  // Every saved tensor (masters, 16-bit params, every optimizer state) bit for bit: the rank files
  // of the two final checkpoints are the same bytes; and the same scalars.
  const int files = s.stage >= 1 ? s.world : 1;
  for (int k = 0; k < files; ++k) {
    const std::string name = rank_file_name(k, ".safetensors");
    EXPECT_EQ(file_bytes(whole.path / "final" / name), file_bytes(split.path / "final" / name)) << name;
  }
  const config::Json ma = manifest_of(whole.path / "final"), mb = manifest_of(split.path / "final");
  for (const char* key : {"engine", "loss_scaler", "lr_scheduler", "layout", "optimizer", "seed"}) EXPECT_EQ(ma.at(key), mb.at(key)) << key;
}

RunSpec spec(int stage, int world, Precision p, int gas = 1, bool ckpt = false) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.precision = p;
  s.gas = gas;
  s.ckpt = ckpt;
  // Small buckets: several chunks per layer, so pieces split tensors.
  s.knobs.reduce_bucket_size = 4000;
  s.knobs.allgather_bucket_size = 4000;
  s.knobs.persistence_threshold = 500;
  return s;
}

TEST(Checkpoint, ResumeBitwiseStagesWorldsDtypes) {
  for (const Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (int stage = 0; stage <= 3; ++stage)
      for (const int world : {1, 2}) expect_resume_bitwise(spec(stage, world, p, /*gas=*/world == 1 ? 2 : 1, /*ckpt=*/stage == 2), 4);
}

TEST(Checkpoint, ResumeBitwiseFourRanksGasCheckpointing) {
  expect_resume_bitwise(spec(1, 4, Precision::fp32, 2, false), 4);
  expect_resume_bitwise(spec(3, 4, Precision::bf16, 1, true), 4);
  expect_resume_bitwise(spec(2, 2, Precision::fp16, 2, true), 4);
}

TEST(Checkpoint, ResumeBitwiseStochasticRounding) {
  expect_resume_bitwise(spec(0, 1, Precision::bf16), 4, true);
  expect_resume_bitwise(spec(2, 2, Precision::bf16), 4, true);
}

// fp16 saved in the middle of a hysteresis window (ZeRO's DynamicLossScaler, hysteresis 2): the
// overflow of step 2 uses one unit of hysteresis; the checkpoint after it must carry that, or the
// overflow of step 3 would not halve the scale.
TEST(Checkpoint, ResumeFp16MidHysteresis) {
  for (const int stage : {1, 3}) {
    RunSpec s = spec(stage, 2, Precision::fp16);
    s.inject_overflow = {{2, 3}};
    expect_resume_bitwise(s, 4);
    TempDir d("hyst");
    Segment seg;
    seg.to = 2;
    seg.save_dir = d.path;
    run_segment(s, seg);
    const config::Json ls = manifest_of(d.path / "final").at("loss_scaler");
    EXPECT_EQ(ls.at("cur_hysteresis").get<int>(), 1) << ls.dump();
    EXPECT_EQ(ls.at("cur_scale").get<double>(), 256.0) << ls.dump();
  }
  // Non-ZeRO rule (halving, no hysteresis) likewise.
  RunSpec s0 = spec(0, 1, Precision::fp16);
  s0.inject_overflow = {{2, 3}};
  expect_resume_bitwise(s0, 4);
}

// Every LR schedule DeepSpeed has, mid-schedule: the resumed run must take up the schedule's position
// (and OneCycle's cycled momentum).
TEST(Checkpoint, ResumeBitwiseSchedules) {
  for (
      const char* sched :
      {R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 6}})",
       R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 2, "total_num_steps": 8}})",
       R"("scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 8}})",
       R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 3, "cycle_momentum": true}})",
       R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 2, "lr_range_test_step_rate": 1.0}})"}) {
    expect_resume_bitwise(spec(1, 2, Precision::fp32), 6, false, sched);
  }
  // A skipped fp16 step does not step the schedule: the count carries over.
  RunSpec s = spec(2, 2, Precision::fp16);
  s.inject_overflow = {{2}};
  expect_resume_bitwise(s, 6, false, R"("scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 8}})");
}

TEST(Checkpoint, ResumeBitwiseOptimizersAndSchedule) {
  const std::vector<std::pair<std::string, std::vector<int>>> optimizers = {
      {R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}})", {0, 1, 2, 3}},
      {R"({"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.1, "adam_w_mode": false}})", {0, 3}},
      {R"({"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}})", {0}},
      // The element-wise types (docs/optimizers.md §8): their states by torch's names, and the
      // scalars they derive from the step t (NAdam's mu_product, ASGD's eta and mu) and the
      // values written at t = 1 (Adagrad's sum, Rprop's step_size) continue across the resume.
      {R"({"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 0.01, "initial_accumulator_value": 0.1}})", {0, 2}},
      {R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})", {3}},
      {R"({"type": "RMSprop", "params": {"lr": 1e-3, "momentum": 0.9, "centered": true}})", {1}},
      {R"({"type": "NAdam", "params": {"lr": 1e-2}})", {2}},
      {R"({"type": "ASGD", "params": {"lr": 0.05, "t0": 1}})", {0}},
      {R"({"type": "Rprop", "params": {"lr": 1e-3}})", {3}},
  };
  for (const auto& [opt, stages] : optimizers) {
    for (const int stage : stages) {
      RunSpec s = spec(stage, stage == 0 ? 1 : 2, Precision::fp32);
      s.knobs.optimizer_json = opt;
      s.knobs.allow_untested_optimizer = true;
      expect_resume_bitwise(s, 4);
    }
  }
}

// Lamb at ZeRO 2 (exact trust ratios across partitions), and the 1-bit family on 2 ranks saved in
// the warm-up and resumed across the switch: their scalars (phase, counters) travel in the
// manifest, and before the switch the compression errors are still zero, so the resume is exact.
// (After the switch DeepSpeed, and dstrain, reset the errors at load: docs/optimizers_onebit.md §5.)
TEST(Checkpoint, ResumeBitwiseLambUnderZeroAndOneBitAcrossTheSwitch) {
  {
    RunSpec s = spec(2, 2, Precision::fp32);
    s.knobs.optimizer_json = R"({"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
    s.knobs.allow_untested_optimizer = true;
    expect_resume_bitwise(s, 4);
  }
  for (const char* opt : {R"({"type": "OneBitAdam", "params": {"lr": 1e-2, "freeze_step": 3}})",
                          R"({"type": "ZeroOneAdam", "params": {"lr": 1e-2, "var_freeze_step": 3}})",
                          R"({"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 3}})"}) {
    RunSpec s = spec(0, 2, Precision::fp32);
    s.knobs.optimizer_json = opt;
    expect_resume_bitwise(s, 6);
  }
}

// checkpoint.writer.decoupled: the save returns after the snapshot, training goes on while the
// files are written, the next save commits it; the checkpoint resumes bit for bit, and `latest`
// names a save only once it is committed.
TEST(Checkpoint, DecoupledWriterResumesBitwise) {
  for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{0, 1}, {3, 2}}) {
    RunSpec s = spec(stage, world, Precision::bf16);
    TempDir d("decoupled");
    Segment a;
    a.to = 4;
    a.save_mid_at = 2;
    a.save_dir = d.path;
    a.extra_config = R"("checkpoint": {"writer": {"decoupled": true}})";
    const SegmentResult ra = run_segment(s, a);
    EXPECT_EQ(file_bytes(d.path / "latest"), "final");
    Segment b;
    b.load_dir = d.path;
    b.load_tag = "mid";
    b.from = 2;
    b.to = 4;
    const SegmentResult rb = run_segment(s, b);
    ASSERT_EQ(rb.losses.size(), 2u);
    EXPECT_EQ(rb.losses[0], ra.losses[2]);
    EXPECT_EQ(rb.losses[1], ra.losses[3]);
    EXPECT_EQ(rb.params, ra.params);
  }
  // Pending until waited for: the folder carries the tag only once committed.
  TempDir d("decoupled_pending");
  std::string json = zero_config_json(spec(1, 2, Precision::fp32));
  json.insert(json.size() - 1, R"(, "checkpoint": {"writer": {"decoupled": true}})");
  run_local_ranks(2, [&](Communicator& comm) {
    config::ConfigOptions copts;
    copts.world_size = 2;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
    CheckpointManager e_checkpoints(e);
    e_checkpoints.save(d.path, "x");
    comm.barrier();
    EXPECT_FALSE(fs::exists(d.path / "x"));
    EXPECT_FALSE(fs::exists(d.path / "latest"));
    comm.barrier();
    e_checkpoints.wait();
    EXPECT_TRUE(fs::exists(d.path / "x" / "checkpoint.json"));
  });
  EXPECT_EQ(file_bytes(d.path / "latest"), "x");
}

// checkpoint.writer.type "fast" (O_DIRECT from staging buffers; here 4 KiB ones, so every file
// takes many buffers and ends in a padded, cut-off tail) writes the same bytes as the buffered
// "python" writer, synchronous or decoupled, single or double buffered, and its checkpoint
// resumes bit for bit.
TEST(Checkpoint, FastWriterWritesWhatTheBufferedWriterWritesAndResumesBitwise) {
  for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{0, 1}, {2, 2}}) {
    RunSpec s = spec(stage, world, Precision::bf16);
    SCOPED_TRACE(describe(s));
    TempDir fast("fast"), fast_single("fast_single"), python("python");
    Segment a;
    a.to = 4;
    a.save_mid_at = 2;
    a.save_dir = fast.path;
    a.extra_config = R"("checkpoint": {"writer": {"type": "fast", "io_buffer_size": 8192}})";
    const SegmentResult ra = run_segment(s, a);
    Segment b = a;
    b.save_dir = fast_single.path;
    b.extra_config = R"("checkpoint": {"writer": {"type": "fast", "io_buffer_size": 4096, "io_buffer_double": false, "decoupled": true}})";
    run_segment(s, b);
    Segment c = a;
    c.save_dir = python.path;
    c.extra_config = R"("checkpoint": {"writer": {"type": "python"}})";
    run_segment(s, c);
    const int files = stage >= 1 ? world : 1;
    for (const char* tag : {"mid", "final"}) {
      for (int k = 0; k < files; ++k) {
        for (const char* ext : {".safetensors", ".json"}) {
          const std::string name = rank_file_name(k, ext);
          const std::string want = file_bytes(python.path / tag / name);
          EXPECT_FALSE(want.empty()) << tag << "/" << name;
          EXPECT_EQ(file_bytes(fast.path / tag / name), want) << tag << "/" << name;
          EXPECT_EQ(file_bytes(fast_single.path / tag / name), want) << tag << "/" << name;
        }
      }
    }
    Segment load;
    load.load_dir = fast.path;
    load.load_tag = "mid";
    load.from = 2;
    load.to = 4;
    const SegmentResult rl = run_segment(s, load);
    ASSERT_EQ(rl.losses.size(), 2u);
    EXPECT_EQ(rl.losses[0], ra.losses[2]);
    EXPECT_EQ(rl.losses[1], ra.losses[3]);
    EXPECT_EQ(rl.params, ra.params);
  }
}

// ---- reshard ----

// Every buffer of every parameter, read whole from a checkpoint.
std::map<std::string, std::vector<std::uint32_t>> parameter_space(const fs::path& save_dir, const std::string& tag) {
  CheckpointReader rd(save_dir, tag);
  std::map<std::string, std::vector<std::uint32_t>> out;
  std::vector<std::string> buffers{"master"};
  for (const auto& n : rd.manifest().at("optimizer").at("states")) buffers.push_back(n.get<std::string>());
  if (rd.buffer_dtype("param")) buffers.emplace_back("param");
  for (const config::Json& p : rd.manifest().at("model").at("params")) {
    std::int64_t numel = 1;
    for (const auto& d : p.at("shape")) numel *= d.get<std::int64_t>();
    for (const std::string& b : buffers) {
      const std::size_t esize = dtype_size(*rd.buffer_dtype(b));
      std::vector<std::uint32_t> v(static_cast<std::size_t>((numel * static_cast<std::int64_t>(esize) + 3) / 4), 0u);
      rd.read(b, p.at("name").get<std::string>(), 0, numel, v.data());
      out[b + "/" + p.at("name").get<std::string>()] = std::move(v);
    }
  }
  return out;
}

// Optimizer offload (docs/training_state.md §3, §5): the partition in host memory is saved and
// loaded through its store like a device one — resume is bit for bit, and the rank files are the
// same bytes as the run without offload's (a checkpoint stores parameter space, not where the
// state lived), so one loads into the other.
TEST(Checkpoint, OptimizerOffloadResumesBitwiseAndSavesWhatTheDeviceRunSaves) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      RunSpec off = spec(stage, 2, p);
      off.knobs.zero_extra_json = R"("offload_optimizer": {"device": "cpu"})";
      off.knobs.sub_group_size = 5000;
      expect_resume_bitwise(off, 4);

      RunSpec plain = off;
      plain.knobs.zero_extra_json.clear();
      SCOPED_TRACE(describe(off, " offload vs device"));
      TempDir a("offload"), b("device");
      Segment seg;
      seg.to = 2;
      seg.save_dir = a.path;
      run_segment(off, seg);
      seg.save_dir = b.path;
      run_segment(plain, seg);
      for (int k = 0; k < 2; ++k) {
        const std::string name = rank_file_name(k, ".safetensors");
        EXPECT_EQ(file_bytes(a.path / "final" / name), file_bytes(b.path / "final" / name)) << name;
      }
      // Saved with offload, continued without it: the device run's own continuation.
      Segment cont;
      cont.from = 2;
      cont.to = 4;
      cont.load_dir = a.path;
      const SegmentResult from_offload = run_segment(plain, cont);
      cont.load_dir = b.path;
      const SegmentResult from_device = run_segment(plain, cont);
      EXPECT_EQ(from_offload.losses, from_device.losses);
      EXPECT_EQ(from_offload.params, from_device.params);
    }
  }
}

TEST(Checkpoint, ReshardAcrossStagesAndWorlds) {
  // The global batch is 4 micro-batches: (W, GAS) = (1, 4), (2, 2), (4, 1).
  const auto at = [](int stage, int world, Precision p) { return spec(stage, world, p, 4 / world); };
  // fp16 too: its loss scaler (scale, hysteresis, good steps) crosses stages and world sizes with
  // the rest of the state.
  for (const Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    for (const auto& [s0, w0] : std::vector<std::pair<int, int>>{{0, 1}, {2, 2}, {3, 4}}) {
      const RunSpec src = at(s0, w0, p);
      TempDir d("reshard_src");
      Segment save;
      save.to = 2;
      save.save_dir = d.path;
      run_segment(src, save);
      const auto saved_space = parameter_space(d.path, "final");
      Segment cont;
      cont.load_dir = d.path;
      cont.load_tag = "final";
      cont.from = 2;
      cont.to = 4;
      const SegmentResult ref = run_segment(src, cont);
      for (int s1 = 0; s1 <= 3; ++s1) {
        for (const int w1 : {1, 2, 4}) {
          if (s1 == s0 && w1 == w0) continue;
          if (s1 == 0 && w1 == 4) continue;  // keeps the matrix short: stage 0 is the same on any W
          SCOPED_TRACE(fmt::format("{} saved at stage {} W {}, loaded at stage {} W {}", precision_name(p), s0, w0, s1, w1));
          const RunSpec dst = at(s1, w1, p);
          // Loaded and saved again without a step: exactly the same parameter space.
          TempDir d2("reshard_dst");
          Segment again;
          again.load_dir = d.path;
          again.load_tag = "final";
          again.from = again.to = 2;
          again.save_dir = d2.path;
          run_segment(dst, again);
          EXPECT_TRUE(parameter_space(d2.path, "final") == saved_space);
          // The continuation: the ZeRO equivalence tolerances (reduction order differs with W).
          const SegmentResult got = run_segment(dst, cont);
          const Tolerance tol = tolerance(p);
          for (std::size_t i = 0; i < got.losses.size(); ++i)
            EXPECT_NEAR(got.losses[i], ref.losses[i], tol.loss_rtol * std::abs(ref.losses[i]) + 1e-7);
          std::map<std::string, std::vector<float>> init;
          {
            CheckpointReader rd(d.path, "final");
            for (const auto& [name, v] : ref.params) {
              std::vector<float> m(v.size());
              rd.read("master", name, 0, static_cast<std::int64_t>(v.size()), m.data());
              init[name] = std::move(m);
            }
          }
          const ParamDiff diff = compare_params(got.params, ref.params, init, tol.atol, tol.rtol);
          EXPECT_TRUE(diff.finite);
          EXPECT_LE(diff.update_rel, tol.update_rel) << diff.worst_tensor;
          EXPECT_LE(diff.key_bias_max_abs, tol.key_bias_abs);
        }
      }
    }
  }
}

// The per-tensor optimizers (docs/optimizers.md §9-§10): Muon's momentum buffers (the "exp_avg" slot
// of its matrices) with the Adam moments, and Adafactor's row / column factors (held at elements
// (i, 0) and (0, j)) resume bit for bit at stages 0, 2 and 3, and a checkpoint saved at stage 2 on
// 2 ranks loads at stage 3 on 4 ranks and at stage 0 on one rank in the same parameter space, the
// continuation within the ZeRO tolerances (whole-tensor quantities are gathered across ranks).
void expect_per_tensor_optimizer_resumes_and_reshards(const std::string& optimizer_json) {
  SCOPED_TRACE(optimizer_json);
  const auto muon = [&](int stage, int world, int gas) {
    RunSpec s = spec(stage, world, Precision::fp32, gas);
    s.knobs.optimizer_json = optimizer_json;
    s.knobs.reduce_scatter = false;  // stage 3 refuses Muon with it
    s.knobs.allow_untested_optimizer = true;
    return s;
  };
  for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{0, 1}, {2, 2}, {3, 2}}) expect_resume_bitwise(muon(stage, world, 1), 4);
  TempDir d("muon_src");
  Segment save;
  save.to = 2;
  save.save_dir = d.path;
  run_segment(muon(2, 2, 2), save);
  const auto saved_space = parameter_space(d.path, "final");
  Segment cont;
  cont.load_dir = d.path;
  cont.load_tag = "final";
  cont.from = 2;
  cont.to = 4;
  const SegmentResult ref = run_segment(muon(2, 2, 2), cont);
  for (const auto& [stage, world] : std::vector<std::pair<int, int>>{{3, 4}, {0, 1}}) {
    SCOPED_TRACE(fmt::format("loaded at stage {} W {}", stage, world));
    const RunSpec dst = muon(stage, world, 4 / world);
    TempDir d2("muon_dst");
    Segment again;
    again.load_dir = d.path;
    again.load_tag = "final";
    again.from = again.to = 2;
    again.save_dir = d2.path;
    run_segment(dst, again);
    EXPECT_TRUE(parameter_space(d2.path, "final") == saved_space);
    const SegmentResult got = run_segment(dst, cont);
    Tolerance tol = tolerance(Precision::fp32);
    // The key bias's gradient is rounding noise only; the per-tensor optimizers turn noise into
    // steps of their own size (Muon's auxiliary Adam at adam_lr), so its bound is a sanity bound:
    // measured up to 1.05e-4 (Muon, the -O1 sanitizer build), AdamW's 1e-4 with no margin.
    tol.key_bias_abs = 3e-4;
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], tol.loss_rtol * std::abs(ref.losses[i]) + 1e-7);
    std::map<std::string, std::vector<float>> init;
    {
      CheckpointReader rd(d.path, "final");
      for (const auto& [name, v] : ref.params) {
        std::vector<float> m(v.size());
        rd.read("master", name, 0, static_cast<std::int64_t>(v.size()), m.data());
        init[name] = std::move(m);
      }
    }
    // As the reshard test above: the key bias (no gradient but noise) is bounded apart.
    const ParamDiff diff = compare_params(got.params, ref.params, init, tol.atol, tol.rtol);
    EXPECT_TRUE(diff.finite);
    EXPECT_LE(diff.max_excess, 1.0) << diff.worst_element;
    EXPECT_LE(diff.update_rel, tol.update_rel) << diff.worst_tensor;
    EXPECT_LE(diff.key_bias_max_abs, tol.key_bias_abs);
  }
}

TEST(Checkpoint, MuonResumesBitwiseAndReshards) {
  expect_per_tensor_optimizer_resumes_and_reshards(R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.1}})");
}

TEST(Checkpoint, AdafactorResumesBitwiseAndReshards) {
  expect_per_tensor_optimizer_resumes_and_reshards(R"({"type": "Adafactor", "params": {"lr": 0.05, "weight_decay": 0.1}})");
}

TEST(Checkpoint, LossScalerCrossesZeroRules) {
  // Saved by the non-ZeRO rule (stage 0, no hysteresis) after an overflow halved the scale; loaded
  // at stage 1 (ZeRO's DynamicLossScaler): the scale carries over, the hysteresis starts full.
  RunSpec s0 = spec(0, 1, Precision::fp16);
  s0.inject_overflow = {{1}};
  TempDir d("scaler");
  Segment save;
  save.to = 2;
  save.save_dir = d.path;
  const SegmentResult r0 = run_segment(s0, save);
  ASSERT_EQ(r0.loss_scales.back(), 128.0);
  RunSpec s1 = spec(1, 2, Precision::fp16);
  TempDir d2("scaler2");
  Segment load;
  load.load_dir = d.path;
  load.from = load.to = 2;
  load.save_dir = d2.path;
  run_segment(s1, load);
  const config::Json ls = manifest_of(d2.path / "final").at("loss_scaler");
  EXPECT_EQ(ls.at("cur_scale").get<double>(), 128.0);
  EXPECT_EQ(ls.at("cur_hysteresis").get<int>(), 2);  // DeepSpeed's default hysteresis
  EXPECT_EQ(ls.at("cur_iter").get<int>(), 2);
  EXPECT_EQ(ls.at("last_overflow_iter").get<int>(), 0);
  // And back: a ZeRO checkpoint mid-hysteresis loads at stage 0 with its scale.
  RunSpec s2 = spec(2, 2, Precision::fp16);
  s2.inject_overflow = {{1}};
  TempDir d3("scaler3"), d4("scaler4");
  Segment save2 = save;
  save2.save_dir = d3.path;
  run_segment(s2, save2);
  EXPECT_EQ(manifest_of(d3.path / "final").at("loss_scaler").at("cur_hysteresis").get<int>(), 1);
  Segment load2 = load;
  load2.load_dir = d3.path;
  load2.save_dir = d4.path;
  run_segment(spec(0, 1, Precision::fp16), load2);
  EXPECT_EQ(manifest_of(d4.path / "final").at("loss_scaler").at("cur_scale").get<double>(), 256.0);
}

// ---- errors ----

// One rank, stage 1 over 2 ranks' files: a saved checkpoint and an engine to load it into.
struct ErrorFixture {
  TempDir dir{"errors"};
  TempDir probe{"errors_probe"};  // the loading engine's own saves, before and after a failed load
  RunSpec s = spec(1, 2, Precision::bf16);
  ErrorFixture() {
    Segment seg;
    seg.to = 1;
    seg.save_dir = dir.path;
    run_segment(s, seg);
  }
  fs::path file(const std::string& name) const { return dir.path / "final" / name; }
  // The load's error on a fresh 2-rank engine (rank 0's), checking the engine kept its weights —
  // and its whole training state: a fresh engine takes a checkpoint of its own layout straight
  // into its state, and a failed load puts the initial state back (Engine::restore_initial_state),
  // so the engine saved before and after the failure must write the same bytes.
  std::string load_error(const std::string& tag = "final", std::optional<RunSpec> at_opt = std::nullopt) {
    const RunSpec at = at_opt.value_or(s);
    std::string message;
    const std::string json = zero_config_json(at);
    run_local_ranks(at.world, [&](Communicator& comm) {
      config::ConfigOptions copts;
      copts.world_size = at.world;
      const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
      EngineOptions o;
      o.seed = 5;
      o.comm = &comm;
      o.sequence_length = kT;
      Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
      CheckpointManager e_checkpoints(e);
      std::map<std::string, std::vector<float>> before, after;
      e.gather_master_params([&](const std::string& n, const Tensor& t) { before[n] = values(t); });
      e_checkpoints.save(probe.path, "before");
      bool failed = false;
      try {
        e_checkpoints.load(dir.path, tag);
      } catch (const Error& err) {
        failed = true;
        if (comm.rank() == 0) message = err.what();
      }
      e.gather_master_params([&](const std::string& n, const Tensor& t) { after[n] = values(t); });
      if (failed) {
        EXPECT_TRUE(before == after) << "a failed load changed the weights";
        e_checkpoints.save(probe.path, "after");
        const std::string rank_file = rank_file_name(comm.rank(), ".safetensors");
        EXPECT_TRUE(file_bytes(probe.path / "before" / rank_file) == file_bytes(probe.path / "after" / rank_file))
            << "a failed load changed the training state (optimizer states or 16-bit params)";
      }
    });
    return message;
  }
};

// An engine that has loaded a checkpoint is no longer in its initial state: a failed load after it
// leaves the state it loaded (read whole before anything is written), never the initial one.
TEST(Checkpoint, FailedLoadAfterALoadKeepsTheLoadedState) {
  ErrorFixture f;
  fs::copy(f.dir.path / "final", f.dir.path / "bad", fs::copy_options::recursive);
  const fs::path data = f.dir.path / "bad" / rank_file_name(1, ".safetensors");
  std::string bad = file_bytes(data);
  bad[bad.size() - 3] ^= 0x10;  // the last tensor's data: found by its checksum, at the end of the file
  std::ofstream(data, std::ios::binary | std::ios::trunc) << bad;
  std::vector<std::string> errors(2);
  run_local_ranks(f.s.world, [&](Communicator& comm) {
    config::ConfigOptions copts;
    copts.world_size = f.s.world;
    EngineOptions o;
    o.seed = 5;
    o.comm = &comm;
    o.sequence_length = kT;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(f.s)), copts), o);
    CheckpointManager e_checkpoints(e);
    e_checkpoints.load(f.dir.path, "final");
    e_checkpoints.save(f.probe.path, "loaded");
    try {
      e_checkpoints.load(f.dir.path, "bad");
    } catch (const Error& err) {
      errors[static_cast<std::size_t>(comm.rank())] = err.what();
    }
    e_checkpoints.save(f.probe.path, "after");
    const std::string rank_file = rank_file_name(comm.rank(), ".safetensors");
    EXPECT_TRUE(file_bytes(f.probe.path / "loaded" / rank_file) == file_bytes(f.probe.path / "after" / rank_file))
        << "a failed load changed the state an earlier load had set";
  });
  EXPECT_NE(errors[0].find("checksum"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("checksum"), std::string::npos) << errors[1];
}

TEST(Checkpoint, CorruptTruncatedMissingForeignFiles) {
  ErrorFixture f;
  EXPECT_EQ(f.load_error(), "");  // the intact checkpoint loads
  const fs::path data = f.file(rank_file_name(1, ".safetensors"));
  const std::string good = file_bytes(data);
  {  // one flipped bit in the last tensor's data
    std::string bad = good;
    bad[bad.size() - 3] ^= 0x10;
    std::ofstream(data, std::ios::binary | std::ios::trunc) << bad;
    const std::string m = f.load_error();
    EXPECT_NE(m.find("checksum"), std::string::npos) << m;
    EXPECT_NE(m.find("rank_00001.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("param/"), std::string::npos) << m;  // the tensor: the last ones are the 16-bit params
  }
  {  // truncated
    std::ofstream(data, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
    const std::string m = f.load_error();
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
    EXPECT_NE(m.find("rank_00001.safetensors"), std::string::npos) << m;
  }
  {  // missing
    fs::remove(data);
    const std::string m = f.load_error();
    EXPECT_NE(m.find("missing"), std::string::npos) << m;
    EXPECT_NE(m.find("rank_00001.safetensors"), std::string::npos) << m;
  }
  std::ofstream(data, std::ios::binary | std::ios::trunc) << good;
  EXPECT_EQ(f.load_error(), "");
  {  // a rank index edited
    const fs::path idx = f.file(rank_file_name(0, ".json"));
    const std::string text = file_bytes(idx);
    std::ofstream(idx, std::ios::binary | std::ios::trunc) << text.substr(0, text.size() - 5);
    const std::string m = f.load_error();
    EXPECT_NE(m.find("rank_00000.json"), std::string::npos) << m;
    std::ofstream(idx, std::ios::binary | std::ios::trunc) << text;
  }
  {  // a manifest that is not ours
    const std::string text = file_bytes(f.file("checkpoint.json"));
    std::ofstream(f.file("checkpoint.json"), std::ios::binary | std::ios::trunc) << R"({"module": {}, "global_steps": 3})";
    const std::string m = f.load_error();
    EXPECT_NE(m.find("not a dstrain checkpoint"), std::string::npos) << m;
    std::ofstream(f.file("checkpoint.json"), std::ios::binary | std::ios::trunc) << "{\"format\": \"dstrain-chec";
    EXPECT_NE(f.load_error().find("not valid JSON"), std::string::npos);
    fs::remove(f.file("checkpoint.json"));
    EXPECT_NE(f.load_error().find("holds no checkpoint.json"), std::string::npos);
    // Valid JSON with a wrong type or an impossible value: an Error, the engine untouched.
    config::Json bad = config::Json::parse(text);
    bad["engine"]["global_steps"] = "three";
    std::ofstream(f.file("checkpoint.json"), std::ios::binary | std::ios::trunc) << bad.dump();
    std::string m2 = f.load_error();
    EXPECT_NE(m2.find("malformed"), std::string::npos) << m2;
    bad = config::Json::parse(text);
    bad["loss_scaler"]["cur_scale"] = -1.0;
    std::ofstream(f.file("checkpoint.json"), std::ios::binary | std::ios::trunc) << bad.dump();
    m2 = f.load_error();
    EXPECT_NE(m2.find("loss scaler"), std::string::npos) << m2;
    std::ofstream(f.file("checkpoint.json"), std::ios::binary | std::ios::trunc) << text;
  }
  EXPECT_EQ(f.load_error(), "");
  {  // an unknown tag names the ones there are
    const std::string m = f.load_error("global_step7");
    EXPECT_NE(m.find("not found"), std::string::npos) << m;
    EXPECT_NE(m.find("final"), std::string::npos) << m;
  }
}

// Hardening 3 §5: a manifest edited by hand (or damaged) is refused before anything is loaded, the
// message naming the field, the file and the value — before, an int8 dtype, a world size of 4 with
// 2 rank files and a step count of 10^18 were accepted.
TEST(Checkpoint, EditedManifestFieldsAreRefusedNamingTheField) {
  ErrorFixture f;
  const fs::path manifest = f.file("checkpoint.json");
  const std::string text = file_bytes(manifest);
  // The error of opening the checkpoint with `edit` applied to its manifest ("" when it opens).
  const auto refusal = [&](const std::function<void(config::Json&)>& edit) {
    config::Json m = config::Json::parse(text);
    edit(m);
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << m.dump(1);
    std::string message;
    try {
      CheckpointReader rd(f.dir.path, "final");
    } catch (const Error& e) {
      message = e.what();
    }
    std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
    return message;
  };
  const auto expect_refused = [&](const std::function<void(config::Json&)>& edit, const std::vector<std::string>& needles) {
    const std::string m = refusal(edit);
    EXPECT_NE(m.find("checkpoint.json"), std::string::npos) << m;
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
  };
  EXPECT_EQ(refusal([](config::Json&) {}), "");
  expect_refused([](config::Json& m) { m["layout"]["dtype"] = "int8"; }, {"layout.dtype", "int8", "fp32, fp16, bf16"});
  expect_refused([](config::Json& m) { m["layout"]["world_size"] = 4; }, {"\"ranks\"", "2 rank files", "layout.world_size 4"});
  expect_refused([](config::Json& m) { m["layout"]["zero_stage"] = 7; }, {"layout.zero_stage", "7"});
  expect_refused([](config::Json& m) { m["engine"]["global_steps"] = 1e18; }, {"engine.global_steps", "1e+18", "whole number"});
  expect_refused([](config::Json& m) { m["engine"]["global_steps"] = std::int64_t{1000000000000000000}; },
                 {"engine.global_steps", "1000000000000000000"});
  expect_refused([](config::Json& m) { m["engine"]["skipped_steps"] = 5; }, {"engine.skipped_steps", "5"});
  expect_refused([](config::Json& m) { m["engine"].erase("train_batch_size"); }, {"engine.train_batch_size", "missing"});
  expect_refused([](config::Json& m) { m["ranks"][0]["index"] = "../../rank_00000.json"; }, {"ranks[0].index", "rank_00000.json"});
  expect_refused([](config::Json& m) { m["loss_scaler"]["kind"] = "bogus"; }, {"loss_scaler.kind", "bogus"});
  expect_refused([](config::Json& m) { m["seed"] = -1; }, {"\"seed\"", "-1"});
  expect_refused([](config::Json& m) { m["model"]["params"][0]["shape"][0] = -3; }, {"model.params[0].shape[0]", "-3"});
  expect_refused([](config::Json& m) { m["lr_scheduler"]["last_batch_iteration"] = "x"; }, {"lr_scheduler.last_batch_iteration"});
  // A tag "global_step<N>" names the step it was saved at: an edited counter no longer matches it.
  expect_refused([](config::Json& m) { m["tag"] = "global_step9"; }, {"engine.global_steps", "global_step9"});
  // Through a load: the engine is left as it was (load_error checks it), the field named.
  config::Json m = config::Json::parse(text);
  m["layout"]["dtype"] = "int8";
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << m.dump(1);
  const std::string loaded = f.load_error();
  EXPECT_NE(loaded.find("layout.dtype"), std::string::npos) << loaded;
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text;
  EXPECT_EQ(f.load_error(), "");
}

TEST(Checkpoint, AnotherModelOrOptimizerIsRefused) {
  ErrorFixture f;
  // Another model: a 3-layer GPT-2 cannot load the 2-layer checkpoint.
  std::string message;
  run_local_ranks(1, [&](Communicator& comm) {
    config::ConfigOptions copts;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(spec(0, 1, Precision::fp32))), copts);
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    Gpt2Config mc = model_config_from_spec("gpt2:L3-C32-H2-V96-T16");
    Engine e = initialize(make_gpt2_model(mc), c, o);
    CheckpointManager e_checkpoints(e);
    try {
      e_checkpoints.load(f.dir.path, "final");
    } catch (const Error& err) {
      message = err.what();
    }
  });
  EXPECT_NE(message.find("another model"), std::string::npos) << message;
  // Another optimizer's states: refused unless load_optimizer_states = false.
  RunSpec sgd = spec(1, 2, Precision::bf16);
  sgd.knobs.optimizer_json = R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}})";
  sgd.knobs.allow_untested_optimizer = true;
  const std::string m = f.load_error("final", sgd);
  EXPECT_NE(m.find("load_optimizer_states"), std::string::npos) << m;
  Segment seg;
  seg.load_dir = f.dir.path;
  seg.load_tag = "final";
  seg.load_options.load_optimizer_states = false;
  seg.from = 1;
  seg.to = 2;
  EXPECT_EQ(run_segment(sgd, seg).global_steps, 2);
}

// A resume compares the model the manifest records with --model's key by key: a key that makes it
// another model (n_head: no parameter changes shape) is a difference of the model; a dropout
// probability only a training setting, which a resume may change (a
// fine-tuning run turns dropout off), said but not refused.
TEST(Checkpoint, ArchitectureDifferencesTellTheModelFromItsTrainingSettings) {
  const auto built = model_architecture("gpt2:L1-C16-H2-V64-T16");
  const auto manifest_of = [&](const std::function<void(config::Json&)>& edit) {
    config::Json c = config::Json::parse(built->config_json());
    edit(c);
    return config::Json{{"architecture", {{"family", "gpt2"}, {"config", c}}}};
  };
  const ArchitectureDifferences same = architecture_differences(manifest_of([](config::Json&) {}), "ck", *built);
  EXPECT_TRUE(same.model.empty());
  EXPECT_TRUE(same.settings.empty());
  const ArchitectureDifferences heads = architecture_differences(manifest_of([](config::Json& c) { c["n_head"] = 4; }), "ck", *built);
  ASSERT_EQ(heads.model.size(), 1u);
  EXPECT_EQ(heads.model[0], "n_head 4 in the checkpoint, 2 here");
  EXPECT_TRUE(heads.settings.empty());
  const ArchitectureDifferences dropout = architecture_differences(manifest_of([](config::Json& c) {
                                                                     c["attn_pdrop"] = 0.25;
                                                                     c["resid_pdrop"] = 0.5;
                                                                   }),
                                                                   "ck", *built);
  EXPECT_TRUE(dropout.model.empty()) << dropout.model.size();
  ASSERT_EQ(dropout.settings.size(), 2u);
  EXPECT_EQ(dropout.settings[0].rfind("attn_pdrop 0.25 in the checkpoint, ", 0), 0u) << dropout.settings[0];
  EXPECT_EQ(dropout.settings[1].rfind("resid_pdrop 0.5 in the checkpoint, ", 0), 0u) << dropout.settings[1];
}

TEST(Checkpoint, TagsLatestAndValidation) {
  TempDir d("tags");
  RunSpec s = spec(1, 2, Precision::fp32);
  // No latest: nothing loaded, a warning.
  run_local_ranks(2, [&](Communicator& comm) {
    config::ConfigOptions copts;
    copts.world_size = 2;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(s)), copts);
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
    CheckpointManager e_checkpoints(e);
    EXPECT_FALSE(e_checkpoints.load(d.path).loaded());
    // Different tags on the ranks with tag_validation Fail: an Error on every rank, nothing written.
    EXPECT_NO_THROW(e_checkpoints.save(d.path, "same"));  // default Warn, same tag: fine
    EXPECT_THROW(e_checkpoints.save(d.path, "bad/tag"), Error);
  });
  EXPECT_EQ(file_bytes(d.path / "latest"), "same");
  std::string json = zero_config_json(s);
  json.insert(json.size() - 1, R"(, "checkpoint": {"tag_validation": "Fail"})");
  std::vector<std::string> errors(2);
  run_local_ranks(2, [&](Communicator& comm) {
    config::ConfigOptions copts;
    copts.world_size = 2;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
    CheckpointManager e_checkpoints(e);
    try {
      e_checkpoints.save(d.path, comm.rank() == 0 ? "a" : "b");
    } catch (const Error& err) {
      errors[static_cast<std::size_t>(comm.rank())] = err.what();
    }
  });
  EXPECT_NE(errors[0].find("tag_validation"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("tag_validation"), std::string::npos) << errors[1];
  EXPECT_FALSE(fs::exists(d.path / "a"));
  EXPECT_EQ(file_bytes(d.path / "latest"), "same");
}

// A save that fails while writing (here the process's file size limit, which gives EFBIG as a full
// disk gives ENOSPC, and works for root too) is an Error on every rank naming the file and the
// cause, and leaves the previous checkpoint and `latest` as they were; the run goes on.
TEST(Checkpoint, FailedSaveKeepsPreviousCheckpoint) {
  TempDir d("failsave");
  RunSpec s = spec(2, 2, Precision::fp32);
  Segment seg;
  seg.to = 1;
  seg.save_dir = d.path;
  seg.save_tag = "good";
  run_segment(s, seg);
  std::vector<std::string> errors(2);
  std::vector<std::int64_t> steps_after(2, 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  run_local_ranks(2, [&](Communicator& comm) {
    config::ConfigOptions copts;
    copts.world_size = 2;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(s)), copts);
    EngineOptions o;
    o.comm = &comm;
    o.sequence_length = kT;
    Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
    CheckpointManager e_checkpoints(e);
    e_checkpoints.load(d.path);
    comm.barrier();
    if (comm.rank() == 0) {
      rlimit small = old_limit;
      small.rlim_cur = 16 * 1024;  // smaller than a rank's file
      ::setrlimit(RLIMIT_FSIZE, &small);
    }
    comm.barrier();
    try {
      e_checkpoints.save(d.path, "next");
    } catch (const Error& err) {
      errors[static_cast<std::size_t>(comm.rank())] = err.what();
    }
    comm.barrier();
    if (comm.rank() == 0) ::setrlimit(RLIMIT_FSIZE, &old_limit);
    comm.barrier();
    // The run's state is intact: it trains on.
    Tokens t = slot_batch(1, comm.rank());
    e.forward(t.batch());
    e.backward();
    e.step();
    steps_after[static_cast<std::size_t>(comm.rank())] = e.state().global_steps;
  });
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(errors[0].find("rank_0000"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("file size limit"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank_0000"), std::string::npos) << errors[1];
  EXPECT_FALSE(fs::exists(d.path / "next.partial"));  // the failed save's files are removed
  EXPECT_EQ(steps_after, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(file_bytes(d.path / "latest"), "good");
  EXPECT_FALSE(fs::exists(d.path / "next"));
  Segment load;
  load.load_dir = d.path;
  load.from = 1;
  load.to = 2;
  EXPECT_EQ(run_segment(s, load).global_steps, 2);
}

TEST(Checkpoint, Crc32cKnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string z(32, '\0');
  EXPECT_EQ(crc32c(z.data(), z.size()), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  // Incremental = whole.
  const std::string text = "The quick brown fox jumps over the lazy dog, twice over the lazy dog";
  EXPECT_EQ(crc32c(text.data() + 10, text.size() - 10, crc32c(text.data(), 10)), crc32c(text.data(), text.size()));
}

}  // namespace
}  // namespace dstrain
