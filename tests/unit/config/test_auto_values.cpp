// "auto" resolution (docs/config.md §6): the HF mapping, the record of each resolution, and
// errors naming the key and the option when nothing derives the value.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::parse;

bool logged(const DsConfig& c, const std::string& text) {
  for (const auto& r : c.resolved_autos)
    if (contains(r, text)) return true;
  return false;
}

TEST(AutoValues, BatchTripleFromMicroBatchGasAndWorld) {
  AutoValues a;
  a.train_micro_batch_size_per_gpu = 4;
  a.gradient_accumulation_steps = 2;
  const DsConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                               "gradient_accumulation_steps": "auto"})",
                           8, a);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.train_batch_size, 64);  // world * micro * GAS
  EXPECT_TRUE(logged(c, "train_micro_batch_size_per_gpu: auto -> 4 (from --micro-batch-size)"));
  EXPECT_TRUE(logged(c, "train_batch_size: auto -> 64"));
}

TEST(AutoValues, TrainBatchSizeUsesDataParallelWorld) {
  AutoValues a;
  a.train_micro_batch_size_per_gpu = 2;
  const DsConfig c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                               "sequence_parallel_size": 4})",
                           8, a);
  EXPECT_EQ(c.train_batch_size, 4);  // 2 * 1 * (8 / 4)
}

TEST(AutoValues, MissingOptionNamesKeyAndOption) {
  const std::string m = error_of(R"({"train_micro_batch_size_per_gpu": "auto"})");
  EXPECT_TRUE(contains(m, "train_micro_batch_size_per_gpu is \"auto\"")) << m;
  EXPECT_TRUE(contains(m, "--micro-batch-size")) << m;
  const std::string clip = error_of(R"({"train_batch_size": 8, "gradient_clipping": "auto"})");
  EXPECT_TRUE(contains(clip, "gradient_clipping is \"auto\"")) << clip;
  EXPECT_TRUE(contains(clip, "--gradient-clipping")) << clip;
  EXPECT_FALSE(contains(clip, "AutoValues::")) << clip;  // the flag a user types, not a member name
}

TEST(AutoValues, StageAutoIsErrorNotSilentZero) {
  const std::string m = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto"}})");
  EXPECT_TRUE(contains(m,
                       "zero_optimization.stage is \"auto\": nothing in dstrain derives it (DeepSpeed would "
                       "silently use its default 0; HF Accelerate fills it from its zero_stage setting)"))
      << m;
  EXPECT_TRUE(contains(m, "0, 1, 2 or 3")) << m;
  // Accelerate configs: say where Accelerate would have taken the value.
  const std::string save = error_of(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
      "stage3_gather_16bit_weights_on_model_save": "auto"}})");
  EXPECT_TRUE(contains(save, "zero_optimization.stage3_gather_16bit_weights_on_model_save is \"auto\"")) << save;
  EXPECT_TRUE(contains(save, "zero3_save_16bit_model")) << save;
  // Regime A: DeepSpeed would crash.
  const std::string a = error_of(R"({"train_batch_size": 8, "aio": {"block_size": "auto"}})");
  EXPECT_TRUE(contains(a, "aio.block_size is \"auto\"")) << a;
}

TEST(AutoValues, ZeroSizesFromHiddenSize) {
  AutoValues a;
  a.hidden_size = 4096;
  const DsConfig c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})",
                           1, a);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 4096LL * 4096);
  EXPECT_EQ(c.zero_optimization.prefetch_bucket_size, 15099494);  // int(0.9 * 4096^2) — an int (issue #6525)
  EXPECT_EQ(c.zero_optimization.param_persistence_threshold, 40960);
  EXPECT_TRUE(logged(c, "zero_optimization.stage3_prefetch_bucket_size: auto -> 15099494"));
  const std::string m = error_of(R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": "auto"}})");
  EXPECT_TRUE(contains(m, "hidden size")) << m;
}

TEST(AutoValues, OptimizerAndSchedulerParams) {
  AutoValues a;
  a.lr = 2e-4;
  a.eps = 1e-6;
  a.weight_decay = 0.1;
  a.betas = std::make_pair(0.9, 0.95);
  a.total_num_steps = 10000;
  a.warmup_num_steps = 500;
  const DsConfig c = parse(R"({"train_batch_size": 8,
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                    "warmup_num_steps": "auto", "total_num_steps": "auto"}}})",
                           1, a);
  EXPECT_DOUBLE_EQ(c.optimizer.params.lr, 2e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.params.betas.second, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.params.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.params.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_max_lr, 2e-4);
  EXPECT_EQ(c.scheduler.params.warmup_num_steps, 500);
  EXPECT_EQ(c.scheduler.params.total_num_steps, 10000);
  EXPECT_EQ(c.resolved_autos.size(), 8u);
}

TEST(AutoValues, WarmupMinLrAlwaysDerivable) {
  const DsConfig c = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}}})");
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_max_lr, 1e-3);  // from optimizer.params.lr
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}})"),
                       "scheduler.params.warmup_num_steps is \"auto\""));
}

TEST(AutoValues, ExplicitValueDifferingFromOptionIsWarned) {
  AutoValues a;
  a.train_micro_batch_size_per_gpu = 8;
  a.lr = 1e-3;
  const DsConfig c = parse(R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})", 1, a);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);  // the config wins
  EXPECT_NE(testing::find_warning(c, "train_micro_batch_size_per_gpu", "--micro-batch-size gives 8"), nullptr);
  EXPECT_EQ(testing::find_warning(c, "optimizer.params.lr"), nullptr);  // same value: nothing to say
}

TEST(AutoValues, PrecisionFillsEnabled) {
  AutoValues a;
  a.precision = "bf16";
  const DsConfig c = parse(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})", 1, a);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_TRUE(c.bf16.enabled);
  const std::string m = error_of(R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})");
  EXPECT_TRUE(contains(m, "fp16.enabled is \"auto\"")) << m;
  EXPECT_TRUE(contains(m, "--precision")) << m;
}

}  // namespace
}  // namespace dstrain::config
