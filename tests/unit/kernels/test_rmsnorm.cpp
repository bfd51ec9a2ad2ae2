// RMSNorm and fused residual + RMSNorm against a naive double reference (full Jacobian for the
// backward), finite differences and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/rmsnorm.h"
#include "rmsnorm_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

struct RefRms {
  std::vector<double> out, rstd;
};

RefRms ref_forward(const std::vector<double>& x, const std::vector<double>& w, std::int64_t rows, std::int64_t C, double eps) {
  RefRms r{std::vector<double>(x.size()), std::vector<double>(static_cast<std::size_t>(rows))};
  for (std::int64_t i = 0; i < rows; ++i) {
    double ss = 0;
    for (std::int64_t c = 0; c < C; ++c) ss += x[static_cast<std::size_t>(i * C + c)] * x[static_cast<std::size_t>(i * C + c)];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (std::int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<std::size_t>(i * C + c);
      r.out[k] = x[k] * rs * w[static_cast<std::size_t>(c)];
    }
    r.rstd[static_cast<std::size_t>(i)] = rs;
  }
  return r;
}

// Gradient of sum(dout * out) through the full Jacobian, O(C^2) per row (not the kernel's
// formula): n_j = x_j rs, d rs / d x_k = -rs^3 x_k / C, so dn_j/dx_k = rs delta_jk - x_j rs^3 x_k / C.
void ref_backward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& g, std::int64_t rows, std::int64_t C,
                  double eps, std::vector<double>& dx, std::vector<double>& dw) {
  const RefRms f = ref_forward(x, std::vector<double>(static_cast<std::size_t>(C), 1.0), rows, C, eps);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double rs = f.rstd[static_cast<std::size_t>(i)];
    for (std::int64_t k = 0; k < C; ++k) {
      const double xk = x[static_cast<std::size_t>(i * C + k)];
      double acc = 0;
      for (std::int64_t j = 0; j < C; ++j) {
        const double xj = x[static_cast<std::size_t>(i * C + j)];
        const double jac = rs * (j == k ? 1.0 : 0.0) - xj * rs * rs * rs * xk / static_cast<double>(C);
        acc += g[static_cast<std::size_t>(i * C + j)] * w[static_cast<std::size_t>(j)] * jac;
      }
      dx[static_cast<std::size_t>(i * C + k)] += acc;
      dw[static_cast<std::size_t>(k)] += g[static_cast<std::size_t>(i * C + k)] * xk * rs;
    }
  }
}

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }

}  // namespace

class RmsnormTest : public ::testing::TestWithParam<DType> {};

TEST_P(RmsnormTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kRmsnormTols.of(dt);
  std::mt19937_64 rng(41);
  for (const RmsnormCase& c : kRmsnormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, N = B * T * C;
    const auto eps = static_cast<float>(c.eps);
    Buf x(dt, N), w(dt, C), y(dt, N), g(dt, N), dx(dt, N), dw(dt, C);
    x.fill_uniform(rng, -2, 3);
    w.fill_uniform(rng, 0.5, 1.5);
    g.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);
    dw.fill_uniform(rng, -1, 1);
    std::vector<float> rstd(static_cast<std::size_t>(B * T));
    const auto xv = x.values(), wv = w.values(), gv = g.values();
    auto want_dx = dx.values(), want_dw = dw.values();
    rmsnorm_forward(y.tensor({B, T, C}), f32(rstd, {B, T}), x.tensor({B, T, C}), w.tensor({C}), eps);
    rmsnorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}), f32(rstd, {B, T}));
    const RefRms ref = ref_forward(xv, wv, B * T, C, static_cast<double>(eps));
    ref_backward(xv, wv, gv, B * T, C, static_cast<double>(eps), want_dx, want_dw);
    expect_close(y, ref.out, tol, "rmsnorm out " + dtype_label(dt));
    expect_close(std::vector<double>(rstd.begin(), rstd.end()), ref.rstd, Tol{1e-5, 1e-5}, "rmsnorm rstd");
    expect_close(dx, want_dx, Tol{tol.atol * 4, tol.rtol * 2}, "rmsnorm dinp " + dtype_label(dt));
    expect_close(dw, want_dw, Tol{tol.atol * static_cast<double>(B * T), tol.rtol}, "rmsnorm dweight " + dtype_label(dt));
  }
}

TEST_P(RmsnormTest, EpsIsHonoured) {
  // A row of tiny values: rstd = 1/sqrt(mean(x^2) + eps) is dominated by eps.
  const DType dt = GetParam();
  const std::int64_t C = 4;
  Buf x(dt, C), w(dt, C), y(dt, C);
  x.fill(1e-3);
  w.fill(1.0);
  std::vector<float> rstd(1);
  rmsnorm_forward(y.tensor({1, C}), f32(rstd, {1}), x.tensor({1, C}), w.tensor({C}), 1e-2f);
  const double xv = x.get(0);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(xv * xv + 1e-2), 1e-4);
}

TEST_P(RmsnormTest, FusedResidualEqualsAddThenRmsnorm) {
  const DType dt = GetParam();
  std::mt19937_64 rng(42);
  for (const RmsnormCase& c : kRmsnormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, N = B * T * C;
    const auto eps = static_cast<float>(c.eps);
    Buf a(dt, N), bb(dt, N), w(dt, C), res(dt, N), y(dt, N), y2(dt, N);
    a.fill_uniform(rng, -2, 2);
    bb.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5, 1.5);
    std::vector<float> r(static_cast<std::size_t>(B * T)), r2(r.size());
    fused_residual_rmsnorm_forward(res.tensor({B, T, C}), y.tensor({B, T, C}), f32(r, {B, T}), a.tensor({B, T, C}), bb.tensor({B, T, C}),
                                   w.tensor({C}), eps);
    Buf want_res(dt, N);
    for (std::int64_t i = 0; i < N; ++i) want_res.set(i, a.get(i) + bb.get(i));
    for (std::int64_t i = 0; i < N; ++i) ASSERT_EQ(res.get(i), want_res.get(i)) << "residual " << i;
    const RefRms ref = ref_forward(want_res.values(), w.values(), B * T, C, static_cast<double>(eps));
    expect_close(y, ref.out, kRmsnormTols.of(dt), "fused out " + dtype_label(dt));
    // Bitwise equal to the unfused kernel on the stored residual.
    rmsnorm_forward(y2.tensor({B, T, C}), f32(r2, {B, T}), res.tensor({B, T, C}), w.tensor({C}), eps);
    for (std::int64_t i = 0; i < N; ++i) ASSERT_EQ(y.get(i), y2.get(i)) << i;
    for (std::size_t i = 0; i < r.size(); ++i) ASSERT_EQ(r[i], r2[i]);
    // In place: residual written over a.
    Buf a2(dt, N), y3(dt, N);
    for (std::int64_t i = 0; i < N; ++i) a2.set(i, a.get(i));
    fused_residual_rmsnorm_forward(a2.tensor({B, T, C}), y3.tensor({B, T, C}), f32(r2, {B, T}), a2.tensor({B, T, C}), bb.tensor({B, T, C}),
                                   w.tensor({C}), eps);
    for (std::int64_t i = 0; i < N; ++i) ASSERT_EQ(a2.get(i), res.get(i)) << "in-place residual " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RmsnormTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Rmsnorm, FiniteDifferences) {
  std::mt19937_64 rng(43);
  const std::int64_t B = 2, T = 2, C = 7, N = B * T * C;
  const float eps = 1e-5f;
  Buf x(DType::fp32, N), w(DType::fp32, C), y(DType::fp32, N), g(DType::fp32, N), dx(DType::fp32, N), dw(DType::fp32, C);
  x.fill_uniform(rng, -2, 2);
  w.fill_uniform(rng, 0.5, 1.5);
  const auto proj = random_vec(rng, static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) g.set(i, proj[static_cast<std::size_t>(i)]);
  std::vector<float> rstd(static_cast<std::size_t>(B * T)), r2(rstd.size());
  rmsnorm_forward(y.tensor({B, T, C}), f32(rstd, {B, T}), x.tensor({B, T, C}), w.tensor({C}), eps);
  rmsnorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}), f32(rstd, {B, T}));
  auto loss = [&] {
    rmsnorm_forward(y.tensor({B, T, C}), f32(r2, {B, T}), x.tensor({B, T, C}), w.tensor({C}), eps);
    double l = 0;
    for (std::int64_t i = 0; i < N; ++i) l += proj[static_cast<std::size_t>(i)] * y.get(i);
    return l;
  };
  for (std::int64_t i = 0; i < N; ++i) {
    const double fd = central_difference(static_cast<float*>(x.data()), i, 1e-2, loss);
    EXPECT_NEAR(dx.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dinp " << i;
  }
  for (std::int64_t i = 0; i < C; ++i) {
    const double fdw = central_difference(static_cast<float*>(w.data()), i, 1e-2, loss);
    EXPECT_NEAR(dw.get(i), fdw, kFdTol.atol + kFdTol.rtol * std::abs(fdw)) << "dweight " << i;
  }
}

TEST(Rmsnorm, BadArgumentsNameTheOpAndShapes) {
  Buf x(DType::fp32, 24), w(DType::fp32, 6), y(DType::fp32, 24), h(DType::bf16, 6);
  std::vector<float> r(4);
  expect_error(
      [&] {
        rmsnorm_forward(y.tensor({4, 6}), f32(r, {4}), x.tensor({4, 6}), w.tensor({3, 2}));
      },
      {"rmsnorm_forward", "weight", "[3, 2]", "[6]"});
  expect_error([&] { rmsnorm_forward(y.tensor({4, 6}), f32(r, {4}), x.tensor({4, 6}), h.tensor({6})); }, {"rmsnorm_forward", "bf16", "fp32"});
  expect_error([&] { rmsnorm_forward(y.tensor({4, 6}), f32(r, {2}), x.tensor({4, 6}), w.tensor({6})); }, {"rmsnorm_forward", "rstd", "[4, 6]"});
  expect_error(
      [&] {
        rmsnorm_forward(y.tensor({6, 4}), f32(r, {4}), x.tensor({4, 6}), w.tensor({6}));
      },
      {"rmsnorm_forward", "out", "[6, 4]", "[4, 6]"});
  Tensor gx(x.data(), DType::fp32, Shape{4, 6}, Device::cuda(0));
  expect_error([&] { rmsnorm_forward(y.tensor({4, 6}), f32(r, {4}), gx, w.tensor({6})); }, {"rmsnorm_forward", "cuda:0"});
  expect_error(
      [&] {
        fused_residual_rmsnorm_forward(y.tensor({4, 6}), w.tensor({6}), f32(r, {4}), x.tensor({4, 6}), x.tensor({2, 12}), w.tensor({6}));
      },
      {"fused_residual_rmsnorm_forward", "[2, 12]", "[4, 6]"});
  expect_error(
      [&] {
        rmsnorm_backward(x.tensor({4, 6}), w.tensor({6}), y.tensor({4, 6}), x.tensor({4, 6}), w.tensor({6}), f32(r, {4}));
      },
      {"rmsnorm_backward", "alias"});
}
