// elasticity: DeepSpeed's batch computation (deepspeed/elasticity/elasticity.py). Expected values
// are those asserted by DeepSpeed's own tests/unit/elasticity/test_elastic.py.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

const char* kBase = R"("elasticity": {"enabled": true, "max_train_batch_size": 10000,
    "micro_batch_sizes": [8, 12, 16, 17], "min_gpus": 32, "max_gpus": 1500, "min_time": 20, "version": 0.1})";

ElasticityConfig base_config() {
  ElasticityConfig c;
  c.enabled = true;
  c.max_train_batch_size = 10000;
  c.micro_batch_sizes = {8, 12, 16, 17};
  c.min_gpus = 32;
  c.max_gpus = 1500;
  c.min_time = 20;
  c.version = 0.1;
  return c;
}

TEST(Elasticity, Basic10k) {
  const ElasticBatch b = compute_elastic_batch(base_config(), 64);
  EXPECT_EQ(b.train_batch_size, 9792);
  EXPECT_EQ(b.valid_world_sizes.size(), 23u);
  for (std::int64_t g : b.valid_world_sizes) EXPECT_EQ(b.train_batch_size % g, 0) << g;
  EXPECT_EQ(b.micro_batch_size, 17);  // test_valid_world_size
  EXPECT_EQ(b.gradient_accumulation_steps, 9792 / (17 * 64));
}

TEST(Elasticity, InvalidWorldSize) {
  const std::string m = error_of(std::string("{") + kBase + "}", 128);
  EXPECT_TRUE(contains(m, "World size (128) is not valid with the current list of valid GPU counts")) << m;
}

TEST(Elasticity, OverridesTheBatchTriple) {
  const DsConfig c = parse(std::string("{") + kBase + "}", 64);
  EXPECT_EQ(c.train_batch_size, 9792);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 17);
  EXPECT_EQ(c.gradient_accumulation_steps, 9);
  EXPECT_TRUE(c.elasticity.enabled);
}

TEST(Elasticity, ProperMicroBatch) {
  ElasticityConfig c = base_config();
  c.max_train_batch_size = 32;
  c.micro_batch_sizes = {1, 2, 3, 7};
  c.min_gpus = 1;
  EXPECT_EQ(compute_elastic_batch(c, 4).micro_batch_size, 3);
}

TEST(Elasticity, BatchWithinMax) {
  ElasticityConfig c = base_config();
  c.max_train_batch_size = 100;
  c.micro_batch_sizes = {8, 10, 12};
  c.min_gpus = 1;
  const ElasticBatch b = compute_elastic_batch(c, compute_elastic_batch(c, 1).valid_world_sizes.front());
  EXPECT_LE(b.train_batch_size, 100);
}

TEST(Elasticity, BatchKeysOutsideElasticityAreRejectedUnlessIgnored) {
  const std::string with_tbs = R"({"train_batch_size": 2, "elasticity": {"enabled": true, "max_train_batch_size": 4,
      "micro_batch_sizes": [1, 2, 3, 4], "min_gpus": 1, "max_gpus": 4, "min_time": 20, "version": 0.1}})";
  const std::string m = error_of(with_tbs, 2);
  EXPECT_TRUE(contains(m, "One or more batch related parameters were found in your ds_config")) << m;
  EXPECT_TRUE(contains(m, "ignore_non_elastic_batch_info")) << m;
  const DsConfig ok = parse(R"({"train_batch_size": 2, "elasticity": {"enabled": true, "max_train_batch_size": 4,
      "micro_batch_sizes": [1, 2, 3, 4], "min_gpus": 1, "max_gpus": 4, "version": 0.1,
      "ignore_non_elastic_batch_info": true}})",
                            2);
  EXPECT_EQ(ok.train_batch_size % 2, 0);
  EXPECT_NE(find_warning(ok, "elasticity", "replaced by the elastic values"), nullptr);
}

TEST(Elasticity, ConfigValidation) {
  EXPECT_TRUE(contains(error_of(R"({"elasticity": {"enabled": true}})"), "Elasticity config missing max_train_batch_size"));
  EXPECT_TRUE(contains(error_of(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100}})"), "Elasticity config missing micro_batch_sizes"));
  for (const char* bad : {"[1, 4, -1, 2, -10]", "5", R"(["a", null, 0.5])", "[2, 0.5, 4]"}) {
    const std::string m = error_of(std::string(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100,
        "micro_batch_sizes": )") + bad +
                                   "}}");
    EXPECT_TRUE(contains(m, "elasticity.micro_batch_sizes")) << bad << ": " << m;
  }
  EXPECT_TRUE(contains(error_of(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100,
      "micro_batch_sizes": [2], "min_gpus": -1}})"),
                       "Elasticity min/max gpus must be > 0"));
  EXPECT_TRUE(contains(error_of(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100,
      "micro_batch_sizes": [2], "version": 0.3}})"),
                       "elasticity.version"));
  EXPECT_TRUE(contains(error_of(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100,
      "micro_batch_sizes": [2], "model_parallel_size": 4, "num_gpus_per_node": 8}})"),
                       "elasticity.model_parallel_size"));
}

TEST(Elasticity, Version02FitsTheCurrentWorld) {
  // Version 0.2 (the default) accepts any world size with one GPU per node: when the elastic sizes
  // do not include it, the batch is the largest multiple of micro * world within the maximum.
  const DsConfig c = parse(R"({"elasticity": {"enabled": true, "max_train_batch_size": 100, "micro_batch_sizes": [3]}})", 7);
  EXPECT_EQ(c.train_batch_size % 21, 0);
  EXPECT_LE(c.train_batch_size, 100);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 3);
}

TEST(Elasticity, DisabledIsIgnored) {
  const DsConfig c = parse(R"({"train_batch_size": 4, "elasticity": {"enabled": false}})");
  EXPECT_FALSE(c.elasticity.enabled);
  EXPECT_EQ(c.train_batch_size, 4);
  EXPECT_EQ(c.elasticity.max_train_batch_size, 2000);
  EXPECT_EQ(c.elasticity.micro_batch_sizes, (std::vector<std::int64_t>{2, 4, 6}));
  EXPECT_DOUBLE_EQ(c.elasticity.version, 0.2);
}

}  // namespace
}  // namespace dstrain::config
