// `dstrain train` on several ranks: stragglers and time-based checkpoints (docs/monitoring.md
// "Stragglers", docs/cli.md). --inject-slow-rank makes one rank sleep in every step: the warning
// names that rank (host, local rank) within the first steps and no other; without the injection,
// or with --straggler-factor 0, no rank is named; the progress line shows the slowest rank. Bad
// --straggler-* values are refused naming the flag. --save-interval-minutes saves after (almost)
// every step when the interval is a fraction of a second, and needs --save-dir.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

class TrainStragglersCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_stragglers_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    std::ofstream(dir_ / "cfg.json") << R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 1}})";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string q(const fs::path& p) { return shell_quote(p.string()); }

  static std::string train(int ranks, int steps) {
    return "train --deepspeed_config " + q(dir_ / "cfg.json") + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
           q(dir_ / "t_train.bin") + " --seed 5 --sample-tokens 0 --steps " + std::to_string(steps) + " --num-ranks " + std::to_string(ranks);
  }
  static std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  static fs::path dir_;
};
fs::path TrainStragglersCli::dir_;

TEST_F(TrainStragglersCli, ASlowRankIsNamedWithItsHostAndLocalRank) {
  const CliResult r = run_dstrain(train(4, 8) + " --inject-slow-rank 2:300");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  // Named once (one episode), at step 3 (the default --straggler-steps 3), well within the first 5.
  EXPECT_EQ(count(r.err, "straggler: rank"), 1u) << r.err;
  const std::regex line(R"(straggler: rank 2 \(host [^,]+, local rank 2\) took 0\.[3-9]\d s per step for the last 3 steps, \d+\.\dx the median \d+\.\d\d s \(step (\d+)/8)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, line)) << r.err;
  EXPECT_LE(std::stoi(m[1].str()), 5) << r.err;
  for (const char* other : {"straggler: rank 0", "straggler: rank 1", "straggler: rank 3"}) EXPECT_EQ(r.err.find(other), std::string::npos) << r.err;
  // The progress line names the slowest rank and its time.
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(step 8/8 \| .*\| slowest rank 2: 0\.[3-9]\d s \|)"))) << r.out;
}

TEST_F(TrainStragglersCli, NoSlowRankNoWarningAndFactorZeroTurnsItOff) {
  const CliResult plain = run_dstrain(train(4, 6));
  ASSERT_EQ(plain.exit_code, 0) << plain.err << plain.out;
  EXPECT_EQ(plain.err.find("straggler"), std::string::npos) << plain.err;
  EXPECT_NE(plain.out.find("| slowest rank "), std::string::npos) << plain.out;

  const CliResult off = run_dstrain(train(4, 6) + " --inject-slow-rank 2:300 --straggler-factor 0");
  ASSERT_EQ(off.exit_code, 0) << off.err << off.out;
  EXPECT_EQ(off.err.find("straggler"), std::string::npos) << off.err;

  // One rank: nothing to compare, no slowest rank on the progress line.
  const CliResult one = run_dstrain(train(1, 2));
  ASSERT_EQ(one.exit_code, 0) << one.err << one.out;
  EXPECT_EQ(one.out.find("slowest rank"), std::string::npos) << one.out;
}

TEST_F(TrainStragglersCli, StragglerStepsAndBadValuesAreRefusedNamingTheFlag) {
  // --straggler-steps 1: named at the first slow step.
  const CliResult fast = run_dstrain(train(4, 3) + " --inject-slow-rank 1:300 --straggler-steps 1");
  ASSERT_EQ(fast.exit_code, 0) << fast.err << fast.out;
  EXPECT_NE(fast.err.find("straggler: rank 1 "), std::string::npos) << fast.err;
  EXPECT_NE(fast.err.find("for the last 1 steps"), std::string::npos) << fast.err;
  EXPECT_NE(fast.err.find("(step 1/3"), std::string::npos) << fast.err;

  for (const auto& [args, flag] : {std::pair<std::string, std::string>{" --straggler-factor 1", "--straggler-factor"},
                                   {" --straggler-factor 0.5", "--straggler-factor"},
                                   {" --straggler-steps 0", "--straggler-steps"},
                                   {" --inject-slow-rank 2", "--inject-slow-rank"},
                                   {" --inject-slow-rank 7:10", "--inject-slow-rank"},
                                   {" --save-interval-minutes 1", "--save-dir"},
                                   {" --save-interval-minutes -1 --save-dir " + q(dir_ / "never"), "--save-interval-minutes"}}) {
    const CliResult bad = run_dstrain(train(4, 2) + args);
    EXPECT_NE(bad.exit_code, 0) << args;
    EXPECT_NE(bad.err.find(flag), std::string::npos) << args << ": " << bad.err;
    EXPECT_EQ(bad.out.find("step 1/2"), std::string::npos) << args << ": refused before step 1\n" << bad.out;
  }
}

TEST_F(TrainStragglersCli, SaveIntervalMinutesSavesOnTheClock) {
  // 0.0001 minutes = 6 ms: every step (each made 20 ms long by --inject-slow-rank on rank 0, whose
  // clock decides) saves; --keep-last 0 keeps them all.
  const fs::path timed = dir_ / "timed";
  const CliResult r = run_dstrain(train(2, 5) + " --save-dir " + q(timed) + " --save-interval-minutes 0.0001 --keep-last 0 --inject-slow-rank 0:20");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  int saved = 0;
  for (int s = 1; s <= 5; ++s) saved += fs::exists(timed / ("global_step" + std::to_string(s))) ? 1 : 0;
  EXPECT_GE(saved, 4) << r.out;
  EXPECT_TRUE(fs::exists(timed / "global_step5")) << r.out;
  EXPECT_NE(r.out.find("every 0.0001 minutes"), std::string::npos) << r.out;

  // Without it: the final checkpoint alone.
  const fs::path end = dir_ / "end";
  const CliResult e = run_dstrain(train(2, 5) + " --save-dir " + q(end));
  ASSERT_EQ(e.exit_code, 0) << e.err << e.out;
  for (int s = 1; s <= 4; ++s) EXPECT_FALSE(fs::exists(end / ("global_step" + std::to_string(s)))) << s;
  EXPECT_TRUE(fs::exists(end / "global_step5"));

  // One rank: rank 0's clock alone.
  const fs::path one = dir_ / "one";
  const CliResult o = run_dstrain(train(1, 4) + " --save-dir " + q(one) + " --save-interval-minutes 0.0001 --inject-slow-rank 0:20");
  ASSERT_EQ(o.exit_code, 0) << o.err << o.out;
  int saved_one = 0;
  for (int s = 1; s <= 4; ++s) saved_one += fs::exists(one / ("global_step" + std::to_string(s))) ? 1 : 0;
  EXPECT_GE(saved_one, 3) << o.out;
}

}  // namespace
