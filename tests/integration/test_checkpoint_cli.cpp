// Training checkpoints through `dstrain train` as a job script uses them (docs/checkpoints.md):
// a run stopped and resumed in a new process ends where the uninterrupted run does, with the same
// losses; resumed at another world size and stage; SIGTERM / SIGINT finish the step, save and exit
// 75; kill -9 at many points of a save always leaves `latest` naming a loadable checkpoint; every
// mistake (no such folder or tag, another model, --save-dir a file) exits 2 before step 1.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

class CheckpointCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_checkpoint_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    // bf16 with stochastic rounding, ZeRO 2, GAS 2, a warmup schedule: everything a resume restores.
    std::ofstream(dir_ / "bf16.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12}}})";
    std::ofstream(dir_ / "fp32_s1.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
    std::ofstream(dir_ / "fp32_s3.json") << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static std::string train(const std::string& config, int ranks, const std::string& model = "gpt2:L2-C32-H2-V256-T32") {
    return "train --deepspeed_config " + q(dir_ / config) + " --model " + model + " --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --sample-tokens 0 --val-interval 0 --num-ranks " + std::to_string(ranks);
  }
  static std::vector<double> losses(const fs::path& summary) {
    return nlohmann::json::parse(read_file_text(summary))["train_losses"].get<std::vector<double>>();
  }
  // Starts `args` in the background, waits until it has printed its first step (at most 120 s: a
  // loaded machine may be slow to start), sends `signal` `seconds` later, waits; returns the exit
  // status (128 + n for a process killed by signal n) and leaves its output in dir_/bg.txt.
  static int run_and_signal(const std::string& args, const std::string& signal, double seconds, const std::string& env = "") {
    const fs::path out = dir_ / "bg.txt", code = dir_ / "bg.code";
    const std::string cmd = "(" + env + " " + std::string(DSTRAIN_BINARY_DIR) + "/dstrain " + args + " >" + q(out) + " 2>&1 </dev/null & p=$!; " +
                            "n=0; while ! grep -q '^step [0-9]*/' " + q(out) +
                            " && [ $n -lt 1200 ] && kill -0 $p 2>/dev/null; do sleep 0.1; n=$((n+1)); done; sleep " + std::to_string(seconds) +
                            "; kill -" + signal + " $p; wait $p; echo $? >" + q(code) + ")";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return std::stoi(read_file_text(code));
  }

  static fs::path dir_;
};
fs::path CheckpointCli::dir_;

TEST_F(CheckpointCli, ResumedRunEndsWhereTheUninterruptedOneDoes) {
  const fs::path ck = dir_ / "ck_resume";
  const std::string sr = " --bf16-stochastic-rounding";
  const CliResult whole = run_dstrain(train("bf16.json", 2) + sr + " --steps 6 --summary-json " + q(dir_ / "whole.json"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const CliResult first = run_dstrain(train("bf16.json", 2) + sr + " --steps 3 --save-dir " + q(ck));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(read_file_text(ck / "latest"), "global_step3");
  // The same command with --resume and --steps 6: steps 4-6, the same losses bit for bit.
  const CliResult second =
      run_dstrain(train("bf16.json", 2) + sr + " --steps 6 --save-dir " + q(ck) + " --resume --summary-json " + q(dir_ / "res.json"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("resumed from checkpoint"), std::string::npos) << second.out;
  EXPECT_EQ(second.out.find("step 1/6 |"), std::string::npos) << second.out;
  const std::vector<double> a = losses(dir_ / "whole.json"), b = losses(dir_ / "res.json");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(read_file_text(ck / "latest"), "global_step6");
  // --save-interval 1 --keep-last 2: only the newest two remain.
  const fs::path kl = dir_ / "ck_keep";
  ASSERT_EQ(run_dstrain(train("bf16.json", 1) + " --steps 5 --save-interval 1 --keep-last 2 --save-dir " + q(kl)).exit_code, 0);
  std::vector<std::string> tags;
  for (const auto& e : fs::directory_iterator(kl))
    if (e.is_directory()) tags.push_back(e.path().filename().string());
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(tags, (std::vector<std::string>{"global_step4", "global_step5"}));
}

TEST_F(CheckpointCli, ResumesAtAnotherWorldSizeAndStage) {
  const fs::path ck = dir_ / "ck_reshard";
  const CliResult whole = run_dstrain(train("fp32_s1.json", 2) + " --steps 6 --summary-json " + q(dir_ / "w1.json"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(run_dstrain(train("fp32_s1.json", 2) + " --steps 3 --save-dir " + q(ck)).exit_code, 0);
  // Saved at stage 1 on 2 ranks, resumed at stage 3 on 4 ranks and at stage 1 on 1 rank: the
  // global batch is the same data; only the reduction order differs (fp32).
  for (const auto& [config, ranks] : std::vector<std::pair<std::string, int>>{{"fp32_s3.json", 4}, {"fp32_s1.json", 1}}) {
    const fs::path sum = dir_ / fmt::format("r{}.json", ranks);
    const CliResult r = run_dstrain(train(config, ranks) + " --steps 6 --resume " + q(ck) + " --summary-json " + q(sum));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<double> a = losses(dir_ / "w1.json"), b = losses(sum);
    ASSERT_EQ(b.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(b[i], a[3 + i], 1e-5 * a[3 + i]) << config << " step " << 4 + i;
  }
}

// A relaunch at another world size is the same run (docs/elastic.md): the same global batch, so the
// same samples at the same steps. With DeepSpeed's elasticity section (version 0.1: train_batch_size
// 8 on 1, 2 or 4 data-parallel ranks, micro-batch 2, GAS 4 / 2 / 1), 3 steps on 4 ranks then 3 on 2
// read exactly the windows 6 uninterrupted steps on 2 ranks read, step by step (--log-samples), and
// the losses agree within the reduction order's tolerance. The uninterrupted run reads no window
// twice, so a resume that lost the data position (read from the start again) would fail the
// comparison; and a world size elasticity does not allow is refused before step 1, naming the
// sizes that are.
TEST_F(CheckpointCli, RelaunchAtAnotherWorldSizeContinuesTheDataOrder) {
  std::ofstream(dir_ / "elastic.json") << R"({"steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "elasticity": {"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [1, 2], "min_gpus": 1, "max_gpus": 4, "version": 0.1}})";
  const fs::path ck = dir_ / "ck_elastic";
  const auto samples = [](const fs::path& log) {
    std::vector<std::tuple<long, long, long>> out;  // (step, epoch, window)
    std::istringstream in(read_file_text(log));
    std::string step, epoch, window, rank;
    long s = 0, e = 0, w = 0, r = 0;
    while (in >> step >> s >> epoch >> e >> window >> w >> rank >> r) out.emplace_back(s, e, w);
    std::sort(out.begin(), out.end());
    return out;
  };
  const CliResult whole = run_dstrain(train("elastic.json", 2) + " --steps 6 --summary-json " + q(dir_ / "el_whole.json") + " --log-samples " +
                                      q(dir_ / "el_whole.log"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const CliResult first = run_dstrain(train("elastic.json", 4) + " --steps 3 --save-dir " + q(ck) + " --log-samples " + q(dir_ / "el_relaunch.log"));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // The relaunch appends to the same log: the samples of the whole sequence of world sizes.
  const CliResult second = run_dstrain(train("elastic.json", 2) + " --steps 6 --save-dir " + q(ck) + " --resume auto --summary-json " +
                                       q(dir_ / "el_res.json") + " --log-samples " + q(dir_ / "el_relaunch.log"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("resumed from checkpoint"), std::string::npos) << second.out;
  const auto a = samples(dir_ / "el_whole.log"), b = samples(dir_ / "el_relaunch.log");
  ASSERT_EQ(a.size(), 6u * 8u);  // 6 steps of train_batch_size 8
  EXPECT_EQ(a, b) << "the relaunched run read other samples than the uninterrupted one";
  std::set<std::pair<long, long>> distinct;
  for (const auto& [s, e, w] : a) distinct.emplace(e, w);
  EXPECT_EQ(distinct.size(), a.size()) << "the uninterrupted run reads a window twice: a lost data position would go unnoticed";
  const std::vector<double> la = losses(dir_ / "el_whole.json"), lb = losses(dir_ / "el_res.json");
  ASSERT_EQ(lb.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(lb[i], la[3 + i], 1e-5 * la[3 + i]) << "step " << 4 + i;
  // 3 ranks: elasticity's sizes for this section are 1, 2 and 4; refused before step 1.
  const CliResult three = run_dstrain(train("elastic.json", 3) + " --steps 6 --save-dir " + q(ck) + " --resume auto");
  EXPECT_EQ(three.exit_code, 2) << three.err;
  EXPECT_NE(three.err.find("World size (3) is not valid with the current list of valid GPU counts: [1, 2, 4]"), std::string::npos) << three.err;
  EXPECT_EQ(three.out.find("step 4/"), std::string::npos) << three.out;
}

// A resume keeps the global batch, or is refused before step 1 naming the saved and the new one
// and what keeps it (docs/elastic.md "Checks before step 1"): a config of micro-batch and GAS alone
// (whose train_batch_size follows the world size), a changed train_batch_size, and elasticity
// version 0.2 (which picks another batch for a world size outside its list) — while a config that
// fixes train_batch_size takes the GAS that keeps it (ResumesAtAnotherWorldSizeAndStage).
TEST_F(CheckpointCli, ResumeAtAnotherWorldSizeKeepsTheGlobalBatchOrIsRefused) {
  std::ofstream(dir_ / "gas2.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
      "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  std::ofstream(dir_ / "gas1.json") << R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
      "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  std::ofstream(dir_ / "tbs16.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  std::ofstream(dir_ / "elastic02.json") << R"({"steps_per_print": 1, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "elasticity": {"enabled": true, "max_train_batch_size": 16, "micro_batch_sizes": [2], "min_gpus": 1, "max_gpus": 4, "version": 0.2}})";
  const fs::path ck = dir_ / "ck_batch";  // micro-batch 2 x GAS 2 x 2 ranks: train_batch_size 8
  ASSERT_EQ(run_dstrain(train("gas2.json", 2) + " --steps 2 --save-dir " + q(ck)).exit_code, 0);
  const auto expect_refused = [&](const std::string& args, const std::vector<std::string>& needles) {
    const CliResult r = run_dstrain(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << n << "\n" << r.err;
    EXPECT_EQ(r.out.find("step 3/"), std::string::npos) << r.out;
  };
  // 4 ranks at GAS 2 would train on 16 sequences a step, 1 rank on 4.
  expect_refused(train("gas2.json", 4) + " --steps 4 --resume " + q(ck),
                 {"global batch of 8 sequences (train_batch_size 8 = micro-batch 2 x gradient_accumulation_steps 2 x 2 data-parallel ranks, "
                  "world size 2)",
                  "this run's is 16", "relaunch on 2 ranks", "\"gradient_accumulation_steps\": 1", "\"train_batch_size\": 8"});
  expect_refused(train("gas2.json", 1) + " --steps 4 --resume " + q(ck), {"this run's is 4", "\"gradient_accumulation_steps\": 4"});
  // A changed train_batch_size.
  expect_refused(train("tbs16.json", 2) + " --steps 4 --resume " + q(ck), {"the config's train_batch_size is 16", "\"train_batch_size\": 8 again"});
  // What the message proposes resumes: GAS 1 on 4 ranks is the same global batch.
  const CliResult ok = run_dstrain(train("gas1.json", 4) + " --steps 4 --resume " + q(ck));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  // Elasticity 0.2: train_batch_size 12 on 1, 2 or 3 ranks; on 4 it picks 16.
  const fs::path ek = dir_ / "ck_elastic02";
  ASSERT_EQ(run_dstrain(train("elastic02.json", 2) + " --steps 1 --save-dir " + q(ek)).exit_code, 0);
  expect_refused(train("elastic02.json", 4) + " --steps 2 --resume " + q(ek),
                 {"global batch of 12 sequences", "elasticity section gives 16", "world sizes elasticity gives train_batch_size 12 at: 1, 2, 3"});
  const CliResult three = run_dstrain(train("elastic02.json", 3) + " --steps 2 --resume " + q(ek));
  EXPECT_EQ(three.exit_code, 0) << three.err;
}

// ZeRO++ and MiCS keep checkpoints in parameter space (docs/zero.md §10): a run with qwZ, hpZ, qgZ
// and MiCS (4 ranks as 2 nodes, shard groups of 2 replicated twice, GAS 2) resumes bit for bit, and
// its checkpoint resumes in plain ZeRO-3 on 2 ranks (each rank of a replica pair saved the same
// partition; the reader takes each element once).
TEST_F(CheckpointCli, ZeroPlusPlusAndMicsResumeBitForBitAndInPlainZero3) {
  std::ofstream(dir_ / "zeropp.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "mics_shard_size": 2, "zero_quantized_weights": true,
        "zero_hpz_partition_size": 2, "zero_quantized_gradients": true}})";
  std::ofstream(dir_ / "bf16_s3.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1,
      "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 3}})";
  const fs::path ck = dir_ / "ck_zeropp";
  const std::string nodes = " --ranks-per-node 2";
  const CliResult whole = run_dstrain(train("zeropp.json", 4) + nodes + " --steps 4 --summary-json " + q(dir_ / "zp_whole.json"));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(run_dstrain(train("zeropp.json", 4) + nodes + " --steps 2 --save-dir " + q(ck)).exit_code, 0);
  const CliResult resumed = run_dstrain(train("zeropp.json", 4) + nodes + " --steps 4 --resume " + q(ck) + " --summary-json " + q(dir_ / "zp_res.json"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const std::vector<double> a = losses(dir_ / "zp_whole.json"), b = losses(dir_ / "zp_res.json");
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], a[2]);
  EXPECT_EQ(b[1], a[3]);
  // In plain ZeRO-3 on 2 ranks: the same global batch, without the quantization — close, not equal.
  const CliResult plain = run_dstrain(train("bf16_s3.json", 2) + " --steps 4 --resume " + q(ck) + " --summary-json " + q(dir_ / "zp_plain.json"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<double> c = losses(dir_ / "zp_plain.json");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_NEAR(c[0], a[2], 0.05 * a[2]);
}

TEST_F(CheckpointCli, SigtermFinishesTheStepSavesAndExits75) {
  for (const std::string sig : {"TERM", "INT"}) {
    const fs::path ck = dir_ / ("ck_sig" + sig);
    const int code = run_and_signal(train("bf16.json", 2) + " --steps 100000 --save-dir " + q(ck), sig, 0.5);
    const std::string out = read_file_text(dir_ / "bg.txt");
    ASSERT_EQ(code, 75) << out;
    EXPECT_NE(out.find("stopped by signal"), std::string::npos) << out;
    const std::string tag = read_file_text(ck / "latest");
    ASSERT_TRUE(fs::exists(ck / tag / "checkpoint.json")) << tag;
    const long steps = std::stol(tag.substr(std::string("global_step").size()));
    EXPECT_GT(steps, 0);
    // Rerun with --resume auto: it continues from there and ends at --steps.
    const CliResult r = run_dstrain(train("bf16.json", 2) + " --steps " + std::to_string(steps + 2) + " --save-dir " + q(ck) + " --resume auto");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("at step " + std::to_string(steps)), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("step " + std::to_string(steps + 2) + "/" + std::to_string(steps + 2) + " | checkpoint"), std::string::npos) << r.out;
  }
}

// kill -9 at many moments: a save pauses before each file and rename (the test hook), so the kills
// land between any two of its writes. After each, `latest` (when there is one) names a complete
// checkpoint that a new run resumes from.
TEST_F(CheckpointCli, KillDuringSaveLeavesPreviousCheckpointLoadable) {
  const fs::path ck = dir_ / "ck_kill";
  int resumed = 0;
  for (int i = 0; i < 10; ++i) {
    const double at = 0.05 + 0.09 * i;  // after the first step: saves every step, each pausing before its files
    const int code = run_and_signal(train("bf16.json", 2) + " --steps 100000 --save-interval 1 --keep-last 2 --save-dir " + q(ck) + " --resume auto",
                                    "KILL", at, "DSTRAIN_TEST_CHECKPOINT_PAUSE_MS=40");
    EXPECT_EQ(code, 128 + 9) << read_file_text(dir_ / "bg.txt");
    if (!fs::exists(ck / "latest")) continue;
    const std::string tag = read_file_text(ck / "latest");
    ASSERT_TRUE(fs::exists(ck / tag / "checkpoint.json")) << "kill at " << at << "s: latest names " << tag;
    const long steps = std::stol(tag.substr(std::string("global_step").size()));
    const CliResult r = run_dstrain(train("bf16.json", 2) + " --steps " + std::to_string(steps + 1) + " --resume " + q(ck));
    ASSERT_EQ(r.exit_code, 0) << "kill at " << at << "s, tag " << tag << ": " << r.err;
    ++resumed;
  }
  EXPECT_GE(resumed, 3);
}

// dstrain consolidate: the checkpoint's weights in one Hugging Face file, byte for byte what
// --save-weights of the same run wrote; bf16 too, and loadable by --init-from.
TEST_F(CheckpointCli, ConsolidateEqualsSaveWeights) {
  const fs::path ck = dir_ / "ck_cons";
  const CliResult r = run_dstrain(train("bf16.json", 2) + " --steps 2 --save-dir " + q(ck) + " --save-weights " + q(dir_ / "w.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CliResult c = run_dstrain("consolidate " + q(ck) + " -o " + q(dir_ / "c.safetensors"));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(read_file_text(dir_ / "c.safetensors"), read_file_text(dir_ / "w.safetensors"));
  const CliResult b = run_dstrain("consolidate " + q(ck) + " --tag global_step2 --dtype bf16 -o " + q(dir_ / "c16.safetensors"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_LT(fs::file_size(dir_ / "c16.safetensors"), fs::file_size(dir_ / "c.safetensors") * 6 / 10);
  const CliResult e = run_dstrain(train("fp32_s1.json", 1) + " --steps 0 --init-from " + q(dir_ / "c16.safetensors"));
  EXPECT_EQ(e.exit_code, 0) << e.err;
  const CliResult bad = run_dstrain("consolidate " + q(ck) + " --tag nope -o " + q(dir_ / "x.safetensors"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("not found"), std::string::npos) << bad.err;
}

// --init-from a torch.save state dict written by PyTorch itself (/usr/bin/python3): DeepSpeed's
// mp_rank_00_model_states.pt shape ({"module": HF GPT-2 state dict with its mask buffers and
// lm_head, beside scalars}) loads the same weights as a safetensors file of the same values.
TEST_F(CheckpointCli, InitFromTorchSaveEqualsSafetensors) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) GTEST_SKIP() << "/usr/bin/python3 with torch is not installed";
  std::ofstream(dir_ / "gpt2_pt.py") << R"PY(
import collections, json, os, struct, sys, torch
out = sys.argv[1]
C, V, T, L = 32, 256, 32, 2
g = torch.Generator().manual_seed(5)
def r(*shape): return torch.randn(*shape, generator=g) * 0.05
sd = collections.OrderedDict()
sd['transformer.wte.weight'] = r(V, C)
sd['transformer.wpe.weight'] = r(T, C)
for i in range(L):
    p = 'transformer.h.%d.' % i
    sd[p + 'ln_1.weight'] = 1 + r(C); sd[p + 'ln_1.bias'] = r(C)
    sd[p + 'attn.bias'] = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)
    sd[p + 'attn.c_attn.weight'] = r(C, 3 * C); sd[p + 'attn.c_attn.bias'] = r(3 * C)
    sd[p + 'attn.c_proj.weight'] = r(C, C); sd[p + 'attn.c_proj.bias'] = r(C)
    sd[p + 'ln_2.weight'] = 1 + r(C); sd[p + 'ln_2.bias'] = r(C)
    sd[p + 'mlp.c_fc.weight'] = r(C, 4 * C); sd[p + 'mlp.c_fc.bias'] = r(4 * C)
    sd[p + 'mlp.c_proj.weight'] = r(4 * C, C); sd[p + 'mlp.c_proj.bias'] = r(C)
sd['transformer.ln_f.weight'] = 1 + r(C); sd['transformer.ln_f.bias'] = r(C)
sd['lm_head.weight'] = sd['transformer.wte.weight']
torch.save({'module': sd, 'global_steps': 3, 'ds_version': '0.14', 'param_shapes': [collections.OrderedDict(a=torch.Size([2]))]},
           os.path.join(out, 'mp_rank_00_model_states.pt'))
# The same values as safetensors, written by hand (float32, little-endian).
header, blobs, at = {}, [], 0
for k, v in sd.items():
    if k.endswith('.attn.bias') or k == 'lm_head.weight': continue
    b = v.contiguous().numpy().astype('<f4').tobytes()
    header[k] = {'dtype': 'F32', 'shape': list(v.shape), 'data_offsets': [at, at + len(b)]}
    blobs.append(b); at += len(b)
h = json.dumps(header).encode()
h += b' ' * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, 'same.safetensors'), 'wb') as f:
    f.write(struct.pack('<Q', len(h))); f.write(h); [f.write(b) for b in blobs]
)PY";
  ASSERT_EQ(std::system(("/usr/bin/python3 " + q(dir_ / "gpt2_pt.py") + " " + q(dir_)).c_str()), 0);
  for (const std::string from : {"mp_rank_00_model_states.pt", "same.safetensors"}) {
    const CliResult r =
        run_dstrain(train("fp32_s1.json", 1) + " --steps 0 --init-from " + q(dir_ / from) + " --save-weights " + q(dir_ / (from + ".out")));
    ASSERT_EQ(r.exit_code, 0) << from << ": " << r.err;
  }
  EXPECT_EQ(read_file_text(dir_ / "mp_rank_00_model_states.pt.out"), read_file_text(dir_ / "same.safetensors.out"));
}

TEST_F(CheckpointCli, MistakesExit2BeforeStep1) {
  const fs::path ck = dir_ / "ck_errors";
  ASSERT_EQ(run_dstrain(train("fp32_s1.json", 1) + " --steps 1 --save-dir " + q(ck)).exit_code, 0);
  const auto expect_refused = [&](const std::string& args, const std::string& needle) {
    const CliResult r = run_dstrain(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
  };
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(dir_ / "nope"), "--resume");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck) + " --load-tag global_step9", "global_step9");
  expect_refused(train("fp32_s1.json", 1, "gpt2:L3-C32-H2-V256-T32") + " --steps 2 --resume " + q(ck), "another model");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --save-interval 1", "--save-dir");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --save-dir " + q(dir_ / "t_train.bin"), "--save-dir");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume auto", "--save-dir");
  // A corrupt data file is found when the ranks load, before step 1 too.
  const fs::path data = ck / "global_step1" / "rank_00000.safetensors";
  std::string bytes = read_file_text(data);
  bytes[bytes.size() - 1] ^= 0x01;
  std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck), "checksum");
}

// --resume of a folder that holds no checkpoint says so (it listed "the checkpoints there: " with
// nothing after it).
TEST_F(CheckpointCli, ResumeOfAFolderWithoutCheckpointsSaysSo) {
  const fs::path empty = dir_ / "ck_none";
  fs::create_directories(empty);
  const CliResult r = run_dstrain(train("fp32_s1.json", 1) + " --steps 1 --resume " + q(empty));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("it holds no checkpoint (no 'latest' file, no checkpoint folder)"), std::string::npos) << r.err;
}

// Hardening 3 §5: a resume under another model is refused naming the keys that differ, even when
// every parameter keeps its shape (n_head 2 -> 4); an explicit --seed or a changed --sequence-length
// is said, in a warning that names both values and what happens. Before, all three resumed with
// exit 0 and no word.
TEST_F(CheckpointCli, ResumeComparesTheModelAndSaysWhatChanges) {
  const fs::path ck = dir_ / "ck_changes";
  ASSERT_EQ(run_dstrain(train("fp32_s1.json", 1) + " --steps 1 --save-dir " + q(ck)).exit_code, 0);
  const CliResult heads = run_dstrain(train("fp32_s1.json", 1, "gpt2:L2-C32-H4-V256-T32") + " --steps 2 --resume " + q(ck));
  EXPECT_EQ(heads.exit_code, 2) << heads.err;
  EXPECT_NE(heads.err.find("n_head 2 in the checkpoint, 4 here"), std::string::npos) << heads.err;
  EXPECT_EQ(heads.out.find("step 2/"), std::string::npos) << heads.out;

  const CliResult seed = run_dstrain(train("fp32_s1.json", 1) + " --steps 2 --seed 7 --resume " + q(ck));
  EXPECT_EQ(seed.exit_code, 0) << seed.err;
  EXPECT_NE(seed.err.find("warning: --seed 7 is not used for training"), std::string::npos) << seed.err;
  EXPECT_NE(seed.err.find("saved with seed 42"), std::string::npos) << seed.err;
  const CliResult same = run_dstrain(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck));
  EXPECT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.err.find("--seed"), std::string::npos) << same.err;
  EXPECT_EQ(same.err.find("--sequence-length"), std::string::npos) << same.err;
  // A run saved with --seed 7 resumed without --seed: the default 42 was not asked for, no warning.
  const fs::path ck7 = dir_ / "ck_seed7";
  ASSERT_EQ(run_dstrain(train("fp32_s1.json", 1) + " --steps 1 --seed 7 --save-dir " + q(ck7)).exit_code, 0);
  const CliResult unasked = run_dstrain(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck7));
  EXPECT_EQ(unasked.exit_code, 0) << unasked.err;
  EXPECT_EQ(unasked.err.find("--seed"), std::string::npos) << unasked.err;

  const CliResult length = run_dstrain(train("fp32_s1.json", 1) + " --steps 2 --sequence-length 16 --resume " + q(ck));
  EXPECT_EQ(length.exit_code, 0) << length.err;
  EXPECT_NE(length.err.find("warning: --sequence-length 16 differs from the 32 checkpoint"), std::string::npos) << length.err;
  EXPECT_NE(length.err.find("the data does not continue"), std::string::npos) << length.err;
}

// An output never destroys an input (docs/cli.md "Checked before step 1"): consolidate's output and
// train's --save-weights / --summary-json inside the checkpoint folder being read, or inside the
// --save-dir the run commits into, are refused before anything is written; so is an output that
// is a FIFO, a device or a symbolic link, which the write's rename would replace. Every file keeps
// its bytes, and the checkpoint still resumes.
TEST_F(CheckpointCli, OutputsNeverReplaceTheCheckpointRead) {
  const fs::path ck = dir_ / "ck_outputs";
  ASSERT_EQ(run_dstrain(train("fp32_s1.json", 1) + " --steps 1 --save-dir " + q(ck)).exit_code, 0);
  const fs::path rank_file = ck / "global_step1" / "rank_00000.safetensors", latest = ck / "latest";
  const std::string rank_bytes = read_file_text(rank_file), latest_bytes = read_file_text(latest);
  const auto expect_refused = [&](const std::string& args, const std::string& needle) {
    const CliResult r = run_dstrain(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.out.find("step 1/"), std::string::npos) << r.out;
  };
  expect_refused("consolidate " + q(ck) + " -o " + q(rank_file), "lies inside the checkpoint folder");
  expect_refused("consolidate " + q(ck) + " -o " + q(latest), "lies inside the checkpoint folder");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck) + " --save-weights " + q(latest), "lies inside the checkpoints resumed");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck) + " --summary-json " + q(rank_file), "--resume");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --save-dir " + q(dir_ / "ck_other") + " --summary-json " + q(dir_ / "ck_other" / "latest"),
                 "lies inside --save-dir");
  // --log-samples is an output like the others: never an input, nor inside the checkpoints read.
  const std::string data_bytes = read_file_text(dir_ / "t_train.bin");
  expect_refused(train("fp32_s1.json", 1) + " --steps 1 --log-samples " + q(dir_ / "t_train.bin"), "is the file given as --data");
  expect_refused(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck) + " --log-samples " + q(latest), "--resume");
  EXPECT_EQ(read_file_text(dir_ / "t_train.bin"), data_bytes);
  EXPECT_EQ(read_file_text(rank_file), rank_bytes);
  EXPECT_EQ(read_file_text(latest), latest_bytes);
  // Not a regular file: a FIFO, a link to a file, a character device (never written: refused
  // before step 1 by its kind).
  const fs::path fifo = dir_ / "out.fifo", link = dir_ / "out.link", target = dir_ / "link_target.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(target) << "keep";
  fs::create_symlink(target, link);
  expect_refused(train("fp32_s1.json", 1) + " --steps 1 --summary-json " + q(fifo), "is a FIFO");
  expect_refused(train("fp32_s1.json", 1) + " --steps 1 --save-weights " + q(link), "is a symbolic link");
  expect_refused("consolidate " + q(ck) + " -o /dev/null", "is a character device");
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_file_text(target), "keep");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // The checkpoint resumes as it was, and the same outputs outside the folders are written.
  const CliResult ok = run_dstrain(train("fp32_s1.json", 1) + " --steps 2 --resume " + q(ck) + " --save-weights " + q(dir_ / "out.safetensors"));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(run_dstrain("consolidate " + q(ck) + " -o " + q(dir_ / "cons.safetensors")).exit_code, 0);
  fs::remove(fifo);
  fs::remove(link);
}

// A `latest` that is no tag — here a link to a big text file, as a link to /etc/passwd would be — was
// echoed whole into the error ("checkpoint tag '<the whole file>' ..."); now a short, escaped
// prefix, the file named, and nothing read past a tag's size.
TEST(CheckpointLatest, ALatestThatIsNoTagIsQuotedShort) {
  const fs::path dir = dstrain::testing::fresh_suite_dir("dstrain_test_checkpoint_latest");
  fs::create_directories(dir / "ck");
  std::string passwd;
  for (int i = 0; i < 2000; ++i) passwd += fmt::format("user{}:x:{}:{}::/home/user{}:/bin/sh\n", i, i, i, i);
  std::ofstream(dir / "passwd") << passwd;
  fs::create_symlink(dir / "passwd", dir / "ck" / "latest");
  const CliResult r = run_dstrain("consolidate " + shell_quote((dir / "ck").string()) + " -o " + shell_quote((dir / "w.safetensors").string()));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("ck/latest' holds more than 4096 bytes, starting \"user0:x:0:0::/home/user0:/bin/sh\\nuser1:x"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--load-tag"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 1000u) << r.err;
  // A short one that is still no tag (two lines): quoted whole, its newline escaped.
  fs::remove(dir / "ck" / "latest");
  std::ofstream(dir / "ck" / "latest") << "global_step1\nglobal_step2\n";
  const CliResult two = run_dstrain("consolidate " + shell_quote((dir / "ck").string()) + " -o " + shell_quote((dir / "w.safetensors").string()));
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.err.find("holds \"global_step1\\nglobal_step2\", not a checkpoint tag"), std::string::npos) << two.err;
  fs::remove_all(dir);
}

}  // namespace
