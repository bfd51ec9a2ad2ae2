// The dstrain binary with bad command lines and inputs (issue 14, section 2): every mistake exits
// 2 with a message a person can read that names the option or value; nothing reads without bound,
// overwrites an input or wraps a number; the process keeps its name. Each check failed before its
// fix (CLI11's exit codes 104-114 and its "Value 0 not in range 0.000000 to 1797693..." message,
// a read of /dev/zero without end, NaN printed as null in a "valid" config, 2^63 wrapped to a
// negative batch size, prepare-data replacing its own input, pgrep seeing "exe").
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;

namespace {

class CliHardening : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_cli_hardening");
    fs::create_directories(dir_);
    std::ofstream(dir_ / "ds.json") << R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static void expect_exit2_naming(const CliResult& r, const std::string& what) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("dstrain: error: "), std::string::npos) << r.err;
  }
  static fs::path dir_;
};
fs::path CliHardening::dir_;

TEST_F(CliHardening, CommandLineMistakesExit2WithReadableMessages) {
  const std::string train = "train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:tiny --data " + q(dir_ / "none.bin");
  const CliResult zero = run_dstrain(train + " --warmup-steps 0");
  expect_exit2_naming(zero, "--warmup-steps");
  EXPECT_NE(zero.err.find("0 is less than 1"), std::string::npos) << zero.err;
  EXPECT_EQ(zero.err.find("1797693"), std::string::npos) << zero.err;  // not CLI11's range of doubles
  EXPECT_NE(zero.err.find("dstrain train --help"), std::string::npos) << zero.err;
  expect_exit2_naming(run_dstrain(train + " --num-ranks two"), "'two' is not a whole number");
  expect_exit2_naming(run_dstrain(train + " --steps -1"), "--steps");
  expect_exit2_naming(run_dstrain(train + " --tokenizer klingon"), "'klingon' is not one of gpt2, bytes, or the path of a tokenizer.json");
  expect_exit2_naming(run_dstrain(train + " --no-such-option"), "--no-such-option");
  expect_exit2_naming(run_dstrain("train --model gpt2:tiny"), "--deepspeed_config");
  expect_exit2_naming(run_dstrain("trian"), "subcommand");
  expect_exit2_naming(run_dstrain("check-config " + q(dir_ / "ds.json") + " --world-size 0"), "--world-size");
  expect_exit2_naming(run_dstrain("prepare-data --tokenizer bytes"), "");
  // --help and --version still succeed.
  EXPECT_EQ(run_dstrain("train --help").exit_code, 0);
  EXPECT_EQ(run_dstrain("--version").exit_code, 0);
}

TEST_F(CliHardening, CheckConfigRefusesNonFiniteAutoValues) {
  for (const std::string flag : {"--lr", "--adam-eps", "--gradient-clipping", "--weight-decay"}) {
    for (const char* v : {"nan", "inf"}) {
      SCOPED_TRACE(flag + " " + v);
      const CliResult r = run_dstrain("check-config " + q(dir_ / "ds.json") + " --json " + flag + " " + v);
      expect_exit2_naming(r, flag);
      EXPECT_EQ(r.out.find("null"), std::string::npos) << r.out;
    }
  }
  expect_exit2_naming(run_dstrain("check-config " + q(dir_ / "ds.json") + " --adam-betas 0.9 nan"), "--adam-betas");
}

TEST_F(CliHardening, CheckConfigCapsWhatItReads) {
  // /dev/zero never ends: it was read until memory ran out.
  const CliResult r = run_dstrain("check-config /dev/zero", "timeout 60");
  expect_exit2_naming(r, "/dev/zero");
  EXPECT_NE(r.err.find("more than 16 MiB"), std::string::npos) << r.err;
}

TEST_F(CliHardening, IntegerOverflowIsReportedWithTheValueWritten) {
  const CliResult big = run_dstrain(R"(check-config '{"train_micro_batch_size_per_gpu": 9223372036854775808}')");
  expect_exit2_naming(big, "9223372036854775808");
  const CliResult product =
      run_dstrain(R"(check-config '{"train_micro_batch_size_per_gpu": 4294967296, "gradient_accumulation_steps": 4294967296}' --world-size 4)");
  expect_exit2_naming(product, "4294967296");
  EXPECT_NE(product.err.find("64-bit"), std::string::npos) << product.err;
  // 3037000500^2 * 4 wrapped to a positive number and passed as valid.
  const CliResult wrapped =
      run_dstrain(R"(check-config '{"train_micro_batch_size_per_gpu": 3037000500, "gradient_accumulation_steps": 3037000500}' --world-size 4)");
  expect_exit2_naming(wrapped, "3037000500");
  expect_exit2_naming(run_dstrain(R"(check-config '{"train_batch_size": 1e30}')"), "too large");
}

TEST_F(CliHardening, PrepareDataNeverOverwritesAnInput) {
  const fs::path text = dir_ / "text";
  fs::create_directories(text);
  std::ofstream(text / "a.txt") << "The quick brown fox jumps over the lazy dog. ";
  std::ofstream(text / "b.txt") << "A stitch in time saves nine. ";
  const std::string before = read_file_text(text / "a.txt");
  expect_exit2_naming(run_dstrain("prepare-data --tokenizer bytes " + q(text / "a.txt") + " -o " + q(text / "a.txt")),
                      "is the file given as an input");
  EXPECT_EQ(read_file_text(text / "a.txt"), before);
  // An output in the input folder would be read as text by the next run of the same command.
  expect_exit2_naming(run_dstrain("prepare-data --tokenizer bytes " + q(text) + " -o " + q(text / "x.bin")), "lies in the input folder");
  expect_exit2_naming(run_dstrain("prepare-data --tokenizer bytes " + q(text) + " -o " + q(dir_ / "t.bin") + " --val-fraction 0.5 --val-output " +
                                  q(text / "b.txt")),
                      "is the file given as an input");
  EXPECT_FALSE(fs::exists(text / "x.bin"));
  EXPECT_EQ(run_dstrain("prepare-data --tokenizer bytes " + q(text) + " -o " + q(dir_ / "t.bin")).exit_code, 0);
}

TEST_F(CliHardening, PrepareDataUnderAFileSizeLimitIsAnErrorWithoutLeftovers) {
  const fs::path text = dir_ / "big_text";
  fs::create_directories(text);
  std::ofstream(text / "a.txt") << std::string(100000, 'x');
  const fs::path out = dir_ / "limited";
  fs::create_directories(out);
  const CliResult r = run_dstrain("prepare-data --tokenizer bytes " + q(text) + " -o " + q(out / "t.bin"), "ulimit -f 20;");
  expect_exit2_naming(r, "ulimit -f");
  EXPECT_TRUE(fs::is_empty(out));
}

TEST_F(CliHardening, TheProcessKeepsItsName) {
  // The OpenMP re-exec went through /proc/self/exe, so the kernel named the process "exe".
  const fs::path comm = dir_ / "comm.txt";
  const std::string script = "unset OMP_WAIT_POLICY; (sleep 2; echo '{\"train_batch_size\": 1}') | " + std::string(DSTRAIN_BINARY_DIR) +
                             "/dstrain check-config /dev/stdin >/dev/null 2>&1 & pid=$!; sleep 1; cat /proc/$pid/comm > " + q(comm) + "; wait";
  ASSERT_EQ(std::system(("sh -c " + shell_quote(script)).c_str()), 0);
  EXPECT_EQ(read_file_text(comm), "dstrain\n");
}

}  // namespace
