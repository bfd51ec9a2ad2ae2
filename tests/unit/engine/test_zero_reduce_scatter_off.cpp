// ZeRO with reduce_scatter: false (DeepSpeed's all-reduce path) trains like one rank with the same
// global batch (the full stage x world x dtype matrix is in test_zero_equivalence.cpp).
#include <gtest/gtest.h>

#include "zero_test_util.h"

namespace dstrain {
namespace {
using namespace zero_testing;

// reduce_scatter: false all-reduces the gradients instead (DeepSpeed's option): the same result.
TEST(ZeroReduceScatterOff, AllReduceInsteadOfReduceScatter) {
  RunSpec ref_spec;
  ref_spec.gas = 2;
  ref_spec.steps = 2;
  const RunResult ref = run_zero(ref_spec);
  for (int stage = 1; stage <= 3; ++stage) {
    RunSpec s;
    s.stage = stage;
    s.world = 2;
    s.steps = 2;
    s.knobs.reduce_bucket_size = 3000;
    s.knobs.prefetch_bucket_size = 5000;
    s.knobs.persistence_threshold = 2000;
    s.knobs.overlap_comm = stage % 2 == 1;
    s.knobs.reduce_scatter = false;
    const RunResult r = run_zero(s);
    for (const auto& [n, v] : ref.r0().params) {
      const auto& w = r.r0().params.at(n);
      for (std::size_t k = 0; k < v.size(); ++k) ASSERT_NEAR(v[k], w[k], 1e-4) << n << " stage " << stage;
    }
  }
}

}  // namespace
}  // namespace dstrain
