// Per-head RMSNorm (head_rmsnorm.h) against a naive double reference of the textbook formula,
// finite differences, heads outside the range left alone, and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "head_rmsnorm_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/head_rmsnorm.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

struct Ref {
  std::vector<double> out, dx, dw;
};

// y = x / sqrt(mean(x^2) + eps) * w on heads [h0, h0 + n); dx = dy (in place, others kept), dw += .
Ref reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dy, const std::vector<double>& dw0,
              const HeadRmsnormCase& c, double eps) {
  Ref r{x, dy, dw0};
  for (std::int64_t bt = 0; bt < c.B * c.T; ++bt)
    for (std::int64_t h = c.head0; h < c.head0 + c.nheads; ++h) {
      const std::size_t o = static_cast<std::size_t>((bt * c.H + h) * c.D);
      double ss = 0;
      for (std::int64_t d = 0; d < c.D; ++d) ss += x[o + d] * x[o + d];
      const double rs = 1.0 / std::sqrt(ss / c.D + eps);
      double dot = 0;
      for (std::int64_t d = 0; d < c.D; ++d) dot += w[d] * dy[o + d] * x[o + d] * rs;
      for (std::int64_t d = 0; d < c.D; ++d) {
        r.out[o + d] = x[o + d] * rs * w[d];
        r.dw[d] += dy[o + d] * x[o + d] * rs;
        // d/dx_j of x_k rs: rs (delta_jk - x_j x_k rs^2 / D)
        r.dx[o + d] = rs * (w[d] * dy[o + d] - x[o + d] * rs * dot / c.D);
      }
    }
  return r;
}

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }

}  // namespace

class HeadRmsnormTest : public ::testing::TestWithParam<DType> {};

TEST_P(HeadRmsnormTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kHeadRmsnormTols.of(dt);
  std::mt19937_64 rng(61);
  for (const HeadRmsnormCase& c : kHeadRmsnormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.B * c.T * c.H * c.D;
    const Shape s{c.B, c.T, c.H, c.D};
    const double eps = 1e-6;
    Buf x(dt, n), w(dt, c.D), dy(dt, n), dw(dt, c.D);
    x.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5, 1.5);
    dy.fill_uniform(rng, -1, 1);
    dw.fill_uniform(rng, -1, 1);
    const Ref ref = reference(x.values(), w.values(), dy.values(), dw.values(), c, eps);
    Buf raw = x;  // the heads before the norm, for the backward
    std::vector<float> rstd(static_cast<std::size_t>(c.B * c.T * c.nheads));
    head_rmsnorm_forward(x.tensor(s), f32(rstd, {c.B, c.T, c.nheads}), w.tensor({c.D}), c.head0, c.nheads, static_cast<float>(eps));
    expect_close(x, ref.out, tol, "head_rmsnorm out " + dtype_label(dt));
    head_rmsnorm_backward(dy.tensor(s), dw.tensor({c.D}), raw.tensor(s), w.tensor({c.D}), f32(rstd, {c.B, c.T, c.nheads}), c.head0, c.nheads);
    expect_close(dy, ref.dx, tol, "head_rmsnorm dx " + dtype_label(dt));
    expect_close(dw, ref.dw, Tol{tol.atol * 4, tol.rtol * 2}, "head_rmsnorm dweight " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, HeadRmsnormTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(HeadRmsnorm, FiniteDifferences) {
  std::mt19937_64 rng(62);
  const HeadRmsnormCase c{"fd", 1, 3, 4, 5, 1, 2};
  const std::int64_t n = c.B * c.T * c.H * c.D;
  const Shape s{c.B, c.T, c.H, c.D};
  Buf x(DType::fp32, n), w(DType::fp32, c.D), dy(DType::fp32, n), dw(DType::fp32, c.D);
  x.fill_uniform(rng, -1, 1);
  w.fill_uniform(rng, 0.5, 1.5);
  const auto proj = random_vec(rng, static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) dy.set(i, proj[static_cast<std::size_t>(i)]);
  std::vector<float> rstd(static_cast<std::size_t>(c.B * c.T * c.nheads));
  Buf y = x;
  head_rmsnorm_forward(y.tensor(s), f32(rstd, {c.B, c.T, c.nheads}), w.tensor({c.D}), c.head0, c.nheads, 1e-6f);
  head_rmsnorm_backward(dy.tensor(s), dw.tensor({c.D}), x.tensor(s), w.tensor({c.D}), f32(rstd, {c.B, c.T, c.nheads}), c.head0, c.nheads);
  std::vector<float> r2(rstd.size());
  auto loss = [&] {
    Buf y2 = x;
    head_rmsnorm_forward(y2.tensor(s), f32(r2, {c.B, c.T, c.nheads}), w.tensor({c.D}), c.head0, c.nheads, 1e-6f);
    double l = 0;
    for (std::int64_t i = 0; i < n; ++i) l += proj[static_cast<std::size_t>(i)] * y2.get(i);
    return l;
  };
  for (std::int64_t i = 0; i < n; ++i) {
    const double fd = central_difference(static_cast<float*>(x.data()), i, 1e-2, loss);
    EXPECT_NEAR(dy.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dx " << i;  // identity (fd = proj) outside the range
  }
  for (std::int64_t i = 0; i < c.D; ++i) {
    const double fd = central_difference(static_cast<float*>(w.data()), i, 1e-2, loss);
    EXPECT_NEAR(dw.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dw " << i;
  }
}

TEST(HeadRmsnorm, BadArgumentsNameTheOpAndShapes) {
  Buf x(DType::fp32, 2 * 3 * 4 * 8), w(DType::fp32, 8), w7(DType::fp32, 7);
  std::vector<float> rstd(2 * 3 * 2);
  const Shape s{2, 3, 4, 8};
  expect_error(
      [&] {
        head_rmsnorm_forward(x.tensor(s), f32(rstd, {2, 3, 2}), w.tensor({8}), 3, 2, 1e-6f);
      },
      {"head_rmsnorm_forward", "heads [3, 5)", "4 heads"});
  expect_error([&] { head_rmsnorm_forward(x.tensor(s), f32(rstd, {2, 3, 2}), w7.tensor({7}), 0, 2, 1e-6f); }, {"head_rmsnorm_forward", "weight"});
  expect_error([&] { head_rmsnorm_forward(x.tensor(s), f32(rstd, {2, 2, 3}), w.tensor({8}), 0, 2, 1e-6f); }, {"head_rmsnorm_forward", "rstd"});
  expect_error(
      [&] {
        head_rmsnorm_backward(x.tensor(s), w.tensor({8}), x.tensor(s), w.tensor({8}), f32(rstd, {2, 3, 2}), 0, 2);
      },
      {"head_rmsnorm_backward", "alias"});
}
