// Hardening 3 §4: the pre-flight's room check for the run's outputs (data/run_files.h) with the free
// space and file size limit injected — a small file system cannot be mounted in a unit test — and
// the checkpoint arithmetic behind the --save-dir figure (train/trainer_checkpoints.h), against
// counts worked out by hand from RankTrainer's save rule and the parameter formula of GPT-2.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "data/run_files.h"
#include "models/model_registry.h"
#include "ops/error.h"
#include "train/trainer_checkpoints.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

// The error of check_outputs_fit with every folder given `room` ("" when the outputs fit).
std::string refusal(const std::vector<OutputSize>& outputs, const OutputRoom& room) {
  try {
    check_outputs_fit(outputs, [&](const fs::path&) { return room; });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

OutputSize output(const std::string& path, const std::string& role, double bytes, double largest) {
  return {{path, role}, fs::path(path).parent_path(), bytes, largest, "figure"};
}

TEST(OutputRoom, ACheckpointLargerThanTheFreeSpaceIsRefusedNamingBoth) {
  const double mib = 1024.0 * 1024.0;
  OutputRoom small;
  small.free_bytes = 5 * mib;
  const std::string m = refusal({output("/scratch/ck", "--save-dir", 39 * mib, 39 * mib)}, small);
  EXPECT_NE(m.find("--save-dir /scratch/ck needs 39.0 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("has 5.0 MiB (5242880 bytes) free"), std::string::npos) << m;
  OutputRoom roomy;
  roomy.free_bytes = 40 * mib;
  EXPECT_EQ(refusal({output("/scratch/ck", "--save-dir", 39 * mib, 39 * mib)}, roomy), "");
  OutputRoom unknown;  // statvfs failed: nothing to compare with
  EXPECT_EQ(refusal({output("/scratch/ck", "--save-dir", 39 * mib, 39 * mib)}, unknown), "");
}

TEST(OutputRoom, OutputsOnOneFileSystemShareItsFreeSpace) {
  OutputRoom room;
  room.free_bytes = 1000;
  const std::vector<OutputSize> both{output("/d/w.safetensors", "--save-weights", 600, 600), output("/d/s.json", "--summary-json", 600, 600)};
  const std::string m = refusal(both, room);
  EXPECT_NE(m.find("--save-weights /d/w.safetensors needs 600 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("--summary-json /d/s.json needs 600 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("1200 bytes together"), std::string::npos) << m;
  // A full disk refuses even the small summary.
  OutputRoom full;
  full.free_bytes = 0;
  EXPECT_NE(refusal({output("/d/s.json", "--summary-json", 256, 256)}, full).find("--summary-json"), std::string::npos);
  // On two file systems each has its own room.
  const std::vector<OutputSize> apart{output("/a/w.safetensors", "--save-weights", 600, 600), output("/b/s.json", "--summary-json", 600, 600)};
  std::string m2 = "fits";
  try {
    check_outputs_fit(apart, [](const fs::path& folder) {
      OutputRoom r;
      r.free_bytes = 700;
      r.device = folder == "/a" ? 1 : 2;
      return r;
    });
  } catch (const Error& e) {
    m2 = e.what();
  }
  EXPECT_EQ(m2, "fits");
}

TEST(OutputRoom, AFileAboveTheFileSizeLimitIsRefusedNamingTheLimit) {
  OutputRoom limited;
  limited.file_size_limit = 20480;  // ulimit -f 20
  const std::string m = refusal({output("/d/w.safetensors", "--save-weights", 139000, 32768)}, limited);
  EXPECT_NE(m.find("--save-weights /d/w.safetensors"), std::string::npos) << m;
  EXPECT_NE(m.find("at least 32768 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("at most 20480 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("ulimit -f"), std::string::npos) << m;
  EXPECT_EQ(refusal({output("/d/w.safetensors", "--save-weights", 139000, 16384)}, limited), "");
}

TEST(CheckpointSpace, SavesAndCheckpointsKeptAtOnce) {
  // RankTrainer saves after step s when s % interval == 0 and s < the last step, and at the end.
  EXPECT_EQ(checkpoint_saves(0, 4, 0), 1);
  EXPECT_EQ(checkpoint_saves(0, 4, 1), 4);   // after 1, 2, 3, and the end
  EXPECT_EQ(checkpoint_saves(2, 6, 2), 2);   // after 4, and the end
  EXPECT_EQ(checkpoint_saves(0, 10, 3), 4);  // after 3, 6, 9, and the end
  EXPECT_EQ(checkpoint_saves(5, 5, 1), 1);   // resumed at its last step: the end save only
  // Keep all: every save stays. --keep-last K: a new one is written before the oldest goes, and the
  // ones there before the run free their space as they go.
  EXPECT_EQ(checkpoints_at_once(0, 4, 0), 4);
  EXPECT_EQ(checkpoints_at_once(3, 4, 0), 4);
  EXPECT_EQ(checkpoints_at_once(0, 4, 2), 3);  // 1; 2; 2 + 1; 2 + 1
  EXPECT_EQ(checkpoints_at_once(0, 1, 2), 1);
  EXPECT_EQ(checkpoints_at_once(2, 4, 2), 1);  // two old ones make room for the new ones
  EXPECT_EQ(checkpoints_at_once(5, 1, 2), 1);
}

TEST(CheckpointSpace, BytesFromTheParametersOptimizerAndPrecision) {
  // gpt2:L2-C32-H2-V256-T32: V·C + P·C + L·(12C² + 13C) + 2C = 8192 + 1024 + 2·12704 + 64 = 34688
  // parameters (V = 256 needs no padding). AdamW: master + 2 moments in fp32 = 12 bytes each; bf16
  // adds the 16-bit params, 14.
  const auto model = model_architecture("gpt2:L2-C32-H2-V256-T32");
  TrainerOptions o;
  o.save_dir = fs::path(::testing::TempDir()) / "dstrain_no_such_save_dir";
  o.save_interval = 1;
  config::ConfigOptions copts;
  copts.world_size = 2;
  const config::DsConfig fp32 = config::parse_ds_config(
      config::Json::parse(R"({"train_batch_size": 4, "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})"),
      copts);
  const CheckpointSpace a = checkpoint_space(o, *model, fp32, 2, 0, 3);
  EXPECT_EQ(a.bytes_each, 34688.0 * 12);
  EXPECT_EQ(a.largest_file, 34688.0 * 12);  // stage 0: rank 0 writes the whole
  EXPECT_EQ(a.saves, 3);
  EXPECT_EQ(a.at_once, 3);
  EXPECT_EQ(a.bytes, 3 * 34688.0 * 12);
  const config::DsConfig bf16 =
      config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 4, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})"),
                              copts);
  o.keep_last = 1;
  const CheckpointSpace b = checkpoint_space(o, *model, bf16, 2, 0, 3);
  EXPECT_EQ(b.bytes_each, 34688.0 * 14);
  EXPECT_EQ(b.largest_file, 34688.0 * 7);  // stage 2: each of the 2 ranks writes half
  EXPECT_EQ(b.at_once, 2);
  EXPECT_EQ(b.bytes, 2 * 34688.0 * 14);
}

}  // namespace
}  // namespace dstrain
