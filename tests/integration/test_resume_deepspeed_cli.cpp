// A user resuming a DeepSpeed run gets exactly the DeepSpeed state (docs/checkpoints.md "Resuming a
// DeepSpeed checkpoint"), end to end through the built binary: dstrain trains a tiny GPT-2 for 3
// steps and saves its own checkpoint; deepspeed_checkpoint_fixture.py --from-dstrain reads that
// checkpoint by hand and writes the folder DeepSpeed would have saved for a Hugging Face GPT-2 at
// that state (HF names, Conv1D weights and their moments transposed to (in, out), wte without the
// padded vocabulary rows — V 257 is padded to 384 —, lm_head tied, global_steps 3, the Adam step,
// WarmupDecayLR's {"last_batch_iteration": 2}) at ZeRO stage S, dtype D, DP W; `dstrain train
// --resume-deepspeed` at another world size and stage runs 0 further steps (--steps 3 at global
// step 3) and saves. Its checkpoint must hold the original's masters, exp_avg and exp_avg_sq byte
// for byte, whole tensor by whole tensor (each rank file read and joined by the pieces' offsets),
// the same counters, schedule position and (fp16) loss scale, and --save-weights writes the same
// file. Zero steps keep the comparison free of the data position: a DeepSpeed resume starts the
// data from the beginning, dstrain's own resume continues it, so a step after either would differ.
// Two more cells: a Llama (GQA; HF's q_proj / k_proj / v_proj rows split from dstrain's qkv_proj,
// untied lm_head), and a folder converted by ds_to_universal.py (the fixture's --universal: only
// latest_universal and <tag>_universal/zero/<param>/*.pt), each resumed exactly the same way.
//
// Every check is meant to fail on a transpose left out, padding rows not zero, a moment not loaded,
// or the step / schedule not carried (each changes the saved state). Checked by hand: reading the
// Conv1D tensors untransposed (engine/checkpoint/deepspeed_resume.cpp) fails every c_attn / c_proj /
// c_fc master comparison.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_by_hand.h"
#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_checkpoint_by_hand;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::SavedState;
using dstrain::testing::shell_quote;

namespace {

const char* kModel = "gpt2:L2-C32-H2-V257-T32";
// Grouped-query attention (4 query heads, 2 key/value heads), SwiGLU, untied lm_head.
const char* kLlama = "llama:L2-C32-H4-KV2-I64-V257-T32";

std::string q(const fs::path& p) { return shell_quote(p.string()); }

// Debian's python with torch (/usr/bin/python3; the `python3` on PATH may have none).
std::string run_fixture(const std::string& args) {
  return dstrain::testing::run_shell_output("/usr/bin/python3 " DSTRAIN_SOURCE_DIR "/tests/integration/deepspeed_checkpoint_fixture.py " + args);
}

class ResumeDeepSpeedCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_resume_deepspeed_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    // The original runs: 3 steps on 1 rank at stage 0, one per dtype; a Llama in bf16; and fp16 with
    // step 2 skipped for an overflow (global_steps 3, skipped_steps 1, Adam's step 2).
    for (const std::string dtype : {"fp32", "bf16", "fp16", "llama_bf16", "fp16_skip"}) {
      const bool llama = dtype.starts_with("llama_"), skip = dtype.ends_with("_skip");
      const std::string precision = llama ? dtype.substr(6) : skip ? dtype.substr(0, 4) : dtype;
      const CliResult r = run_dstrain(train(precision, 0, 1, llama ? kLlama : kModel) + " --steps 3 --save-dir " + q(dir_ / ("orig_" + dtype)) +
                                      " --save-weights " + q(dir_ / ("orig_" + dtype + ".safetensors")) + (skip ? " --inject-overflow 2" : ""));
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // train_batch_size 8 at micro batch 2: GAS 4 on 1 rank, 2 on 2. AdamW with weight decay and a
  // warmup-then-decay schedule, as a Hugging Face run under DeepSpeed would have.
  static std::string config(const std::string& dtype, int stage) {
    const fs::path p = dir_ / ("c_" + dtype + "_s" + std::to_string(stage) + ".json");
    if (!fs::exists(p)) {
      std::string prec;
      if (dtype == "bf16") prec = R"("bf16": {"enabled": true},)";
      if (dtype == "fp16") prec = R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12},)";
      std::ofstream(p) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, )" << prec
                       << R"("zero_optimization": {"stage": )" << stage << R"(},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "total_num_steps": 10}}})";
    }
    return p.string();
  }
  static std::string train(const std::string& dtype, int stage, int ranks, const std::string& model = kModel) {
    return "train --deepspeed_config " + q(config(dtype, stage)) + " --model " + model + " --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --sample-tokens 0 --val-interval 0 --num-ranks " + std::to_string(ranks);
  }

  static fs::path dir_;
};
fs::path ResumeDeepSpeedCli::dir_;

struct Cell {
  std::string dtype;
  int ds_stage, ds_dp;          // the DeepSpeed folder's layout
  int resume_stage, resume_ranks;  // dstrain's, resuming it
  bool llama = false;           // the Llama run's state (HF q/k/v_proj split from dstrain's qkv_proj)
  bool universal = false;       // the folder converted by ds_to_universal.py (read through latest_universal)
};

TEST_F(ResumeDeepSpeedCli, ResumedStateIsTheSavedStateExactly) {
  const std::vector<Cell> cells = {
      {"fp32", 0, 1, 2, 2},  // torch.optim.AdamW's per-parameter state in the model states file
      {"fp32", 2, 2, 1, 2},  // ZeRO 2 partitions without padding, step an int
      {"bf16", 1, 2, 2, 2},  // BF16_Optimizer: bf16_ prefix, padding kept on the last rank
      {"bf16", 2, 4, 0, 1},  // DeepSpeedZeroOptimizer in bf16 on 4 ranks, resumed on one
      {"fp16", 1, 2, 0, 1},  // DeepSpeedZeroOptimizer in fp16: its DynamicLossScaler object carries the scale
      {"bf16", 3, 2, 1, 2},  // ZeRO-3: fp32_flat_groups, each parameter ceil(numel / W) per rank
      {"bf16", 2, 2, 1, 2, true},         // a Llama: q/k/v_proj (GQA: k, v half of q's rows) fused into qkv_proj
      {"fp16", 2, 2, 0, 1, false, true},  // ds_to_universal: zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, zero/optimizer_state.pt (fp16 loss scaler)
  };
  for (const Cell& c : cells) {
    const std::string name = std::string(c.llama ? "llama_" : "") + (c.universal ? "u_" : "") + c.dtype + "_s" + std::to_string(c.ds_stage) + "_dp" +
                             std::to_string(c.ds_dp);
    SCOPED_TRACE(name);
    const std::string orig_name = (c.llama ? "orig_llama_" : "orig_") + c.dtype;
    const fs::path orig = dir_ / orig_name, ds = dir_ / ("ds_" + name), res = dir_ / ("res_" + name);
    const std::string fx = run_fixture(q(ds) + " --from-dstrain " + q(orig) + " --stage " + std::to_string(c.ds_stage) + " --dtype " + c.dtype +
                                       " --dp " + std::to_string(c.ds_dp) + (c.universal ? " --universal" : ""));
    ASSERT_EQ(fx.find("exit status"), std::string::npos) << fx;
    if (c.universal) {
      ASSERT_TRUE(fs::exists(ds / "latest_universal") && !fs::exists(ds / "latest")) << "not the universal layout alone";
      ASSERT_TRUE(fs::is_directory(ds / "global_step3_universal" / "zero"));
    }
    // --steps 3 at global step 3: no step, the end-of-run save only.
    const CliResult r = run_dstrain(train(c.dtype, c.resume_stage, c.resume_ranks, c.llama ? kLlama : kModel) + " --steps 3 --resume-deepspeed " + q(ds) +
                                    " --save-dir " + q(res) + " --save-weights " + q(dir_ / ("res_" + name + ".safetensors")));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("resumed from DeepSpeed checkpoint"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("masters, exp_avg, exp_avg_sq, step 3, lr schedule at iteration 2"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;

    const SavedState a = read_checkpoint_by_hand(orig), b = read_checkpoint_by_hand(res);
    EXPECT_EQ(b.manifest["layout"]["zero_stage"], c.resume_stage);
    EXPECT_EQ(b.manifest["layout"]["world_size"], c.resume_ranks);
    dstrain::testing::expect_same_training_state(a, b, c.llama ? 17u : 28u, "after the DeepSpeed resume");
    EXPECT_EQ(a.manifest["engine"]["global_steps"], 3);
    EXPECT_EQ(a.manifest["lr_scheduler"]["last_batch_iteration"], 2);
    if (c.dtype == "fp16") {
      for (const char* key : {"kind", "cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"})
        EXPECT_EQ(b.manifest["loss_scaler"][key], a.manifest["loss_scaler"][key]) << key;
    }
    // The weights a user takes away: the same file.
    EXPECT_TRUE(read_file_text(dir_ / (orig_name + ".safetensors")) == read_file_text(dir_ / ("res_" + name + ".safetensors")))
        << "--save-weights differs";
  }
}

// Continuing: resuming the DeepSpeed folder and training k = 2 more steps gives the losses and the
// state that continuing dstrain's own equivalent checkpoint gives — the checkpoint of the same state
// a 0-step DeepSpeed resume saves (its data position is the DeepSpeed resume's, the beginning of
// --data, so both runs read the same windows). Bit for bit: the same state must train the same. Cells:
// fp16 with a step skipped for overflow (global_steps 3, skipped_steps 1, Adam's step 2, the loss
// scaler after a skip) and the Llama in bf16, each resumed at another stage and rank count.
TEST_F(ResumeDeepSpeedCli, ContinuingIsContinuingDstrainsOwnCheckpoint) {
  struct Continue {
    std::string orig, dtype, model;
    int ds_stage, ds_dp, resume_stage, resume_ranks;
  };
  for (const Continue& c : {Continue{"fp16_skip", "fp16", kModel, 1, 2, 2, 2}, Continue{"llama_bf16", "bf16", kLlama, 2, 2, 1, 2}}) {
    SCOPED_TRACE(c.orig);
    const fs::path ds = dir_ / ("cont_ds_" + c.orig), own = dir_ / ("cont_own_" + c.orig);
    const std::string fx = run_fixture(q(ds) + " --from-dstrain " + q(dir_ / ("orig_" + c.orig)) + " --stage " + std::to_string(c.ds_stage) +
                                       " --dtype " + c.dtype + " --dp " + std::to_string(c.ds_dp));
    ASSERT_EQ(fx.find("exit status"), std::string::npos) << fx;
    const std::string run = train(c.dtype, c.resume_stage, c.resume_ranks, c.model);
    // dstrain's own checkpoint of the DeepSpeed folder's state (no step: --steps 3 at global step 3).
    const CliResult zero = run_dstrain(run + " --steps 3 --resume-deepspeed " + q(ds) + " --save-dir " + q(own));
    ASSERT_EQ(zero.exit_code, 0) << zero.out << zero.err;
    const SavedState orig = read_checkpoint_by_hand(dir_ / ("orig_" + c.orig)), mine = read_checkpoint_by_hand(own);
    dstrain::testing::expect_same_training_state(orig, mine, c.model == kLlama ? 17u : 28u, "the 0-step resume");
    EXPECT_EQ(mine.manifest["engine"]["skipped_steps"], orig.manifest["engine"]["skipped_steps"]);
    EXPECT_EQ(mine.manifest["engine"]["skipped_steps"], c.orig == "fp16_skip" ? 1 : 0);
    const CliResult from_ds = run_dstrain(run + " --steps 5 --resume-deepspeed " + q(ds) + " --save-dir " + q(dir_ / ("cont_a_" + c.orig)));
    const CliResult from_own = run_dstrain(run + " --steps 5 --resume " + q(own) + " --save-dir " + q(dir_ / ("cont_b_" + c.orig)));
    ASSERT_EQ(from_ds.exit_code, 0) << from_ds.out << from_ds.err;
    ASSERT_EQ(from_own.exit_code, 0) << from_own.out << from_own.err;
    const auto losses = [](const std::string& out) {
      std::vector<std::string> v;
      for (std::size_t at = out.find("step "); at != std::string::npos; at = out.find("step ", at + 1)) {
        const std::size_t loss = out.find("| loss ", at), eol = out.find('\n', at);
        if (loss != std::string::npos && loss < eol) v.push_back(out.substr(at, eol - at).substr(0, out.find(" | ", loss + 7) - at));
      }
      return v;
    };
    const std::vector<std::string> a = losses(from_ds.out), b = losses(from_own.out);
    ASSERT_EQ(a.size(), 2u) << from_ds.out;
    EXPECT_EQ(a, b) << from_ds.out << "\n---\n" << from_own.out;
    EXPECT_NE(a[0].find("step 4/5 | loss "), std::string::npos) << a[0];
    const SavedState sa = read_checkpoint_by_hand(dir_ / ("cont_a_" + c.orig)), sb = read_checkpoint_by_hand(dir_ / ("cont_b_" + c.orig));
    dstrain::testing::expect_same_training_state(sa, sb, c.model == kLlama ? 17u : 28u, "after 2 more steps");
    EXPECT_EQ(sa.manifest["engine"]["global_steps"], 5);
    if (c.orig == "fp16_skip") {
      EXPECT_EQ(sa.manifest["engine"]["skipped_steps"], 1);
      for (const char* key : {"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"})
        EXPECT_EQ(sa.manifest["loss_scaler"][key], sb.manifest["loss_scaler"][key]) << key;
    }
  }
}

TEST_F(ResumeDeepSpeedCli, AnotherModelsCheckpointIsRefusedBeforeStep1) {
  const fs::path ds = dir_ / "ds_other";
  const std::string fx = run_fixture(q(ds) + " --from-dstrain " + q(dir_ / "orig_fp32") + " --stage 2 --dtype fp32 --dp 2");
  ASSERT_EQ(fx.find("exit status"), std::string::npos) << fx;
  // T 64: wpe is 64 x 32 here, 32 x 32 in the checkpoint.
  const CliResult r = run_dstrain(train("fp32", 1, 2, "gpt2:L2-C32-H2-V257-T64") + " --steps 3 --resume-deepspeed " + q(ds) + " --save-dir " +
                                  q(dir_ / "res_other"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("transformer.wpe.weight"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "res_other" / "global_step3"));
}

}  // namespace
