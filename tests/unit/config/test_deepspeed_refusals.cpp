// What DeepSpeed refuses (or accepts) and dstrain must refuse (or accept) the same way, before
// step 1 (docs/config.md, docs/zero.md): the gradient-reduction keys on the reduce-scatter paths,
// true-integer keys written as floats, the `value in [True, False]` check of
// checkpoint.parallel_write.pipeline_stage.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "config_schema/hjson_reader.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string cfg(const std::string& body) {
  return R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, )" + body + "}";
}
std::string zero(int stage, bool reduce_scatter, const std::string& top) {
  return cfg(fmt::format(R"("zero_optimization": {{"stage": {}, "reduce_scatter": {}}}, {})", stage, reduce_scatter ? "true" : "false", top));
}

// stage_1_and_2.py: "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2 with reduce
// scatter enabled" / "pre-scale gradients is not yet supported with ZeRO-2 ..."; stage3.py the same
// for ZeRO-3 (whatever gradient_allreduce_op says).
TEST(GradientReductionConfig, ReduceScatterPathsRefuseWhatDeepSpeedAsserts) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE(stage);
    const std::string p = error_of(zero(stage, true, R"("gradient_predivide_factor": 2.0)"), 4);
    EXPECT_TRUE(contains(p, fmt::format("gradient_predivide_factor != 1.0 is not yet supported with ZeRO-{} with reduce scatter enabled", stage)))
        << p;
    const std::string s = error_of(zero(stage, true, R"("prescale_gradients": true)"), 4);
    EXPECT_TRUE(contains(s, fmt::format("pre-scale gradients is not yet supported with ZeRO-{} with reduce scatter enabled", stage))) << s;
    // reduce_scatter false takes DeepSpeed's all-reduce path, where both act.
    EXPECT_NO_THROW(parse(zero(stage, false, R"("gradient_predivide_factor": 2.0)"), 4));
    EXPECT_NO_THROW(parse(zero(stage, false, R"("prescale_gradients": true)"), 4));
  }
  // ZeRO-2 asserts only when averaging: with "sum" the keys are not read.
  EXPECT_NO_THROW(parse(zero(2, true, R"("gradient_predivide_factor": 2.0, "gradient_allreduce_op": "sum")"), 4));
  // Stage 0 and stage 1 never assert.
  EXPECT_NO_THROW(parse(zero(0, true, R"("gradient_predivide_factor": 2.0, "prescale_gradients": true)"), 4));
  const DsConfig one = parse(zero(1, true, R"("gradient_predivide_factor": 2.0)"), 4);
  EXPECT_NE(find_warning(one, "gradient_predivide_factor", "no effect at zero_optimization.stage 1"), nullptr);
  EXPECT_EQ(find_warning(parse(zero(1, false, R"("gradient_predivide_factor": 2.0)"), 4), "gradient_predivide_factor"), nullptr);
}

TEST(GradientReductionConfig, PredivideFactorMustBePositive) {
  for (const char* v : {"0", "-2", "0.0"}) {
    const std::string e = error_of(cfg(fmt::format(R"("gradient_predivide_factor": {})", v)));
    EXPECT_TRUE(contains(e, "gradient_predivide_factor")) << e;
    EXPECT_TRUE(contains(e, "positive finite")) << e;
  }
  // ZeRO-3's all-reduce path with p == W would divide twice (DeepSpeed skips the multiplication
  // back when p == W): refused with the figure.
  const std::string e = error_of(zero(3, false, R"("gradient_predivide_factor": 4.0)"), 4);
  EXPECT_TRUE(contains(e, "4 times too small")) << e;
  EXPECT_NO_THROW(parse(zero(3, false, R"("gradient_predivide_factor": 4.0)"), 2));
}

// lr_schedules.py: `not isinstance(x, int)` for LRRangeTest's step size and (since 0.19.3) the
// warm-up steps of WarmupLR / WarmupDecayLR / WarmupCosineLR; elasticity checks its micro batches.
// A JSON 1000 is an int, 1000.0 and 1e3 are floats: the reader keeps them apart.
TEST(IntegerOnlyKeys, WholeFloatsAreRefusedAsDeepSpeedRefusesThem) {
  const auto sched = [](const std::string& type, const std::string& params) {
    return cfg(fmt::format(R"("scheduler": {{"type": "{}", "params": {{{}}}}})", type, params));
  };
  for (const char* type : {"WarmupLR", "WarmupDecayLR"}) {
    SCOPED_TRACE(type);
    const std::string total = std::string(type) == "WarmupDecayLR" ? R"(, "total_num_steps": 5000)" : "";
    EXPECT_EQ(parse(sched(type, R"("warmup_num_steps": 1000)" + total)).scheduler.params.warmup_num_steps, 1000);
    for (const char* v : {"1e3", "1000.0"}) {
      const std::string e = error_of(sched(type, fmt::format(R"("warmup_num_steps": {})", v) + total));
      EXPECT_TRUE(contains(e, "scheduler.params.warmup_num_steps")) << e;
    }
  }
  EXPECT_EQ(parse(sched("LRRangeTest", R"("lr_range_test_step_size": 1000)")).scheduler.params.lr_range_test_step_size, 1000);
  for (const char* v : {"1e3", "1000.0"}) {
    const std::string e = error_of(sched("LRRangeTest", fmt::format(R"("lr_range_test_step_size": {})", v)));
    EXPECT_TRUE(contains(e, "lr_range_test_step_size must be a positive integer")) << e;
  }
  // Integer keys DeepSpeed does not check that way still take a whole float (its arithmetic works).
  EXPECT_EQ(parse(sched("OneCycle", R"("cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": 1e3)"))
                .scheduler.params.cycle_first_step_size,
            1000);
  const std::string el = error_of(
      R"({"elasticity": {"enabled": true, "max_train_batch_size": 64, "micro_batch_sizes": [2.0, 4], "min_gpus": 1, "max_gpus": 4, "version": 0.1}})");
  EXPECT_TRUE(contains(el, "Elasticity expected micro_batch_sizes to only contain a list of integers")) << el;
}

// config.py: `if par_write_pipeline in [True, False]`, where 1 == True and 0 == False in Python.
// A config FILE goes through hjson in DeepSpeed (DeepSpeedConfig: hjson.load), and hjson-py turns
// a whole float below 1e10 into an int (`if int(res) == res and abs(res) < 1e10: res = int(res)`),
// so DeepSpeed accepts `warmup_num_steps: 1e3` from a file and refuses it only from a dict (json.load,
// as the HF Trainer passes it). dstrain reads files and command-line text the same way: accepted.
TEST(IntegerOnlyKeys, AConfigFileCollapsesWholeFloatsAsHjsonPyDoes) {
  const Json tree = parse_hjson(R"({"train_batch_size": 1, "optimizer": {"type": "Adam"},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e3}}})");
  ConfigOptions o;
  EXPECT_EQ(parse_ds_config(tree, o).scheduler.params.warmup_num_steps, 1000);
}

TEST(ParallelWrite, PipelineStageAcceptsWhatPythonsInTrueFalseAccepts) {
  const auto pw = [](const std::string& v) { return cfg(R"("checkpoint": {"parallel_write": {"pipeline_stage": )" + v + "}}"); };
  EXPECT_TRUE(parse(pw("true")).checkpoint.parallel_write_pipeline_stage);
  EXPECT_TRUE(parse(pw("1")).checkpoint.parallel_write_pipeline_stage);
  EXPECT_TRUE(parse(pw("1.0")).checkpoint.parallel_write_pipeline_stage);
  EXPECT_FALSE(parse(pw("0")).checkpoint.parallel_write_pipeline_stage);
  EXPECT_FALSE(parse(pw("false")).checkpoint.parallel_write_pipeline_stage);
  for (const char* bad : {"2", "\"true\"", "0.5", "null", "[]"}) {
    const std::string e = error_of(pw(bad));
    EXPECT_TRUE(contains(e, "checkpoint::parallel_write::pipeline_stage value of")) << bad << ": " << e;
    EXPECT_TRUE(contains(e, "expecting: true or false")) << e;
  }
}

// The config layer's notes must not contradict what `dstrain train` does: like DeepSpeed, it ignores
// offload blocks below their stage (engine/engine.cpp; test_optimizer_offload and test_param_offload
// check the run equals the run without them), so the stage-0 / non-stage-3 notes say so.
TEST(OffloadNotes, SayTrainIgnoresTheBlockAsDeepSpeedDoes) {
  const DsConfig opt = parse(cfg(R"("zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}})"));
  const Warning* w = find_warning(opt, "zero_optimization.offload_optimizer", "DeepSpeed ignores it at stage 0");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(contains(w->message, "and so does dstrain")) << w->message;
  EXPECT_FALSE(contains(w->message, "refuses")) << w->message;
  const DsConfig par = parse(cfg(R"("zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}})"));
  const Warning* p = find_warning(par, "zero_optimization.offload_param", "only acts at stage 3");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(contains(p->message, "and so does dstrain")) << p->message;
  EXPECT_FALSE(contains(p->message, "refuses")) << p->message;
}

TEST(ActivationCheckpointingSection, PresenceIsRecorded) {
  EXPECT_FALSE(parse(cfg(R"("steps_per_print": 1)")).activation_checkpointing.present);
  EXPECT_TRUE(parse(cfg(R"("activation_checkpointing": {})")).activation_checkpointing.present);
}

}  // namespace
}  // namespace dstrain::config
