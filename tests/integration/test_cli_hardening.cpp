// The dstrain binary with bad command lines and inputs (issue 14, section 2): every mistake exits
// 2 with a message a person can read that names the option or value; nothing reads without bound,
// overwrites an input or wraps a number; the process keeps its name. Each check failed before its
// fix (CLI11's exit codes 104-114 and its "Value 0 not in range 0.000000 to 1797693..." message,
// a read of /dev/zero without end, NaN printed as null in a "valid" config, 2^63 wrapped to a
// negative batch size, prepare-data replacing its own input, pgrep seeing "exe").
#include <gtest/gtest.h>

#include <sys/stat.h>
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
  expect_exit2_naming(run_dstrain("trian"), "unknown command \"trian\"; the commands are ");
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

// Hardening round 3 (issue 30, §5 and §6): what the command line ignored, wrapped or said in
// CLI11's words. Every run is refused before step 1 or trains one step.

TEST_F(CliHardening, CommandLineWordingIsDstrains) {
  // "A subcommand is required" named neither the word nor the commands.
  const CliResult bogus = run_dstrain("bogus");
  expect_exit2_naming(bogus, "unknown command \"bogus\"; the commands are check-config, prepare-data, train, consolidate, export, io-bench, estimate-memory");
  expect_exit2_naming(run_dstrain(""), "no command given; the commands are check-config");
  // "--steps: At Most 1 required but received 2".
  const std::string train = "train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:tiny --data " + q(dir_ / "none.bin");
  const CliResult twice = run_dstrain(train + " --steps 1 --steps 2");
  expect_exit2_naming(twice, "--steps given twice (--steps 1 and --steps 2): give it once");
  EXPECT_EQ(twice.err.find("At Most"), std::string::npos) << twice.err;
}

// A FIFO or a folder given as --data or --init-from was reported as "no such file".
TEST_F(CliHardening, ANonRegularDataFileIsNamedAsSuch) {
  const fs::path fifo = dir_ / "data.fifo";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string train = "train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:tiny --steps 1";
  expect_exit2_naming(run_dstrain(train + " --data " + q(fifo), "timeout 60"), "not a regular file (a FIFO)");
  expect_exit2_naming(run_dstrain(train + " --data " + q(dir_), "timeout 60"), "not a regular file (a folder)");
  fs::remove(fifo);
}

TEST_F(CliHardening, EmptyValuesAndNegativeSeedsAreRefused) {
  const std::string train = "train --deepspeed_config " + q(dir_ / "ds.json") + " --model gpt2:tiny --data " + q(dir_ / "none.bin");
  // An unset shell variable gave "" and the output was lost, with exit 0.
  for (const std::string flag : {"--init-from", "--save-dir", "--save-weights", "--summary-json", "--val-data", "--load-tag"}) {
    SCOPED_TRACE(flag);
    const CliResult r = run_dstrain(train + " " + flag + " ''");
    expect_exit2_naming(r, flag + ": the value is empty (an unset shell variable?)");
  }
  expect_exit2_naming(run_dstrain(train + " --resume ''"), "--resume is empty (an unset shell variable?)");
  expect_exit2_naming(run_dstrain("consolidate " + q(dir_) + " -o ''"), "--output: the value is empty");
  // -1 became 2^64 - 1.
  expect_exit2_naming(run_dstrain(train + " --seed -1"), "--seed: '-1' is not a whole number from 0 to 18446744073709551615");
  expect_exit2_naming(run_dstrain(train + " --seed 18446744073709551616"), "from 0 to 18446744073709551615");
}

TEST_F(CliHardening, AutoValueOptionsTheConfigHasNoKeyForWarn) {
  // ds.json has an optimizer block without eps / weight_decay, and no gradient_clipping, fp16 / bf16
  // or ZeRO bucket sizes: these options were ignored without a word (--lr, compared with the
  // config's lr, warned).
  const CliResult r = run_dstrain("check-config " + q(dir_ / "ds.json") +
                                  " --gradient-clipping 0.5 --weight-decay 0.1 --adam-eps 1e-06 --precision bf16 --hidden-size 64 --lr 0.001");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* expected :
       {"--gradient-clipping 0.5 is not used: the config has no gradient_clipping, so DeepSpeed's default applies; set \"gradient_clipping\": "
        "\"auto\" in the config to take the flag",
        "--weight-decay 0.1 is not used: the config's optimizer has no params.weight_decay, so the optimizer's default applies; set "
        "\"weight_decay\": \"auto\"",
        "--adam-eps 1e-06 is not used", "--precision bf16 is not used: the config has no fp16 or bf16 \"enabled\" key, so the run is fp32",
        "set \"bf16\": {\"enabled\": \"auto\"}", "--hidden-size 64 is not used: no ZeRO bucket size in the config is \"auto\""}) {
    EXPECT_NE(r.err.find(expected), std::string::npos) << expected << "\n" << r.err;
  }
  EXPECT_EQ(r.err.find("--lr"), std::string::npos) << r.err;  // the config's lr is the same value: nothing to say
  // fp32 is what a config without fp16 / bf16 trains in: the option agrees.
  const CliResult fp32 = run_dstrain("check-config " + q(dir_ / "ds.json") + " --precision fp32");
  EXPECT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_EQ(fp32.err.find("--precision"), std::string::npos) << fp32.err;
}

TEST_F(CliHardening, ModelSpecZeroSizesNameTheSize) {
  const std::string train =
      "train --deepspeed_config " + q(dir_ / "ds.json") + " --data " + q(dir_ / "ds.json") + " --model ";  // the spec is read before the data
  expect_exit2_naming(run_dstrain(train + "gpt2:L0-C8-H2"), "n_layer (L) must be at least 1 in gpt2:L0-C8-H2");
  expect_exit2_naming(run_dstrain(train + "llama:L2-C64-H4-I0"), "intermediate_size (I) must be at least 1 in llama:L2-C64-H4-I0");
}

TEST_F(CliHardening, IoBenchReportsWhatWasGivenOrRefusesIt) {
  const std::string bench = "io-bench --path " + q(dir_);
  // 1048576 ran as 32769, and the error named 32769.
  const CliResult depth = run_dstrain(bench + " --queue-depth 8,1048576");
  expect_exit2_naming(depth, "'1048576' is not a queue depth an io_uring ring holds: give a whole number from 1 to 32768");
  // -1M wrapped to 18446744073709551615.
  const CliResult negative = run_dstrain(bench + " --size -1M");
  expect_exit2_naming(negative, "--size: '-1M' is not a size");
  EXPECT_EQ(negative.err.find("18446744073709551615"), std::string::npos) << negative.err;
  expect_exit2_naming(run_dstrain(bench + " --block-size=-4K"), "'-4K' is not a size");
  // 1T advised reducing the micro-batch size.
  const CliResult huge = run_dstrain(bench + " --size 1T");
  expect_exit2_naming(huge, "io-bench --size 1099511627776 (1.00 TiB)");
  EXPECT_EQ(huge.err.find("micro-batch"), std::string::npos) << huge.err;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind("dstrain_io_bench", 0), std::string::npos) << e.path();  // refused before the scratch file
  // Ranges in dstrain's words, not CLI11's "Value 0 not in range".
  expect_exit2_naming(run_dstrain(bench + " --loops 0"), "--loops: '0' is not a whole number from 1 to 1000");
  expect_exit2_naming(run_dstrain(bench + " --intra-op-parallelism -1"), "--intra-op-parallelism: '-1' is not a whole number from 1 to 1048576");
}

TEST_F(CliHardening, AnUnreachedProfileStepIsAWarning) {
  const fs::path data = dir_ / "profile";
  ASSERT_EQ(dstrain::testing::prepare_english_bytes_data(data).exit_code, 0);
  std::ofstream(dir_ / "profile.json") << R"({"train_micro_batch_size_per_gpu": 2, "flops_profiler": {"enabled": true, "profile_step": 5}})";
  const CliResult r =
      run_dstrain("train --deepspeed_config " + q(dir_ / "profile.json") + " --model gpt2:L1-C16-H2-V256-T16 --tokenizer bytes --data " +
                  q(data / "t_train.bin") + " --steps 1 --sample-tokens 0 --peak-flops 1e9");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("flops_profiler.profile_step is 5 but the run ends after step 1 (--steps 1): no flops profile is printed"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("--hidden-size"), std::string::npos) << r.err;  // the model's hidden size is not an option given
}

}  // namespace
