// fp16 / bf16 / bfloat16 / amp / torch_autocast / data_types (docs/precision.md §1–§2, §8–§9).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string with(const std::string& body) { return R"({"train_batch_size": 1, )" + body + "}"; }

TEST(Fp16Config, Defaults) {
  const Fp16Config f = parse(with(R"("fp16": {"enabled": true})")).fp16;
  EXPECT_TRUE(f.enabled);
  EXPECT_FALSE(f.auto_cast);
  EXPECT_DOUBLE_EQ(f.loss_scale, 0.0);
  EXPECT_TRUE(f.dynamic());
  EXPECT_EQ(f.initial_scale_power, 16);
  EXPECT_EQ(f.loss_scale_window, 1000);
  EXPECT_EQ(f.hysteresis, 2);
  EXPECT_FALSE(f.consecutive_hysteresis);
  EXPECT_EQ(f.min_loss_scale, 1);
  EXPECT_FALSE(f.fp16_master_weights_and_grads);
  EXPECT_FALSE(parse(with(R"("fp16": {})")).fp16.enabled);
  EXPECT_FALSE(parse(R"({"train_batch_size": 1})").fp16.enabled);
}

TEST(Fp16Config, UnknownKeyIsError) {
  const std::string m = error_of(with(R"("fp16": {"enabled": true, "opt_level": "O2"})"));
  EXPECT_TRUE(contains(m, "fp16.opt_level")) << m;
  EXPECT_TRUE(contains(m, "Extra inputs are not permitted")) << m;
}

TEST(Fp16Config, LossScaleValidation) {
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "loss_scale": -1})")), "fp16.loss_scale"));
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "loss_scale": true})")), "not a boolean"));
  const Fp16Config f = parse(with(R"("fp16": {"enabled": true, "loss_scale": 128})")).fp16;
  EXPECT_FALSE(f.dynamic());
  EXPECT_DOUBLE_EQ(f.loss_scale, 128.0);
}

TEST(Fp16Config, DynamicWindowAndMinScaleMustBePositive) {
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "loss_scale_window": 0})")), "fp16.loss_scale_window is 0"));
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "min_loss_scale": 0})")), "fp16.min_loss_scale is 0"));
  // Fractional min_loss_scale is rejected (integer field since v0.17.1).
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "min_loss_scale": 0.5})")), "fp16.min_loss_scale"));
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true, "min_loss_scale": 1e-4})")), "fp16.min_loss_scale"));
  // Static scaling: window/min are not used, so not checked.
  EXPECT_EQ(parse(with(R"("fp16": {"enabled": true, "loss_scale": 8, "loss_scale_window": 0})")).fp16.loss_scale_window, 0);
}

TEST(Fp16Config, MasterWeightsNeedZero) {
  EXPECT_TRUE(
      contains(error_of(with(R"("fp16": {"enabled": true, "fp16_master_weights_and_grads": true})")), "requires zero_optimization.stage 1, 2 or 3"));
}

TEST(Bf16Config, DefaultsAndCheckGradOverflow) {
  const Bf16Config b = parse(with(R"("bf16": {"enabled": true})")).bf16;
  EXPECT_TRUE(b.enabled);
  EXPECT_FALSE(b.immediate_grad_update);
  EXPECT_TRUE(b.check_grad_overflow);  // true since v0.19.3
  EXPECT_FALSE(b.bf16_master_weights_and_grads);
  EXPECT_FALSE(b.bf16_optimizer_states);
  EXPECT_EQ(b.source_key, "bf16");
}

TEST(Bf16Config, CheckOverflowIsNotAField) {
  const std::string m = error_of(with(R"("bf16": {"enabled": true, "check_overflow": false})"));
  EXPECT_TRUE(contains(m, "bf16.check_overflow")) << m;
  EXPECT_TRUE(contains(m, "check_grad_overflow")) << m;
}

TEST(Bf16Config, LegacyBfloat16KeyUsedOnlyWithoutBf16) {
  const DsConfig legacy = parse(with(R"("bfloat16": {"enabled": true})"));
  EXPECT_TRUE(legacy.bf16.enabled);
  EXPECT_EQ(legacy.bf16.source_key, "bfloat16");
  EXPECT_TRUE(legacy.to_json()["bf16"]["enabled"]);
  // bf16 wins; nothing is merged from bfloat16.
  const DsConfig both = parse(with(R"("bf16": {"enabled": false}, "bfloat16": {"enabled": true})"));
  EXPECT_FALSE(both.bf16.enabled);
  EXPECT_NE(find_warning(both, "bfloat16", "never merged"), nullptr);
  // bf16: null falls back to bfloat16.
  EXPECT_TRUE(parse(with(R"("bf16": null, "bfloat16": {"enabled": true})")).bf16.enabled);
}

TEST(Precision, Fp16AndBf16Exclusive) {
  const std::string m = error_of(with(R"("fp16": {"enabled": true}, "bf16": {"enabled": true})"));
  EXPECT_TRUE(contains(m, "bfloat16 and fp16 modes cannot be simultaneously enabled")) << m;
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true}, "bfloat16": {"enabled": true})")), "cannot be simultaneously enabled"));
  EXPECT_EQ(parse(with(R"("fp16": {"enabled": true}, "bf16": {"enabled": false})")).precision(), Precision::fp16);
  EXPECT_EQ(parse(with(R"("bf16": {"enabled": true})")).precision(), Precision::bf16);
  EXPECT_EQ(parse(with(R"("fp16": {"enabled": false})")).precision(), Precision::fp32);
}

TEST(Precision, Bf16MasterWeightsWithoutZeroAreIgnoredWithWarning) {
  const DsConfig c = parse(with(R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
                                            "bf16_optimizer_states": true})"));
  EXPECT_FALSE(c.bf16.bf16_master_weights_and_grads);
  EXPECT_FALSE(c.bf16.bf16_optimizer_states);
  EXPECT_NE(find_warning(c, "bf16.bf16_master_weights_and_grads", "need ZeRO stage 1, 2 or 3"), nullptr);
}

TEST(Precision, Bf16OptimizerStatesNeedMasterWeights) {
  const std::string m = error_of(with(R"("zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"},
                                        "bf16": {"enabled": true, "bf16_optimizer_states": true})"));
  EXPECT_TRUE(contains(m, "bf16_master_weights_and_grads")) << m;
  const DsConfig ok = parse(with(R"("zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam"},
      "bf16": {"enabled": true, "bf16_optimizer_states": true, "bf16_master_weights_and_grads": true})"));
  EXPECT_TRUE(ok.bf16.bf16_optimizer_states);
}

TEST(Precision, AmpIsWarnedAndIncompatible) {
  const DsConfig c = parse(with(R"("amp": {"enabled": true, "opt_level": "O1"})"));
  EXPECT_TRUE(c.amp.enabled);
  EXPECT_EQ(c.amp.params["opt_level"], "O1");
  EXPECT_NE(find_warning(c, "amp", "Apex"), nullptr);
  EXPECT_TRUE(contains(error_of(with(R"("amp": {"enabled": true}, "optimizer": {"type": "Adam"},
                                       "zero_optimization": {"stage": 1})")),
                       "Amp and ZeRO are not currently compatible"));
  EXPECT_TRUE(contains(error_of(with(R"("amp": {"enabled": true}, "fp16": {"enabled": true})")), "NotImplementedError"));
  EXPECT_EQ(find_warning(parse(with(R"("amp": {"enabled": false})")), "amp"), nullptr);
}

TEST(Precision, TorchAutocast) {
  const DsConfig c = parse(with(R"("torch_autocast": {"enabled": true, "dtype": "bf16"})"));
  EXPECT_EQ(c.torch_autocast.dtype, "bfloat16");
  EXPECT_NE(find_warning(c, "torch_autocast", "does not provide"), nullptr);
  EXPECT_FALSE(parse(with(R"("torch_autocast": {})")).torch_autocast.dtype.has_value());
  EXPECT_TRUE(contains(error_of(with(R"("torch_autocast": {"dtype": "int8"})")), "torch_autocast.dtype"));
  EXPECT_TRUE(contains(error_of(with(R"("torch_autocast": {"lower_precision_safe_modules": [1]})")), "lower_precision_safe_modules"));
}

TEST(Precision, DataTypes) {
  const DsConfig c = parse(with(R"("bf16": {"enabled": true}, "optimizer": {"type": "Adam"},
                                   "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"})"));
  EXPECT_EQ(c.data_types.grad_accum_dtype, "fp32");
  // No ZeRO + bf16 + fp32 accumulation: NotImplementedError since v0.18.5.
  EXPECT_TRUE(contains(error_of(with(R"("bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"})")), "NotImplementedError"));
  EXPECT_TRUE(contains(error_of(with(R"("fp16": {"enabled": true}, "data_types": {"param_dtype": "bf16"})")), "data_types.param_dtype"));
  EXPECT_TRUE(contains(error_of(with(R"("data_types": {"grad_accum_dtype": "fp8"})")), "data_types.grad_accum_dtype"));
}

}  // namespace
}  // namespace dstrain::config
