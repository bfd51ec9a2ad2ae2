// Lamb at ZeRO stages 1-3 (zero_allow_untested_optimizer, as DeepSpeed requires): each tensor's
// trust ratio from its whole norms, the partitions' partial sums all-reduced (engine/optim/lamb_exact.h),
// so W ranks train as stage 0 on one rank with the same global batch — within fp32 reduction-order
// differences of the gradients, the tolerance of the ZeRO equivalence matrix. Also stage 0 with
// sub-groups that cut tensors. Per-piece ratios (the trust ratio of each partition's slice, what a
// flattened partition gives) would differ by far more (docs/optimizers_onebit.md §6).
#include <gtest/gtest.h>

#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

constexpr const char* kLamb = R"({"type": "Lamb", "params": {"lr": 0.02, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05}})";

RunSpec lamb_spec(int stage, int world, int gas, std::int64_t sub_group_size) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = gas;
  s.steps = 3;
  s.knobs.optimizer_json = kLamb;
  s.knobs.allow_untested_optimizer = true;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.allgather_bucket_size = 5000;
  s.knobs.sub_group_size = sub_group_size;
  return s;
}

class LambZero : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LambZero, ShardedEqualsUnsharded) {
  const auto [stage, world] = GetParam();
  const RunResult ref = run_zero(lamb_spec(0, 1, world, 1'000'000'000));
  RunSpec init_spec = lamb_spec(0, 1, 1, 1'000'000'000);
  init_spec.steps = 0;
  const RunResult init = run_zero(init_spec);
  // Sub-groups of 4000 elements also cut tensors inside a rank's partition.
  for (std::int64_t sub_group : {std::int64_t{1'000'000'000}, std::int64_t{4000}}) {
    const RunResult run = run_zero(lamb_spec(stage, world, 1, sub_group));
    for (int r = 1; r < world; ++r) EXPECT_EQ(run.ranks[static_cast<std::size_t>(r)].params, run.r0().params) << "rank " << r;
    const Tolerance tol = tolerance(Precision::fp32);
    for (std::size_t k = 0; k < ref.r0().losses.size(); ++k)
      EXPECT_NEAR(run.r0().losses[k], ref.r0().losses[k], tol.loss_rtol * std::abs(ref.r0().losses[k])) << "step " << k + 1;
    const ParamDiff d = compare_params(run.r0().params, ref.r0().params, init.r0().params, tol.atol, tol.rtol);
    EXPECT_TRUE(d.finite);
    EXPECT_LE(d.max_excess, 1.0) << "stage " << stage << " W " << world << " sub_group " << sub_group << ": worst parameter " << d.worst_element
                                 << ", max |diff| " << d.max_abs;
    EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, LambZero, ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(2, 4)),
                         [](const auto& pi) { return fmt::format("stage{}_W{}", std::get<0>(pi.param), std::get<1>(pi.param)); });

TEST(LambZero, StageZeroSubGroupsCuttingTensorsEqualWholeTensors) {
  const RunResult whole = run_zero(lamb_spec(0, 1, 2, 1'000'000'000));
  const RunResult cut = run_zero(lamb_spec(0, 1, 2, 3000));
  const Tolerance tol = tolerance(Precision::fp32);
  RunSpec init_spec = lamb_spec(0, 1, 1, 1'000'000'000);
  init_spec.steps = 0;
  const RunResult init = run_zero(init_spec);
  const ParamDiff d = compare_params(cut.r0().params, whole.r0().params, init.r0().params, tol.atol, tol.rtol);
  EXPECT_LE(d.max_excess, 1.0) << d.worst_element << " " << d.max_abs;
}

TEST(LambZero, RefusedWithoutZeroAllowUntestedOptimizer) {
  config::ConfigOptions o;
  o.world_size = 2;
  try {
    config::parse_ds_config(config::Json::parse(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
                                                    "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})"),
                            o);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_allow_untested_optimizer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dstrain
