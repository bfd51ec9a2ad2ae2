// A user going back to DeepSpeed loses nothing (docs/checkpoints.md "Saving for DeepSpeed"), end to
// end through the built binary:
//   - `train --save-format deepspeed` puts DeepSpeed's files beside dstrain's in the tag folder
//     (for the run's ZeRO stage 2, 2 ranks, fp16: no file prefix, one optimizer file per rank);
//     a reader written from DeepSpeed's zero_to_fp32.py (tests/integration/zero_to_fp32_reader.py,
//     Python with torch, no DeepSpeed) consolidates that folder to exactly `dstrain consolidate`'s
//     fp32 weights;
//   - dstrain -> DeepSpeed layout -> dstrain is bit-identical: `--resume-deepspeed` of the folder
//     `--save-format` wrote, and of `dstrain export` at other stages, rank counts and dtypes, and of
//     the universal layout, at yet other dstrain layouts, runs no step (--steps 3 at step 3) and
//     saves masters, exp_avg, exp_avg_sq, counters and schedule equal byte for byte to the original's
//     (the fp16 loss scale too where both sides are fp16 with dynamic scaling); GPT-2 and Llama (GQA,
//     q/k/v blocks);
//   - what cannot work is an Error before anything is written: export into the checkpoint folder,
//     --save-format without --save-dir or with a decoupled writer, a universal export given a layout.
// Each comparison fails with the mapping broken (a transpose or a q/k/v cut left out changes masters
// and moments), with a moment or the step not written, or with the layout ignored (the file checks).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_by_hand.h"
#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_checkpoint_by_hand;
using dstrain::testing::run_dstrain;
using dstrain::testing::SavedState;
using dstrain::testing::shell_quote;

namespace {

const char* kGpt2 = "gpt2:L2-C32-H2-V257-T32";
const char* kLlama = "llama:L2-C32-H4-KV2-I48-V257-T32-tied";

std::string q(const fs::path& p) { return shell_quote(p.string()); }

// Debian's python with torch (/usr/bin/python3; the `python3` on PATH may have none).
std::string run_python(const std::string& args) { return dstrain::testing::run_shell_output("/usr/bin/python3 " + args); }

class ExportDeepSpeedCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_export_deepspeed_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    // The originals: 3 steps with DeepSpeed's files saved beside dstrain's.
    const CliResult g = run_dstrain(train("fp16", 2, 2, kGpt2) + " --steps 3 --save-dir " + q(dir_ / "gpt2") + " --save-format deepspeed");
    ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
    gpt2_out_ = g.out;
    const CliResult l = run_dstrain(train("bf16", 3, 2, kLlama) + " --steps 3 --save-dir " + q(dir_ / "llama") + " --save-format deepspeed");
    ASSERT_EQ(l.exit_code, 0) << l.out << l.err;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // train_batch_size 8 at micro batch 2; AdamW with weight decay and a warmup-then-decay schedule.
  static std::string config(const std::string& dtype, int stage, bool decoupled = false) {
    const fs::path p = dir_ / ("c_" + dtype + "_s" + std::to_string(stage) + (decoupled ? "_dec" : "") + ".json");
    if (!fs::exists(p)) {
      std::string prec;
      if (dtype == "bf16") prec = R"("bf16": {"enabled": true},)";
      if (dtype == "fp16") prec = R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12},)";
      if (decoupled) prec += R"("checkpoint": {"writer": {"type": "fast", "decoupled": true}},)";
      std::ofstream(p) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, )" << prec
                       << R"("zero_optimization": {"stage": )" << stage << R"(},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "total_num_steps": 10}}})";
    }
    return p.string();
  }
  static std::string train(const std::string& dtype, int stage, int ranks, const std::string& model, bool decoupled = false) {
    return "train --deepspeed_config " + q(config(dtype, stage, decoupled)) + " --model " + model + " --tokenizer bytes --data " +
           q(dir_ / "t_train.bin") + " --sample-tokens 0 --val-interval 0 --num-ranks " + std::to_string(ranks);
  }
  // `--resume-deepspeed src` at (dtype, stage, ranks), no step, saved to `res`: the same state as `orig`.
  static void expect_lossless(const fs::path& orig, const fs::path& src, const std::string& model, const std::string& dtype, int stage, int ranks,
                              const std::string& name) {
    const fs::path res = dir_ / ("res_" + name);
    const CliResult r = run_dstrain(train(dtype, stage, ranks, model) + " --steps 3 --resume-deepspeed " + q(src) + " --save-dir " + q(res));
    ASSERT_EQ(r.exit_code, 0) << name << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("masters, exp_avg, exp_avg_sq, step 3, lr schedule at iteration 2"), std::string::npos) << name << "\n" << r.out;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
    const SavedState a = read_checkpoint_by_hand(orig), b = read_checkpoint_by_hand(res);
    dstrain::testing::expect_same_training_state(a, b, model == kGpt2 ? 28u : 16u, name);
    EXPECT_EQ(a.manifest["engine"]["global_steps"], 3);
  }

  static fs::path dir_;
  static std::string gpt2_out_;
};
fs::path ExportDeepSpeedCli::dir_;
std::string ExportDeepSpeedCli::gpt2_out_;

TEST_F(ExportDeepSpeedCli, SaveFormatWritesDeepSpeedsFilesBesideDstrains) {
  EXPECT_NE(gpt2_out_.find("also saved in DeepSpeed's layout (ZeRO stage 2 on 2 ranks, fp16)"), std::string::npos) << gpt2_out_;
  const fs::path tag = dir_ / "gpt2" / "global_step3";
  for (const char* f : {"checkpoint.json", "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                        "zero_pp_rank_1_mp_rank_00_optim_states.pt"})
    EXPECT_TRUE(fs::is_regular_file(tag / f)) << f;
  EXPECT_FALSE(fs::exists(tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt"));
  // ZeRO-3, bf16: the bf16_ prefix, and each rank's model states.
  const fs::path ltag = dir_ / "llama" / "global_step3";
  for (const char* f : {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                        "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"})
    EXPECT_TRUE(fs::is_regular_file(ltag / f)) << f;
  // `--resume DIR` still reads dstrain's own files (with the data position), not DeepSpeed's.
  const CliResult r = run_dstrain(train("fp16", 2, 2, kGpt2) + " --steps 3 --resume " + q(dir_ / "gpt2") + " --save-dir " + q(dir_ / "gpt2_again"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("DeepSpeed checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
}

// A safetensors file's tensors (fp32) by name, read by hand: 8-byte header length, the JSON
// header, the data.
std::map<std::string, std::vector<float>> read_safetensors_fp32(const fs::path& p) {
  const std::string data = dstrain::testing::read_file_text(p);
  std::uint64_t hlen = 0;
  std::memcpy(&hlen, data.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(data.substr(8, hlen));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(e["dtype"], "F32") << name;
    const std::size_t lo = e["data_offsets"][0], hi = e["data_offsets"][1];
    std::vector<float> v((hi - lo) / 4);
    std::memcpy(v.data(), data.data() + 8 + hlen + lo, hi - lo);
    out[name] = std::move(v);
  }
  return out;
}

TEST_F(ExportDeepSpeedCli, ZeroToFp32OfTheFolderIsConsolidatesWeights) {
  const fs::path json = dir_ / "zero_to_fp32.json";
  const std::string out = run_python(std::string(DSTRAIN_SOURCE_DIR) + "/tests/integration/zero_to_fp32_reader.py " + q(json) + " " +
                                     q(dir_ / "gpt2") + " " + q(dir_ / "llama"));
  ASSERT_EQ(out.find("exit status"), std::string::npos) << out;
  const nlohmann::json got = nlohmann::json::parse(dstrain::testing::read_file_text(json));
  for (const char* run : {"gpt2", "llama"}) {
    SCOPED_TRACE(run);
    const fs::path st = dir_ / (std::string(run) + "_consolidated.safetensors");
    const CliResult c = run_dstrain("consolidate " + q(dir_ / run) + " -o " + q(st));
    ASSERT_EQ(c.exit_code, 0) << c.out << c.err;
    const nlohmann::json& z = got.at((dir_ / run).string());
    ASSERT_FALSE(z.contains("error")) << z.dump();
    const auto want = read_safetensors_fp32(st);
    ASSERT_GE(want.size(), 16u);
    for (const auto& [name, values] : want) {
      // GPT-2's model.safetensors names drop GPT2LMHeadModel's "transformer." prefix.
      const std::string key = z.contains(name) ? name : "transformer." + name;
      ASSERT_TRUE(z.contains(key)) << name << " is not in zero_to_fp32's output";
      EXPECT_TRUE(z.at(key).get<std::vector<float>>() == values) << name << " differs from consolidate's";
    }
    // The tied head comes back through shared_params, as the embedding.
    ASSERT_TRUE(z.contains("lm_head.weight"));
    EXPECT_EQ(z.at("lm_head.weight"), z.at(std::string(run) == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight"));
  }
}

// The optimizer's param groups as a Hugging Face Trainer makes them and dstrain's update decays
// them: the matrices with the config's weight_decay 0.1, the biases and norm weights with 0; their
// lr is the one the next step uses — WarmupDecayLR (warmup_max_lr 0.001, 2 warmup steps, 10 in all)
// at last_batch_iteration 2: 0.001 · (10 − 2) / (10 − 2) = 0.001.
TEST_F(ExportDeepSpeedCli, ParamGroupsAreTheTrainersDecayGroups) {
  const std::string script = R"(
import sys, torch
sys.path.insert(0, sys.argv[1])
import deepspeed_checkpoint_fixture
d = sys.argv[2] + '/global_step3/'
ms = torch.load(d + 'mp_rank_00_model_states.pt')
shapes = ms['param_shapes']
assert len(shapes) == 2, len(shapes)
assert all(len(s) == 2 for s in shapes[0].values()), shapes[0]
assert all(len(s) == 1 for s in shapes[1].values()), shapes[1]
assert ms['shared_params'] == {'lm_head.weight': 'transformer.wte.weight'}, ms['shared_params']
assert ms['module']['lm_head.weight'].data_ptr() == ms['module']['transformer.wte.weight'].data_ptr()
pgs = torch.load(d + 'zero_pp_rank_0_mp_rank_00_optim_states.pt')['optimizer_state_dict']['base_optimizer_state']['param_groups']
assert [g['weight_decay'] for g in pgs] == [0.1, 0.0], pgs
assert all(abs(g['lr'] - 0.001) < 1e-12 for g in pgs), [g['lr'] for g in pgs]
print('groups ok')
)";
  const fs::path py = dir_ / "groups_check.py";
  std::ofstream(py) << script;
  const std::string out = run_python(q(py) + " " + q(fs::path(DSTRAIN_SOURCE_DIR) / "tests" / "integration") + " " + q(dir_ / "gpt2"));
  EXPECT_NE(out.find("groups ok"), std::string::npos) << out;
}

TEST_F(ExportDeepSpeedCli, SaveFormatFolderResumesBitIdentical) {
  expect_lossless(dir_ / "gpt2", dir_ / "gpt2", kGpt2, "fp16", 3, 1, "gpt2_saveformat");
  const SavedState a = read_checkpoint_by_hand(dir_ / "gpt2"), b = read_checkpoint_by_hand(dir_ / "res_gpt2_saveformat");
  for (const char* key : {"kind", "cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"})
    EXPECT_EQ(b.manifest["loss_scaler"][key], a.manifest["loss_scaler"][key]) << key;
  expect_lossless(dir_ / "llama", dir_ / "llama", kLlama, "bf16", 1, 2, "llama_saveformat");
  // --save-format universal: ds_to_universal's layout in the tag folder, read the same way.
  const CliResult u = run_dstrain(train("fp16", 2, 2, kGpt2) + " --steps 3 --save-dir " + q(dir_ / "gpt2_uni") + " --save-format universal");
  ASSERT_EQ(u.exit_code, 0) << u.out << u.err;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "gpt2_uni" / "global_step3" / "zero" / "transformer.h.0.attn.c_attn.weight" / "exp_avg.pt"));
  expect_lossless(dir_ / "gpt2_uni", dir_ / "gpt2_uni", kGpt2, "fp16", 3, 1, "gpt2_universal_saveformat");
}

TEST_F(ExportDeepSpeedCli, ExportAtOtherLayoutsResumesBitIdentical) {
  struct Cell {
    std::string format, dtype;
    int stage, dp;
  };
  for (const Cell& c : std::vector<Cell>{{"deepspeed", "bf16", 1, 4}, {"deepspeed", "fp32", 0, 1}, {"deepspeed", "fp16", 3, 2}, {"universal", "", 0, 0}}) {
    const std::string name = c.format + "_" + c.dtype + "_s" + std::to_string(c.stage) + "_dp" + std::to_string(c.dp);
    SCOPED_TRACE(name);
    const fs::path out = dir_ / ("export_" + name);
    std::string cmd = "export " + q(dir_ / "gpt2") + " -o " + q(out) + " --format " + c.format;
    if (c.format == "deepspeed") cmd += " --zero-stage " + std::to_string(c.stage) + " --dp " + std::to_string(c.dp) + " --dtype " + c.dtype;
    const CliResult e = run_dstrain(cmd);
    ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
    if (c.format == "deepspeed") {
      const std::string prefix = c.dtype == "bf16" ? "bf16_" : "";
      if (c.stage > 0) {
        EXPECT_TRUE(fs::is_regular_file(out / "global_step3" / (prefix + "zero_pp_rank_" + std::to_string(c.dp - 1) + "_mp_rank_00_optim_states.pt")));
      }
      EXPECT_FALSE(fs::exists(out / "global_step3" / (prefix + "zero_pp_rank_" + std::to_string(c.dp) + "_mp_rank_00_optim_states.pt")));
    } else {
      EXPECT_TRUE(fs::is_regular_file(out / "latest_universal"));
      EXPECT_TRUE(fs::is_regular_file(out / "global_step3" / "zero" / "transformer.h.0.attn.c_attn.weight" / "fp32.pt"));
    }
    expect_lossless(dir_ / "gpt2", out, kGpt2, "fp16", 1, 2, name);
  }
}

// A folder dstrain wrote carries its run's data position and seed (the model states' "dstrain"
// client-state entry): two more steps from it are the two steps dstrain's own resume takes — the
// same checkpoint bit for bit at the saving layout and at another, and so the same losses.
TEST_F(ExportDeepSpeedCli, ContinuesAsDstrainsOwnResumeDoes) {
  struct Layout {
    int stage, ranks;
  };
  for (const Layout& l : {Layout{2, 2}, Layout{3, 1}}) {
    const std::string name = "s" + std::to_string(l.stage) + "_r" + std::to_string(l.ranks);
    SCOPED_TRACE(name);
    const CliResult own = run_dstrain(train("fp16", l.stage, l.ranks, kGpt2) + " --steps 5 --resume " + q(dir_ / "gpt2") + " --save-dir " +
                                      q(dir_ / ("own5_" + name)));
    ASSERT_EQ(own.exit_code, 0) << own.out << own.err;
    const CliResult ds = run_dstrain(train("fp16", l.stage, l.ranks, kGpt2) + " --steps 5 --resume-deepspeed " + q(dir_ / "gpt2") +
                                     " --save-dir " + q(dir_ / ("ds5_" + name)));
    ASSERT_EQ(ds.exit_code, 0) << ds.out << ds.err;
    EXPECT_NE((ds.out + ds.err).find("written by dstrain, it carries its run's data position"), std::string::npos) << ds.out << ds.err;
    EXPECT_NE(ds.out.find("step 5/5"), std::string::npos) << ds.out;
    const SavedState a = read_checkpoint_by_hand(dir_ / ("own5_" + name)), b = read_checkpoint_by_hand(dir_ / ("ds5_" + name));
    EXPECT_EQ(a.manifest["engine"]["global_steps"], 5);
    dstrain::testing::expect_same_training_state(a, b, 28u, "5 steps: own resume vs DeepSpeed resume");
    EXPECT_EQ(b.manifest["client_state"]["data"], a.manifest["client_state"]["data"]);
    EXPECT_EQ(b.manifest["engine"]["last_step_loss"], a.manifest["engine"]["last_step_loss"]);
    for (const char* key : {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"})
      EXPECT_EQ(b.manifest["loss_scaler"][key], a.manifest["loss_scaler"][key]) << key;
  }
}

// A mixture of experts (Mixtral's names, 4 experts of top-2) goes out as a DeepSpeed run of the
// Hugging Face model without expert parallelism saves it — each expert its own tensor, blocks of
// dstrain's stacked weights — and comes back bit for bit at another layout.
TEST_F(ExportDeepSpeedCli, MixtureOfExpertsRoundTrips) {
  const char* moe = "moe:L2-C32-H4-KV2-E4-K2-I16-V257-T32";
  const CliResult r = run_dstrain(train("fp32", 2, 2, moe) + " --steps 3 --save-dir " + q(dir_ / "moe") + " --save-format deepspeed");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const CliResult back =
      run_dstrain(train("fp32", 1, 1, moe) + " --steps 3 --resume-deepspeed " + q(dir_ / "moe") + " --save-dir " + q(dir_ / "moe_back"));
  ASSERT_EQ(back.exit_code, 0) << back.out << back.err;
  EXPECT_NE(back.out.find("masters, exp_avg, exp_avg_sq, step 3"), std::string::npos) << back.out;
  const SavedState a = read_checkpoint_by_hand(dir_ / "moe"), b = read_checkpoint_by_hand(dir_ / "moe_back");
  ASSERT_TRUE(a.whole.contains("master"));
  EXPECT_TRUE(a.whole.at("master").contains("model.layers.0.mlp.experts.gate_proj.weight"));
  dstrain::testing::expect_same_training_state(a, b, a.whole.at("master").size(), "mixture of experts through DeepSpeed's layout");
}

TEST_F(ExportDeepSpeedCli, WhatCannotWorkIsRefusedBeforeAnythingIsWritten) {
  const CliResult inside = run_dstrain("export " + q(dir_ / "gpt2") + " -o " + q(dir_ / "gpt2" / "ds"));
  EXPECT_EQ(inside.exit_code, 2) << inside.out << inside.err;
  EXPECT_NE(inside.err.find("lies inside the checkpoint folder"), std::string::npos) << inside.err;
  const CliResult same = run_dstrain("export " + q(dir_ / "gpt2") + " -o " + q(dir_ / "gpt2"));
  EXPECT_EQ(same.exit_code, 2) << same.out << same.err;
  EXPECT_NE(same.err.find("is or lies inside the checkpoint folder"), std::string::npos) << same.err;
  EXPECT_FALSE(fs::exists(dir_ / "gpt2" / "ds"));
  const CliResult missing = run_dstrain("export " + q(dir_ / "nothing_here") + " -o " + q(dir_ / "ds_missing"));
  EXPECT_EQ(missing.exit_code, 2) << missing.out << missing.err;
  EXPECT_NE(missing.err.find("nothing_here"), std::string::npos) << missing.err;
  const CliResult uni = run_dstrain("export " + q(dir_ / "gpt2") + " -o " + q(dir_ / "ds_uni") + " --format universal --zero-stage 2");
  EXPECT_NE(uni.exit_code, 0);
  EXPECT_NE(uni.err.find("--zero-stage"), std::string::npos) << uni.err;
  EXPECT_FALSE(fs::exists(dir_ / "ds_uni"));
  const CliResult no_dir = run_dstrain(train("fp16", 2, 1, kGpt2) + " --steps 1 --save-format deepspeed");
  EXPECT_EQ(no_dir.exit_code, 2) << no_dir.out << no_dir.err;
  EXPECT_NE(no_dir.err.find("--save-format deepspeed needs --save-dir"), std::string::npos) << no_dir.err;
  const CliResult dec =
      run_dstrain(train("fp16", 2, 1, kGpt2, true) + " --steps 1 --save-format deepspeed --save-dir " + q(dir_ / "dec"));
  EXPECT_EQ(dec.exit_code, 2) << dec.out << dec.err;
  EXPECT_NE(dec.err.find("checkpoint.writer.decoupled"), std::string::npos) << dec.err;
  EXPECT_EQ(dec.out.find("step 1/"), std::string::npos) << dec.out;
}


// Folders holding DeepSpeed files are never mixed with another save's: an export over a tag folder
// already there is refused (the new layout's rank files would sit beside the old ones under one
// `latest`), and a resume of a DeepSpeed folder that would save dstrain's checkpoints into it (taking
// over its `latest`) is refused before step 1, as is `--resume auto` on it, naming --resume-deepspeed.
TEST_F(ExportDeepSpeedCli, FoldersOfDeepSpeedFilesAreNeverMixed) {
  const fs::path out = dir_ / "ds_twice";
  const CliResult first = run_dstrain("export " + q(dir_ / "gpt2") + " -o " + q(out) + " --zero-stage 3 --dp 4");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const auto listing = [](const fs::path& d) {
    std::map<std::string, std::uintmax_t> files;
    for (const auto& e : fs::recursive_directory_iterator(d)) files[e.path().string()] = e.is_regular_file() ? e.file_size() : 0;
    return files;
  };
  const auto before = listing(out);
  const CliResult again = run_dstrain("export " + q(dir_ / "gpt2") + " -o " + q(out) + " --zero-stage 1 --dp 2");
  EXPECT_EQ(again.exit_code, 2) << again.out << again.err;
  EXPECT_NE(again.err.find((out / "global_step3").string() + " already exists"), std::string::npos) << again.err;
  EXPECT_EQ(listing(out), before);
  const std::string latest = dstrain::testing::read_file_text(out / "latest");
  const CliResult into = run_dstrain(train("fp16", 2, 2, kGpt2) + " --steps 4 --resume-deepspeed " + q(out) + " --save-dir " + q(out));
  EXPECT_EQ(into.exit_code, 2) << into.out << into.err;
  EXPECT_NE(into.err.find("the DeepSpeed checkpoint folder being resumed"), std::string::npos) << into.err;
  EXPECT_EQ(into.out.find("step 4/"), std::string::npos) << into.out;
  const CliResult autoresume = run_dstrain(train("fp16", 2, 2, kGpt2) + " --steps 4 --resume auto --save-dir " + q(out));
  EXPECT_EQ(autoresume.exit_code, 2) << autoresume.out << autoresume.err;
  EXPECT_NE(autoresume.err.find("continue it with --resume-deepspeed " + out.string()), std::string::npos) << autoresume.err;
  EXPECT_EQ(dstrain::testing::read_file_text(out / "latest"), latest);
  EXPECT_EQ(listing(out), before);
}

}  // namespace
