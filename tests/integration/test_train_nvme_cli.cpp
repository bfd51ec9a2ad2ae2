// `dstrain train` with offload_optimizer.device "nvme" at stage 3 (docs/offload.md §5), as a user
// runs it: the losses of the "cpu" run, the swap folder announced before step 1 and gone after; an
// I/O error injected mid-step (DSTRAIN_IO_FAULT) and a tmpfs nvme_path exit 2 naming the file and
// the fix, without a hang and without leaving swap files; a sub_group_size whose padding outweighs
// the state is refused; a killed run's swap folder is reclaimed; SIGTERM ends a run whose swap I/O
// crawls within seconds.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
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
      "zero_optimization": {"stage": 3, "sub_group_size": 2000, "offload_optimizer": {)" +
                                      offload + R"(}},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}})";
  }
  static std::string q(const fs::path& p) { return shell_quote(p.string()); }
  static std::string train_args(const std::string& config, const std::string& summary, int steps = 6) {
    return "train --deepspeed_config " + q(dir_ / config) + " --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data " + q(dir_ / "t_train.bin") +
           " --steps " + std::to_string(steps) + " --seed 5 --summary-json " + q(dir_ / summary);
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

// The summary's offload figures (docs/offload.md §9): every step reads and writes the whole swap
// partition (17 sub-groups of 2000 elements through 3 buffers), so the last step's bytes read =
// written = the swap files' bytes, the totals are 6 steps of it (reads: less what step 1 found
// still in the buffers), the rate and the wait share follow from them, and "zero" holds the same
// figures per rank. A "cpu" run reports its optimizer in host memory and no NVMe traffic.
TEST_F(TrainNvmeCli, TheSummaryReportsBytesHeldAndMovedPerStep) {
  const CliResult nvme = run_dstrain(train_args("nvme.json", "report_nvme.json.out"));
  ASSERT_EQ(nvme.exit_code, 0) << nvme.err;
  EXPECT_THAT(nvme.out, HasSubstr("offload (optimizer on nvme), bytes held:"));
  EXPECT_THAT(nvme.out, HasSubstr("nvme per step: read"));
  const nlohmann::json j = nlohmann::json::parse(read_file_text(dir_ / "report_nvme.json.out"));
  ASSERT_TRUE(j.contains("offload")) << j.dump(2);
  const nlohmann::json& o = j["offload"];
  EXPECT_EQ(o["optimizer_home"], "nvme");
  const auto files = o["bytes_held"]["nvme"]["optimizer"].get<std::uint64_t>();
  EXPECT_GT(files, 0u);
  EXPECT_EQ(o["bytes_held"]["nvme"]["total"].get<std::uint64_t>(), files);
  EXPECT_EQ(o["bytes_held"]["device"]["optimizer"].get<std::uint64_t>(), 0u);
  EXPECT_GT(o["bytes_held"]["host"]["optimizer"].get<std::uint64_t>(), 0u);
  EXPECT_LT(o["bytes_held"]["host"]["optimizer"].get<std::uint64_t>(), files) << "only the buffers are in memory";
  EXPECT_EQ(o["nvme_last_step_bytes_read"].get<std::uint64_t>(), files);
  EXPECT_EQ(o["nvme_last_step_bytes_written"].get<std::uint64_t>(), files);
  const auto written = o["nvme_bytes_written"].get<std::uint64_t>(), read = o["nvme_bytes_read"].get<std::uint64_t>();
  EXPECT_EQ(written, 6 * files);
  EXPECT_LE(read, 6 * files);
  EXPECT_GT(read, 5 * files);
  EXPECT_DOUBLE_EQ(o["nvme_bytes_written_per_step"].get<double>(), static_cast<double>(files));
  const double train_s = j["train_seconds"].get<double>();
  EXPECT_NEAR(o["nvme_gb_per_s"].get<double>(), static_cast<double>(read + written) / train_s / 1e9, 1e-12);
  const double share = o["io_wait_share"].get<double>();
  EXPECT_GE(share, 0.0);
  EXPECT_LT(share, 1.0);
  EXPECT_NEAR(share, o["io_wait_seconds"].get<double>() / train_s, 1e-12);
  const nlohmann::json& rank = j["zero"]["ranks"][0];
  EXPECT_EQ(rank["optimizer_home"], "nvme");
  EXPECT_EQ(rank["nvme_train_io"]["bytes_written"].get<std::uint64_t>(), written);
  EXPECT_EQ(rank["nvme_step_io"]["bytes_read"].get<std::uint64_t>(), files);
  EXPECT_EQ(rank["bytes_held"]["nvme"]["optimizer"].get<std::uint64_t>(), files);

  const CliResult cpu = run_dstrain(train_args("cpu.json", "report_cpu.json.out"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_THAT(cpu.out, HasSubstr("offload (optimizer on host), bytes held:"));
  const nlohmann::json c = nlohmann::json::parse(read_file_text(dir_ / "report_cpu.json.out"))["offload"];
  EXPECT_EQ(c["optimizer_home"], "host");
  EXPECT_EQ(c["bytes_held"]["nvme"]["total"].get<std::uint64_t>(), 0u);
  EXPECT_GT(c["bytes_held"]["host"]["optimizer"].get<std::uint64_t>(), 3 * o["bytes_held"]["host"]["optimizer"].get<std::uint64_t>())
      << "the whole partition in host memory, not 3 buffers of it";
  EXPECT_EQ(c["nvme_bytes_read"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(c["nvme_bytes_written"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(c["io_wait_seconds"].get<double>(), 0.0);
}

// offload_param on nvme with the optimizer on the device: the summary reports the parameter swap
// file under nvme params (docs/offload.md §9), in the text and in --summary-json, lead rank and
// zero.ranks[] alike. Before, the run printed no offload figures at all, and with the optimizer
// offloaded too it printed "nvme params 0 B" beside the parameter store's swap file.
TEST_F(TrainNvmeCli, TheSummaryReportsTheParameterSwapFileUnderNvmeParams) {
  std::ofstream(dir_ / "param.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 1,
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
        "offload_param": {"device": "nvme", "max_in_cpu": 0, "nvme_path": )" +
                                            nlohmann::json((dir_ / "nvme").string()).dump() + R"(}},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}})";
  const CliResult r = run_dstrain(train_args("param.json", "param.json.out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("offload (optimizer on device), bytes held:"));
  const nlohmann::json j = nlohmann::json::parse(read_file_text(dir_ / "param.json.out"));
  ASSERT_TRUE(j.contains("offload")) << j.dump(2);
  const auto files = j["offload"]["bytes_held"]["nvme"]["params"].get<std::uint64_t>();
  EXPECT_GT(files, 0u);
  EXPECT_EQ(files % 4096, 0u) << "each unit at a 4096-aligned offset";
  EXPECT_EQ(j["offload"]["bytes_held"]["nvme"]["optimizer"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(j["zero"]["ranks"][0]["bytes_held"]["nvme"]["params"].get<std::uint64_t>(), files);
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("nvme   params 0 B")));
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
  EXPECT_THAT(r.err, HasSubstr("zero_optimization.offload_optimizer.nvme_path \"/dev/shm\""));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 1/")));
  EXPECT_FALSE(fs::exists("/dev/shm/dstrain_swap"));
}

// offload_param on nvme where nothing is swapped: this model's parameters are all below
// stage3_param_persistence_threshold (default 1e5 elements), so no swap file is ever opened, and
// the engine's open-time tmpfs check never ran — the run trained on /dev/shm. The folder itself is
// now checked before step 1; check-config reports it as a finding about this machine (exit 0: the
// config may be meant for another machine).
TEST_F(TrainNvmeCli, ATmpfsParamNvmePathIsRefusedEvenWhenNothingIsSwapped) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  std::ofstream(dir_ / "param_shm.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/dev/shm", "max_in_cpu": 0}},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  const CliResult r = run_dstrain(train_args("param_shm.json", "param_shm.json.out"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("zero_optimization.offload_param.nvme_path \"/dev/shm\""));
  EXPECT_THAT(r.err, HasSubstr("tmpfs"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 1/")));
  const CliResult check = run_dstrain("check-config " + q(dir_ / "param_shm.json"));
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.err, HasSubstr("on this machine: zero_optimization.offload_param.nvme_path \"/dev/shm\""));
}

// sub_group_size 1 preallocated 39 GB of swap for 38 MB of optimizer state (every sub-group padded
// to a 4096-byte page per state) and never finished a step. A layout whose swap exceeds 2x the state
// is refused before step 1, naming sub_group_size and a value that fits; an accepted one says at
// start how much swap holds how much state in how many sub-groups.
TEST_F(TrainNvmeCli, ASubGroupSizeWhosePaddingOutweighsTheStateIsRefusedBeforeStepOne) {
  std::ofstream(dir_ / "tiny_groups.json") << R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "sub_group_size": 100, "offload_optimizer": {"device": "nvme", "nvme_path": )" +
                                                  nlohmann::json((dir_ / "nvme").string()).dump() + R"(}},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})";
  const CliResult r = run_dstrain(train_args("tiny_groups.json", "tiny_groups.json.out"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("zero_optimization.sub_group_size: the NVMe swap files would take"));
  EXPECT_THAT(r.err, HasSubstr("at least 1024"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("step 1/")));
  EXPECT_FALSE(fs::exists(dir_ / "nvme" / "dstrain_swap")) << "swap files made before the refusal";
  const CliResult ok = run_dstrain(train_args("nvme.json", "plan.json.out", 1));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.err + ok.out, HasSubstr("of optimizer state (3 fp32 state(s) of"));
  EXPECT_THAT(ok.err + ok.out, HasSubstr("sub-group(s) of at most 2000 elements (zero_optimization.sub_group_size)"));
}

// After a kill -9 a run's swap folder stays; the next run reclaims a folder whose owner process is
// gone and says so (a reaped child's pid stands for the killed run), and keeps one in use.
TEST_F(TrainNvmeCli, AKilledRunsSwapFolderIsReclaimedByTheNextRun) {
  const fs::path nvme = dir_ / "nvme_stale";
  const fs::path stale = nvme / "dstrain_swap" / "killed-run" / "rank0";
  fs::create_directories(stale);
  std::ofstream(stale / "master.swp") << std::string(1 << 16, 'x');
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  // The owner record a run writes (offload/swap_owner.h); no start time: the pid alone is gone.
  std::ofstream(stale / "dstrain_owner") << "host " << host << "\npid " << child << "\n";
  write_config("stale.json", R"("device": "nvme", "buffer_count": 3, "nvme_path": )" + nlohmann::json(nvme.string()).dump());
  const CliResult r = run_dstrain(train_args("stale.json", "stale.json.out", 1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err + r.out, HasSubstr("reclaimed the swap folder " + stale.string()));
  EXPECT_THAT(r.err + r.out, HasSubstr("pid " + std::to_string(child)));
  EXPECT_FALSE(fs::exists(nvme / "dstrain_swap")) << "the stale folder or the run's own stayed";
}

// SIGTERM while swap I/O crawls (DSTRAIN_IO_FAULT=slow@1: every piece waits 200 ms, so one pass over
// the 17 sub-groups takes ~20 s): the handler records it, and the swap-in loop gives up once the
// request has waited the grace (3 s) for a step boundary — the process ends within seconds, exit 75
// as for a stop at a boundary, saying what was interrupted, and leaves no swap files. It used to end
// only at the step boundary, tens of seconds (with sub_group_size 1: never) later.
TEST_F(TrainNvmeCli, SigtermDuringSlowSwapIoEndsTheRunWithinSeconds) {
  const fs::path out = dir_ / "slow.txt", code = dir_ / "slow.code", took = dir_ / "slow.seconds";
  const std::string cmd = "(DSTRAIN_IO_FAULT=slow@1 " + std::string(DSTRAIN_BINARY_DIR) + "/dstrain " + train_args("nvme.json", "slow.json.out") +
                          " >" + q(out) + " 2>&1 </dev/null & p=$!; n=0; while ! grep -q 'NVMe swap:' " + q(out) +
                          " && [ $n -lt 1200 ] && kill -0 $p 2>/dev/null; do sleep 0.1; n=$((n+1)); done; sleep 0.5; kill -TERM $p; " +
                          "t0=$(date +%s.%N); n=0; while kill -0 $p 2>/dev/null && [ $n -lt 250 ]; do sleep 0.1; n=$((n+1)); done; " +
                          "awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN { print b - a }' >" + q(took) + "; kill -9 $p 2>/dev/null; wait $p; echo $? >" +
                          q(code) + ")";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string text = read_file_text(out);
  EXPECT_EQ(std::stoi(read_file_text(code)), 75) << text;
  EXPECT_LT(std::stod(read_file_text(took)), 20.0) << "SIGTERM was not honoured during swap I/O:\n" << text;
  EXPECT_THAT(text, HasSubstr("stopped by signal 15 (SIGTERM) while swapping optimizer sub-group"));
  EXPECT_THAT(text, HasSubstr("nothing was saved"));
  EXPECT_FALSE(fs::exists(dir_ / "nvme" / "dstrain_swap")) << "swap files left behind after the stop";
}

}  // namespace
