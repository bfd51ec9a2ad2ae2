// `dstrain io-bench` as a user runs it: one row per block size x queue depth with plausible figures,
// the aio block of a config taken (and its warnings the same as check-config's), the named errors
// for a tmpfs folder, a missing folder and an I/O error injected through DSTRAIN_IO_FAULT.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

using dstrain::testing::fresh_suite_dir;
using dstrain::testing::run_dstrain;
using dstrain::testing::shell_quote;
using ::testing::HasSubstr;

namespace {

class IoBenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_suite_dir("dstrain_io_bench_cli");
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // The scratch files io-bench left in `dir` (it names them dstrain_io_bench.<pid>.dat).
  static int scratch_files(const std::filesystem::path& dir) {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.path().filename().string().rfind("dstrain_io_bench.", 0) == 0;
    return n;
  }
  std::filesystem::path dir_;
};

TEST_F(IoBenchCli, OneRowPerBlockSizeAndQueueDepth) {
  const auto r = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 4M --block-size 64K,1M --queue-depth 1,8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 4u);
  const std::uint64_t blocks[] = {65536, 65536, 1048576, 1048576}, depths[] = {1, 8, 1, 8};
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& row = j["rows"][i];
    EXPECT_EQ(row["block_size"], blocks[i]);
    EXPECT_EQ(row["queue_depth"], depths[i]);
    EXPECT_EQ(row["bytes"], 4u << 20);
    // 4 MiB in more than 40 us (100 GB/s) and less than 40 s: a figure, not noise or a unit slip.
    EXPECT_GT(row["write_gbps"].get<double>(), 1e-4);
    EXPECT_LT(row["write_gbps"].get<double>(), 100.0);
    EXPECT_GT(row["read_gbps"].get<double>(), 1e-4);
    EXPECT_LT(row["read_gbps"].get<double>(), 100.0);
    EXPECT_GE(row["read_cpu_s_per_gb"].get<double>(), 0.0);
  }
  EXPECT_EQ(scratch_files(dir_), 0) << "the bench file is left behind";
  // fio's terms: 4 KiB pages, no registration.
  const auto b = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 1M --pages base --no-fixed-buffers --json");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto row = nlohmann::json::parse(b.out)["rows"][0];
  EXPECT_EQ(row["pages"], "base");
  EXPECT_EQ(row["fixed_buffers"], false);
}

TEST_F(IoBenchCli, TakesTheConfigsAioBlockWithCheckConfigsWarnings) {
  const std::string cfg = (dir_ / "ds.json").string();
  std::ofstream(cfg) << R"({"train_batch_size": 1, "aio": {"block_size": 6000, "queue_depth": 3, "use_gds": true}})";
  const auto r = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 1M --json --deepspeed_config " + shell_quote(cfg));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(r.out)["rows"][0];
  EXPECT_EQ(row["block_size"], 6000);
  EXPECT_EQ(row["queue_depth"], 3);
  EXPECT_THAT(r.err, HasSubstr("aio.use_gds"));
  EXPECT_THAT(r.err, HasSubstr("cuFile"));
  EXPECT_THAT(r.err, HasSubstr("aio.block_size"));
  const auto check = run_dstrain("check-config " + shell_quote(cfg));
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.err, HasSubstr("warning: aio.use_gds: aio.use_gds is true, but GPUDirect Storage needs NVIDIA's cuFile"));
  EXPECT_THAT(check.err, HasSubstr("warning: aio.block_size: aio.block_size 6000 is not a multiple of 4096"));
  std::ofstream(cfg) << R"({"train_batch_size": 1, "aio": {"queue_depth": 40000}})";
  const auto bad = run_dstrain("check-config " + shell_quote(cfg));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("aio.queue_depth"));
}

TEST_F(IoBenchCli, TmpfsAndMissingFoldersAreNamedErrors) {
  if (std::filesystem::is_directory("/dev/shm")) {
    const auto r = run_dstrain("io-bench --path /dev/shm --size 1M");
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("/dev/shm/dstrain_io_bench."));
    EXPECT_THAT(r.err, HasSubstr("tmpfs"));
    EXPECT_EQ(scratch_files("/dev/shm"), 0);
  }
  const auto m = run_dstrain("io-bench --path " + shell_quote((dir_ / "nope").string()));
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_THAT(m.err, HasSubstr("not a folder"));
}

TEST_F(IoBenchCli, AnInjectedIoErrorExitsTwoNamingFileOffsetAndBytes) {
  // 1 MiB in 256 KiB pieces: the 2nd read piece is bytes [262144, 524288).
  const auto r = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 1M --block-size 256K", "DSTRAIN_IO_FAULT=eio:read@2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("read of 262144 bytes at offset 262144 of " + (dir_ / "dstrain_io_bench.").string()));
  EXPECT_THAT(r.err, HasSubstr(".dat failed: Input/output error"));
  EXPECT_EQ(scratch_files(dir_), 0);
  const auto bad = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 1M", "DSTRAIN_IO_FAULT=sometimes");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("DSTRAIN_IO_FAULT"));
}

// A file of the user's that bears a scratch name is never truncated or removed: io-bench writes a
// file of its own, created exclusively (it once wrote and deleted dstrain_io_bench.dat whatever
// it held).
TEST_F(IoBenchCli, NeverTouchesAUsersFile) {
  const std::filesystem::path mine = dir_ / "dstrain_io_bench.dat";
  std::ofstream(mine) << "a user's measurements";
  const auto r = run_dstrain("io-bench --path " + shell_quote(dir_.string()) + " --size 1M");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(mine);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "a user's measurements");
  EXPECT_EQ(scratch_files(dir_), 1);  // the user's file alone
}

}  // namespace
