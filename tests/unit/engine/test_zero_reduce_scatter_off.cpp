// ZeRO with reduce_scatter: false (DeepSpeed's all-reduce path) trains like one rank with the same
// global batch, and really all-reduces: the collectives' kinds and bytes are checked against the
// ring volumes of zero/communicator.h (the full stage x world x dtype matrix is in
// test_zero_equivalence.cpp, the reduce-scatter volumes in test_zero_comm.cpp).
// Also the gradient-reduction keys through the engine (docs/zero.md): "sum" gives W times the
// averaged gradients; bf16 with an fp32 accumulation dtype at ZeRO-1 never skips a step.
#include <gtest/gtest.h>

#include "zero_test_util.h"

namespace dstrain {
namespace {
using namespace zero_testing;

std::uint64_t ring(std::uint64_t bytes, int w) { return bytes * static_cast<std::uint64_t>(w - 1) / static_cast<std::uint64_t>(w); }
// The step's (norm², overflow count, loss) all-reduce of 3 fp64 values.
std::uint64_t small_all_reduce(int w) { return 2 * ring(24, w); }
// Ψ in bytes: every layer's elements padded for W ranks, fp32.
std::uint64_t psi_bytes(int w) {
  std::int64_t n = 0;
  for (const auto& l : model_specs()) n += padded_numel(l, w, 4);
  return static_cast<std::uint64_t>(n) * 4;
}

// reduce_scatter: false all-reduces the gradients instead (DeepSpeed's option): the same result.
TEST(ZeroReduceScatterOff, AllReduceInsteadOfReduceScatter) {
  constexpr int w = 2;
  RunSpec ref_spec;
  ref_spec.gas = 2;
  ref_spec.steps = 2;
  const RunResult ref = run_zero(ref_spec);
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    RunSpec s;
    s.stage = stage;
    s.world = w;
    s.steps = 2;
    s.knobs.reduce_bucket_size = 3000;
    s.knobs.prefetch_bucket_size = 5000;
    s.knobs.persistence_threshold = 2000;
    s.knobs.overlap_comm = stage % 2 == 1;
    s.knobs.reduce_scatter = false;
    const RunResult r = run_zero(s);
    for (const auto& [n, v] : ref.r0().params) {
      const auto& got = r.r0().params.at(n);
      for (std::size_t k = 0; k < v.size(); ++k) ASSERT_NEAR(v[k], got[k], 1e-4) << n;
    }
    // The same run with the default reduce_scatter: true, for what the knob must not change.
    RunSpec on = s;
    on.knobs.reduce_scatter = true;
    const RunResult r_on = run_zero(on);
    for (int rank = 0; rank < w; ++rank) {
      const CommStats& off_c = r.ranks[static_cast<std::size_t>(rank)].report.step_comm;
      const CommStats& on_c = r_on.ranks[static_cast<std::size_t>(rank)].report.step_comm;
      // Off: no reduce-scatter at all; every gradient byte goes through an all-reduce, twice the
      // ring volume of the reduce-scatter it replaces (2Ψ(W−1)/W against Ψ(W−1)/W, gas 1).
      EXPECT_EQ(off_c.call_count(CollectiveKind::reduce_scatter), 0u);
      EXPECT_EQ(off_c.bytes_sent(CollectiveKind::reduce_scatter), 0u);
      EXPECT_EQ(off_c.bytes_sent(CollectiveKind::all_reduce), small_all_reduce(w) + 2 * ring(psi_bytes(w), w));
      EXPECT_EQ(on_c.bytes_sent(CollectiveKind::reduce_scatter), ring(psi_bytes(w), w));
      EXPECT_EQ(on_c.bytes_sent(CollectiveKind::all_reduce), small_all_reduce(w));
      // One all-reduce per chunk where there was one reduce-scatter, plus the step's small one.
      EXPECT_EQ(off_c.call_count(CollectiveKind::all_reduce), on_c.call_count(CollectiveKind::reduce_scatter) + 1);
      // Parameters are gathered exactly as before.
      EXPECT_EQ(off_c.bytes_sent(CollectiveKind::all_gather), on_c.bytes_sent(CollectiveKind::all_gather));
      EXPECT_EQ(off_c.call_count(CollectiveKind::all_gather), on_c.call_count(CollectiveKind::all_gather));
    }
  }
}

// gradient_allreduce_op "sum" disables averaging: the gradients the first step sees are W times
// the averaged ones, so (fp32, W = 2: exact) the global norm doubles, on every reduction path.
TEST(GradientAllreduceOp, SumGivesWorldTimesTheAveragedGradients) {
  for (int stage = 0; stage <= 2; ++stage)
    for (const bool rs : {true, false}) {
      if (stage == 0 && !rs) continue;
      SCOPED_TRACE(testing::Message() << "stage " << stage << " reduce_scatter " << rs);
      RunSpec s;
      s.stage = stage;
      s.world = 2;
      s.steps = 1;
      s.knobs.reduce_scatter = rs;
      s.knobs.reduce_bucket_size = 3000;
      const double mean_norm = run_zero(s).r0().grad_norms.at(0);
      s.knobs.extra_json = R"("gradient_allreduce_op": "sum")";
      const double sum_norm = run_zero(s).r0().grad_norms.at(0);
      EXPECT_GT(mean_norm, 0.0);
      EXPECT_DOUBLE_EQ(sum_norm, 2.0 * mean_norm);
    }
}

// With the default "mean", prescale_gradients and gradient_predivide_factor (where DeepSpeed
// allows them) give the average again: in fp32 with W = 2 every factor is a power of two, exact.
TEST(GradientAllreduceOp, PrescaleAndPredivideStillAverage) {
  RunSpec s;
  s.stage = 0;
  s.world = 2;
  s.steps = 1;
  const double mean_norm = run_zero(s).r0().grad_norms.at(0);
  for (const char* extra : {R"("prescale_gradients": true)", R"("gradient_predivide_factor": 4.0)"}) {
    s.knobs.extra_json = extra;
    EXPECT_DOUBLE_EQ(run_zero(s).r0().grad_norms.at(0), mean_norm) << extra;
  }
}

// DeepSpeed runs bf16 at ZeRO stage 1 with data_types.grad_accum_dtype "fp32" through its
// BF16_Optimizer, which never skips a step; without it (the ZeRO optimizer with
// check_grad_overflow) the same injected overflow skips the step.
TEST(Bf16Optimizer, Fp32AccumulationAtStage1NeverSkips) {
  const auto skipped = [](const std::string& extra) {
    RunSpec s;
    s.stage = 1;
    s.world = 2;
    s.steps = 3;
    s.inject_overflow = {{2}, {}};
    s.knobs.extra_json = R"("bf16": {"enabled": true, "check_grad_overflow": true})" + extra;
    return run_zero(s).r0().skipped_steps;
  };
  EXPECT_EQ(skipped(""), 1);
  EXPECT_EQ(skipped(R"(, "data_types": {"grad_accum_dtype": "fp32"})"), 0);
}

}  // namespace
}  // namespace dstrain
