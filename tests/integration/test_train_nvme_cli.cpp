// `dstrain train` with offload_optimizer.device "nvme" at stage 3 (docs/offload.md §5), as a user
// runs it: the losses of the "cpu" run, the swap folder announced before step 1 and gone after; an
// I/O error injected mid-step (DSTRAIN_IO_FAULT) and a tmpfs nvme_path exit 2 naming the file and
// the fix, without a hang and without leaving swap files.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace fs = std::filesystem;
using dstrain::testing::CliResult;
using dstrain::testing::read_file_text;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;
using ::testing::HasSubstr;

namespace {

class TrainNvmeCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = dstrain::testing::fresh_suite_dir("dstrain_test_train_nvme_cli");
    const CliResult prep = dstrain::testing::prepare_english_bytes_data(dir_);
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    fs::create_directories(dir_ / "nvme");
    write_config("cpu.json", R"("device": "cpu")");
    write_config("nvme.json", R"("device": "nvme", "buffer_count": 3, "nvme_path": )" + nlohmann::json((dir_ / "nvme").string()).dump());
    write_config("shm.json", R"("device": "nvme", "nvme_path": "/dev/shm")");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static void write_config(const std::string& name, const std::string& offload) {
    std::ofstream(dir_ / name) << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 1,
      "zero_optimization": {"stage": 3, "sub_group_size": 2000, "offload_optimizer": {)" + offload + R"(}},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}})";
  }
  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static std::string train_args(const std::string& config, const std::string& summary) {
    return "train --deepspeed_config " + q(dir_ / config) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " +
           q(dir_ / "t_train.bin") + " --steps 6 --seed 5 --summary-json " + q(dir_ / summary);
  }
  static fs::path dir_;
};
fs::path TrainNvmeCli::dir_;

TEST_F(TrainNvmeCli, TrainsAsTheCpuRunAndCleansUp) {
  const CliResult cpu = run_dstrain(train_args("cpu.json", "cpu.json.out"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const CliResult nvme = run_dstrain(train_args("nvme.json", "nvme.json.out"));
  ASSERT_EQ(nvme.exit_code, 0) << nvme.err;
  EXPECT_THAT(nvme.err + nvme.out, HasSubstr("NVMe swap: 3 file(s)"));
  EXPECT_THAT(nvme.err + nvme.out, HasSubstr((dir_ / "nvme" / "dstrain_swap").string()));
  const auto losses = [&](const std::string& f) { return nlohmann::json::parse(read_file_text(dir_ / f))["train_losses"]; };
  EXPECT_EQ(losses("nvme.json.out"), losses("cpu.json.out"));
  EXPECT_FALSE(fs::exists(dir_ / "nvme" / "dstrain_swap")) << "swap files left behind";
}

TEST_F(TrainNvmeCli, AnInjectedReadErrorMidStepExitsTwoNamingTheSwapFile) {
  const CliResult r = run_dstrain(train_args("nvme.json", "fault.json.out"), "DSTRAIN_IO_FAULT=eio:read@250");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 1/6 | loss")) << "the fault came before the first step ended, not mid-run";
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 6/6 | loss")));
  EXPECT_THAT(r.err, HasSubstr("failed: Input/output error"));
  EXPECT_THAT(r.err, HasSubstr(".swp"));
  EXPECT_THAT(r.err, HasSubstr("check the drive"));
  EXPECT_FALSE(fs::exists(dir_ / "nvme" / "dstrain_swap")) << "swap files left behind after the error";
}

TEST_F(TrainNvmeCli, ATmpfsNvmePathIsRefusedBeforeStepOne) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const CliResult r = run_dstrain(train_args("shm.json", "shm.json.out"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("tmpfs"));
  EXPECT_THAT(r.err, HasSubstr("/dev/shm/dstrain_swap"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 1/")));
  EXPECT_FALSE(fs::exists("/dev/shm/dstrain_swap"));
}

}  // namespace
