// Type coercion, docs/config.md §4 (regime B, pydantic lax mode) — every cell of the table — and the
// regime-A rules (no coercion in DeepSpeed: crash -> our error; silent misread -> warning).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string zero(const std::string& body) { return R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {)" + body + "}}"; }

TEST(Coercion, IntegerFieldAcceptsIntegralFloat) {
  EXPECT_EQ(parse(zero(R"("reduce_bucket_size": 5e8)")).zero_optimization.reduce_bucket_size, 500000000);
}

TEST(Coercion, IntegerFieldRejectsFractionalFloat) {
  EXPECT_TRUE(contains(error_of(zero(R"("reduce_bucket_size": 1.5)")), "zero_optimization.reduce_bucket_size"));
  // DeepSpeed issue #6525: HF computing 0.9 * h^2 as a float.
  const std::string m = error_of(zero(R"("stage3_prefetch_bucket_size": 15099494.4)"));
  EXPECT_TRUE(contains(m, "zero_optimization.stage3_prefetch_bucket_size")) << m;
  EXPECT_TRUE(contains(m, "15099494.4")) << m;
  EXPECT_TRUE(contains(m, "integer")) << m;
}

TEST(Coercion, IntegerFieldAcceptsDigitString) { EXPECT_EQ(parse(zero(R"("reduce_bucket_size": "500")")).zero_optimization.reduce_bucket_size, 500); }

TEST(Coercion, IntegerFieldRejectsExponentString) {
  const std::string m = error_of(zero(R"("reduce_bucket_size": "5e8")"));
  EXPECT_TRUE(contains(m, "zero_optimization.reduce_bucket_size")) << m;
  EXPECT_TRUE(contains(m, "\"5e8\"")) << m;
}

TEST(Coercion, IntegerFieldGeZero) {
  const std::string m = error_of(zero(R"("reduce_bucket_size": -1)"));
  EXPECT_TRUE(contains(m, "zero_optimization.reduce_bucket_size")) << m;
  EXPECT_TRUE(contains(m, ">= 0")) << m;
}

TEST(Coercion, IntegerFieldNullIsErrorUnlessOptional) {
  EXPECT_TRUE(contains(error_of(zero(R"("reduce_bucket_size": null)")), "zero_optimization.reduce_bucket_size"));
  // overlap_comm is Optional[bool] in DeepSpeed: null is its default (None -> true iff stage 3).
  EXPECT_TRUE(parse(zero(R"("stage": 3, "overlap_comm": null)")).zero_optimization.overlap_comm);
}

TEST(Coercion, IntegerFieldTrueIsOne) { EXPECT_EQ(parse(zero(R"("reduce_bucket_size": true)")).zero_optimization.reduce_bucket_size, 1); }

TEST(Coercion, BoolFieldTruthyInputs) {
  for (const char* v : {R"("true")", R"("yes")", R"("on")", R"("1")", "1", "true"}) {
    const DsConfig c = parse(zero(std::string(R"("contiguous_gradients": false, "reduce_scatter": )") + v));
    EXPECT_TRUE(c.zero_optimization.reduce_scatter) << v;
  }
}

TEST(Coercion, BoolFieldFalsyInputs) {
  for (const char* v : {R"("false")", R"("no")", R"("off")", R"("0")", "0", "false"}) {
    const DsConfig c = parse(zero(std::string(R"("reduce_scatter": )") + v));
    EXPECT_FALSE(c.zero_optimization.reduce_scatter) << v;
  }
}

TEST(Coercion, BoolFieldRejects) {
  for (const char* v : {R"("maybe")", "2", "null"}) {
    const std::string m = error_of(zero(std::string(R"("reduce_scatter": )") + v));
    EXPECT_TRUE(contains(m, "zero_optimization.reduce_scatter")) << v << ": " << m;
    EXPECT_TRUE(contains(m, "boolean")) << m;
  }
}

TEST(Coercion, StageEnum) {
  EXPECT_EQ(parse(zero(R"("stage": 2.0)")).zero_optimization.stage, 2);
  EXPECT_EQ(parse(zero(R"("stage": "2")")).zero_optimization.stage, 2);
  EXPECT_EQ(parse(zero(R"("stage": true)")).zero_optimization.stage, 1);
  EXPECT_TRUE(contains(error_of(zero(R"("stage": null)")), "zero_optimization.stage"));
  const std::string m = error_of(zero(R"("stage": 4)"));
  EXPECT_TRUE(contains(m, "zero_optimization.stage")) << m;
  EXPECT_TRUE(contains(m, "0, 1, 2 or 3")) << m;
}

TEST(Coercion, OffloadDeviceIsCaseSensitive) {
  const std::string m = error_of(zero(R"("stage": 3, "offload_param": {"device": "CPU"})"));
  EXPECT_TRUE(contains(m, "zero_optimization.offload_param.device")) << m;
  EXPECT_TRUE(contains(m, "\"CPU\"")) << m;
  EXPECT_TRUE(contains(m, "\"none\", \"cpu\", \"nvme\"")) << m;
}

TEST(Coercion, RegimeAStringFalseIsTruthyWithWarning) {
  // DeepSpeed reads flops_profiler with dict.get: "false" is a non-empty string, hence true.
  const DsConfig c = parse(R"({"train_batch_size": 1, "flops_profiler": {"enabled": "false"}})");
  EXPECT_TRUE(c.flops_profiler.enabled);
  const Warning* w = find_warning(c, "flops_profiler.enabled", "non-empty string");
  ASSERT_NE(w, nullptr);
}

TEST(Coercion, RegimeARejectsWhatDeepSpeedWouldCrashOn) {
  const std::string m = error_of(R"({"train_batch_size": 1, "gradient_clipping": "1.0"})");
  EXPECT_TRUE(contains(m, "gradient_clipping")) << m;
  EXPECT_TRUE(contains(m, "a number")) << m;
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": 1, "aio": {"queue_depth": "8"}})"), "aio.queue_depth"));
}

TEST(Coercion, RegimeANullIsNotTheDefault) {
  const std::string m = error_of(R"({"train_batch_size": 1, "gradient_clipping": null})");
  EXPECT_TRUE(contains(m, "gradient_clipping")) << m;
  EXPECT_TRUE(contains(m, "None")) << m;
  // steps_per_print's default is None already.
  EXPECT_FALSE(parse(R"({"train_batch_size": 1, "steps_per_print": null})").steps_per_print.has_value());
}

}  // namespace
}  // namespace dstrain::config
