// zero/gradient_reduction.h against DeepSpeed's reduction code, written out here per path
// (engine.allreduce_bucket, stage_1_and_2 gradient_reduction_w_predivide / average_tensor,
// stage3 __avg_scatter_contiguous_grads / reduce_scatter_coalesced), on local ranks with values
// whose results are exact, so every factor and the dtype the sum runs in show in the result.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "comm_test_util.h"
#include "ops/allocator.h"
#include "zero/gradient_reduction.h"
#include "zero/local_communicator.h"

namespace dstrain {
namespace {

using testing_comm::HostBuf;

// DeepSpeed's multipliers, transcribed from its source (not from gradient_reduction.cpp).
ReductionScales deepspeed_scales(bool mean, bool prescale, double p, ReductionPath path, int world) {
  const double w = world;
  if (!mean) return {1.0, 1.0};
  if (path == ReductionPath::all_reduce) {
    // if postscale: if p != 1: mul_(1/p); all_reduce; if p != W: mul_(p/W)   else: mul_(1/W); all_reduce
    if (prescale) return {1.0 / w, 1.0};
    return {p != 1.0 ? 1.0 / p : 1.0, p != w ? p / w : 1.0};
  }
  if (path == ReductionPath::partition_reduce) return {1.0 / w, 1.0};  // tensor.div_(W) before the reduce
  // stage 3, contiguous: if postscale and p != 1: div_(p); div_(W); all_reduce; if postscale and p != W: mul(p)
  const double before = (!prescale && p != 1.0 ? 1.0 / p : 1.0) / w;
  return {before, !prescale && p != w ? p : 1.0};
}

TEST(GradientReduction, ScalesFollowDeepSpeedPerPath) {
  for (const ReductionPath path : {ReductionPath::all_reduce, ReductionPath::partition_reduce, ReductionPath::stage3_all_reduce})
    for (const int w : {1, 2, 3, 4})
      for (const bool mean : {true, false})
        for (const bool pre : {false, true})
          for (const double p : {1.0, 2.0, 3.0, 0.5}) {
            GradientReduction g;
            g.average = mean;
            g.prescale = pre;
            g.predivide = p;
            const ReductionScales got = reduction_scales(g, path, w);
            const ReductionScales want = deepspeed_scales(mean, pre, p, path, w);
            EXPECT_DOUBLE_EQ(got.before, want.before) << static_cast<int>(path) << " w" << w << " mean" << mean << " pre" << pre << " p" << p;
            EXPECT_DOUBLE_EQ(got.after, want.after) << static_cast<int>(path) << " w" << w << " mean" << mean << " pre" << pre << " p" << p;
            // Whatever the path, "mean" ends as the average and "sum" as the sum (in exact arithmetic),
            // except DeepSpeed's ZeRO-3 all-reduce path with p == W != 1, which skips multiplying p back
            // and so divides by W twice: the config refuses it (docs/zero.md).
            const bool stage3_double_division = path == ReductionPath::stage3_all_reduce && mean && !pre && p == w && p != 1.0;
            EXPECT_NEAR(got.before * got.after, !mean ? 1.0 : stage3_double_division ? 1.0 / (w * w) : 1.0 / w, 1e-15);
          }
  EXPECT_EQ(reduction_path(0, true), ReductionPath::all_reduce);
  EXPECT_EQ(reduction_path(1, false), ReductionPath::all_reduce);
  EXPECT_EQ(reduction_path(2, true), ReductionPath::partition_reduce);
  EXPECT_EQ(reduction_path(3, false), ReductionPath::stage3_all_reduce);
}

// Every rank holds `value` in all n elements of a `dtype` chunk; returns rank 0's result
// (the whole chunk after an all-reduce, its shard after a reduce-scatter).
std::vector<double> reduce_on_ranks(int world, DType dtype, double value, bool scatter, const GradientReduction& g, ReductionPath path) {
  constexpr std::int64_t n = 8;
  std::vector<HostBuf> bufs(static_cast<std::size_t>(world), HostBuf(dtype, n));
  for (auto& b : bufs)
    for (std::int64_t i = 0; i < n; ++i) b.set(i, value);
  run_local_ranks(world, [&](Communicator& comm) {
    reduce_gradients(comm, bufs[static_cast<std::size_t>(comm.rank())].tensor(), scatter, g, path, cpu_allocator());
  });
  std::vector<double> out;
  for (std::int64_t i = 0; i < (scatter ? n / world : n); ++i) out.push_back(bufs[0].get(i));
  return out;
}

double only(const std::vector<double>& v) {
  for (double x : v) EXPECT_EQ(x, v.front());
  return v.front();
}

// gradient_allreduce_op "sum": W times the average, on every path.
TEST(GradientReduction, SumIsWorldTimesMean) {
  GradientReduction sum;
  sum.average = false;
  for (const bool scatter : {false, true})
    for (const int w : {2, 4}) {
      EXPECT_EQ(only(reduce_on_ranks(w, DType::fp32, 1.5, scatter, sum, reduction_path(1, scatter))), 1.5 * w);
      EXPECT_EQ(only(reduce_on_ranks(w, DType::fp32, 1.5, scatter, GradientReduction{}, reduction_path(1, scatter))), 1.5);
    }
}

// communication_data_type fp16 on fp32 gradients: the sum runs in fp16, so 2 × 40000 overflows
// unless the gradients are divided first (prescale, predivide) — the reason these keys exist.
TEST(GradientReduction, PrescaleAndPredivideActBeforeTheSumInTheCommunicationDtype) {
  const double inf = std::numeric_limits<double>::infinity();
  GradientReduction post;  // DeepSpeed's default order at stage 0: sum, then ×1/W
  post.comm_dtype = DType::fp16;
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 40000.0, false, post, ReductionPath::all_reduce)), inf);

  GradientReduction pre = post;
  pre.prescale = true;  // ×1/2, sum: 40000
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 40000.0, false, pre, ReductionPath::all_reduce)), 40000.0);

  GradientReduction pd = post;
  pd.predivide = 4.0;  // ×1/4 → 10000, sum → 20000, ×4/2 → 40000
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 40000.0, false, pd, ReductionPath::all_reduce)), 40000.0);
  // The factor shows in the rounding too: 3·2^-24 (fp16 subnormals) ×1/4 rounds to 2^-24 (0.75 →
  // 1 ulp), the sum is 2·2^-24, ×4/2 gives 4·2^-24, where the exact average is 3·2^-24.
  const double ulp = std::ldexp(1.0, -24);
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 3 * ulp, false, pd, ReductionPath::all_reduce)), 4 * ulp);
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 3 * ulp, false, post, ReductionPath::all_reduce)), 3 * ulp);

  // In fp32 the sum does not overflow: the communication dtype is what made it inf.
  GradientReduction fp32_default;
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 40000.0, false, fp32_default, ReductionPath::all_reduce)), 40000.0);
  // The ZeRO reduce-scatter path divides first (average_tensor): no overflow with fp16 either.
  EXPECT_EQ(only(reduce_on_ranks(2, DType::fp32, 40000.0, true, post, ReductionPath::partition_reduce)), 40000.0);
}

}  // namespace
}  // namespace dstrain
