// Batch-size arithmetic, docs/batch.md §2–§3: every inference row, null vs 0, and the four assertions with
// DeepSpeed's messages.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::parse;

struct Row {
  const char* json;
  std::int64_t world;
  std::int64_t tbs, mbs, gas;
};

TEST(BatchSize, InferenceTableRows) {
  const Row rows[] = {
      // all three given: nothing computed
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})", 2, 32, 4, 4},
      // TBS, MBS: GAS = (TBS // MBS) // W
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 2, 32, 4, 4},
      // TBS, GAS: MBS = (TBS // W) // GAS
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 2, 32, 8, 2},
      // MBS, GAS: TBS = MBS * GAS * W
      {R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})", 2, 16, 4, 2},
      // TBS only: GAS = 1, MBS = TBS // W
      {R"({"train_batch_size": 32})", 2, 32, 16, 1},
      // MBS only: GAS = 1, TBS = MBS * W
      {R"({"train_micro_batch_size_per_gpu": 4})", 2, 8, 4, 1},
      // null counts as omitted
      {R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": null})", 3, 12, 4, 1},
      // hjson's 5e8-style integral floats work in DeepSpeed's arithmetic
      {R"({"train_batch_size": 64.0, "train_micro_batch_size_per_gpu": 8})", 8, 64, 8, 1},
  };
  for (const auto& r : rows) {
    const DsConfig c = parse(r.json, r.world);
    EXPECT_EQ(c.train_batch_size, r.tbs) << r.json;
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, r.mbs) << r.json;
    EXPECT_EQ(c.gradient_accumulation_steps, r.gas) << r.json;
    EXPECT_EQ(c.to_json()["train_batch_size"], r.tbs);
    EXPECT_EQ(c.to_json()["gradient_accumulation_steps"], r.gas);
  }
}

TEST(BatchSize, NeitherTbsNorMbs) {
  const std::string needed = "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided";
  EXPECT_TRUE(contains(error_of(R"({"gradient_accumulation_steps": 4})"), needed));
  EXPECT_TRUE(contains(error_of(R"({})"), needed));
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": null})"), needed));
}

TEST(BatchSize, AssertionTrainBatchSize) {
  // 0 counts as given: TBS 0 with MBS 4 -> GAS 0, and check 1 fires first.
  const std::string m = error_of(R"({"train_batch_size": 0, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_TRUE(contains(m, "Train batch size: 0 has to be greater than 0")) << m;
}

TEST(BatchSize, AssertionMicroBatch) {
  const std::string m = error_of(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": -1, "gradient_accumulation_steps": 1})");
  EXPECT_TRUE(contains(m, "Micro batch size per gpu: -1 has to be greater than 0")) << m;
  // TBS smaller than the world size: MBS = 1 // 2 = 0.
  const std::string inferred = error_of(R"({"train_batch_size": 1})", 2);
  EXPECT_TRUE(contains(inferred, "Micro batch size per gpu: 0 has to be greater than 0")) << inferred;
  // An explicit 0 would make DeepSpeed divide by zero; we report the assertion.
  const std::string zero = error_of(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0})");
  EXPECT_TRUE(contains(zero, "Micro batch size per gpu: 0 has to be greater than 0")) << zero;
}

TEST(BatchSize, AssertionGradientAccumulation) {
  const std::string m = error_of(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 0})");
  EXPECT_TRUE(contains(m, "Gradient accumulation steps: 0 has to be greater than 0")) << m;
  // Inferred: GAS = (4 // 8) // 1 = 0.
  const std::string inferred = error_of(R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 8})");
  EXPECT_TRUE(contains(inferred, "Gradient accumulation steps: 0 has to be greater than 0")) << inferred;
}

TEST(BatchSize, AssertionProductWithFloorDivision) {
  // docs/batch.md §2's example: TBS=32, MBS=3, world=2 -> GAS=5 -> "32 != 3 * 5 * 2".
  const std::string m = error_of(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 3})", 2);
  EXPECT_TRUE(contains(m,
                       "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                       "gradient_acc_step * world_size 32 != 3 * 5 * 2"))
      << m;
  EXPECT_TRUE(contains(m, "set train_batch_size to 30")) << m;
}

TEST(BatchSize, ProductMismatchSuggestsAccumulationSteps) {
  const std::string m = error_of(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})", 2);
  EXPECT_TRUE(contains(m, "64 != 4 * 4 * 2")) << m;
  EXPECT_TRUE(contains(m, "gradient_accumulation_steps to 8")) << m;
  EXPECT_TRUE(contains(m, "train_micro_batch_size_per_gpu to 8")) << m;
}

TEST(BatchSize, SequenceParallelShrinksDataParallelWorld) {
  const DsConfig c = parse(R"({"train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2})", 8);
  EXPECT_EQ(c.data_parallel_world_size, 4);
  EXPECT_EQ(c.train_batch_size, 8);
  const std::string m = error_of(R"({"train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 3})", 8);
  EXPECT_TRUE(contains(m, "sequence_parallel_size is 3")) << m;
}

TEST(BatchSize, StringValuesAreErrors) {
  // DeepSpeed applies no coercion at the top level: "32" fails its arithmetic with a TypeError.
  const std::string m = error_of(R"({"train_batch_size": "32"})");
  EXPECT_TRUE(contains(m, "train_batch_size")) << m;
  EXPECT_TRUE(contains(m, "\"32\"")) << m;
  EXPECT_TRUE(contains(m, "TypeError")) << m;
  EXPECT_TRUE(contains(error_of(R"({"train_micro_batch_size_per_gpu": 2.5})"), "train_micro_batch_size_per_gpu"));
}

TEST(BatchSize, PythonFloorDivision) {
  EXPECT_EQ(floor_div(7, 2), 3);
  EXPECT_EQ(floor_div(-7, 2), -4);
  EXPECT_EQ(floor_div(7, -2), -4);
  EXPECT_EQ(floor_div(-8, 2), -4);
}

TEST(BatchSize, DirectFunction) {
  const BatchSizes b = resolve_batch_sizes(std::nullopt, 4, 8, 16);
  EXPECT_EQ(b.train_batch_size, 512);
  EXPECT_EQ(b.gradient_accumulation_steps, 8);
}

}  // namespace
}  // namespace dstrain::config
