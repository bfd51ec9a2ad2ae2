// LayerNorm and fused residual + LayerNorm against a naive double reference, finite differences,
// determinism and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "layernorm_cases.h"
#include "ops/kernels/layernorm.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

constexpr double kEps = 1e-5;

struct RefLn {
  std::vector<double> out, mean, rstd;
};

RefLn ref_forward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b, std::int64_t rows, std::int64_t C) {
  RefLn r{std::vector<double>(x.size()), std::vector<double>(static_cast<std::size_t>(rows)), std::vector<double>(static_cast<std::size_t>(rows))};
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (std::int64_t c = 0; c < C; ++c) m += x[static_cast<std::size_t>(i * C + c)];
    m /= static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) v += (x[static_cast<std::size_t>(i * C + c)] - m) * (x[static_cast<std::size_t>(i * C + c)] - m);
    v /= static_cast<double>(C);
    const double rs = 1.0 / std::sqrt(v + kEps);
    for (std::int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<std::size_t>(i * C + c);
      r.out[k] = (x[k] - m) * rs * w[static_cast<std::size_t>(c)] + b[static_cast<std::size_t>(c)];
    }
    r.mean[static_cast<std::size_t>(i)] = m;
    r.rstd[static_cast<std::size_t>(i)] = rs;
  }
  return r;
}

// Gradient of sum(dout * out) by the chain rule written out directly (not the kernel's formula):
// dx_k = rstd * (dn_k - mean_j dn_j - n_k * mean_j(dn_j n_j)), derived from d n / d x.
void ref_backward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& g, std::int64_t rows, std::int64_t C,
                  std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) {
  const RefLn f = ref_forward(x, w, std::vector<double>(static_cast<std::size_t>(C), 0.0), rows, C);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double m = f.mean[static_cast<std::size_t>(i)], rs = f.rstd[static_cast<std::size_t>(i)];
    // Full Jacobian, O(C^2): dn_j/dx_k = rs * (delta_jk - 1/C - n_j n_k / C).
    for (std::int64_t k = 0; k < C; ++k) {
      const double nk = (x[static_cast<std::size_t>(i * C + k)] - m) * rs;
      double acc = 0;
      for (std::int64_t j = 0; j < C; ++j) {
        const double nj = (x[static_cast<std::size_t>(i * C + j)] - m) * rs;
        const double jac = rs * ((j == k ? 1.0 : 0.0) - 1.0 / static_cast<double>(C) - nj * nk / static_cast<double>(C));
        acc += g[static_cast<std::size_t>(i * C + j)] * w[static_cast<std::size_t>(j)] * jac;
      }
      dx[static_cast<std::size_t>(i * C + k)] += acc;
      dw[static_cast<std::size_t>(k)] += g[static_cast<std::size_t>(i * C + k)] * nk;
      db[static_cast<std::size_t>(k)] += g[static_cast<std::size_t>(i * C + k)];
    }
  }
}

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }

}  // namespace

class LayernormTest : public ::testing::TestWithParam<DType> {};

TEST_P(LayernormTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kLayernormTols.of(dt);
  std::mt19937_64 rng(31);
  for (const LayernormCase& c : kLayernormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, N = B * T * C;
    Buf x(dt, N), w(dt, C), b(dt, C), y(dt, N), g(dt, N), dx(dt, N), dw(dt, C), db(dt, C);
    x.fill_uniform(rng, -2, 3);
    w.fill_uniform(rng, 0.5, 1.5);
    b.fill_uniform(rng, -0.5, 0.5);
    g.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);
    dw.fill_uniform(rng, -1, 1);
    db.fill_uniform(rng, -1, 1);
    std::vector<float> mean(static_cast<std::size_t>(B * T)), rstd(static_cast<std::size_t>(B * T));
    const auto xv = x.values(), wv = w.values(), bv = b.values(), gv = g.values();
    auto want_dx = dx.values(), want_dw = dw.values(), want_db = db.values();
    layernorm_forward(y.tensor({B, T, C}), f32(mean, {B, T}), f32(rstd, {B, T}), x.tensor({B, T, C}), w.tensor({C}), b.tensor({C}));
    layernorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), db.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}),
                       f32(mean, {B, T}), f32(rstd, {B, T}));
    const RefLn ref = ref_forward(xv, wv, bv, B * T, C);
    ref_backward(xv, wv, gv, B * T, C, want_dx, want_dw, want_db);
    expect_close(y, ref.out, tol, "layernorm out " + dtype_label(dt));
    expect_close(std::vector<double>(mean.begin(), mean.end()), ref.mean, Tol{1e-5, 1e-5}, "layernorm mean");
    expect_close(std::vector<double>(rstd.begin(), rstd.end()), ref.rstd, Tol{1e-5, 1e-4}, "layernorm rstd");
    expect_close(dx, want_dx, Tol{tol.atol * 4, tol.rtol * 2}, "layernorm dinp " + dtype_label(dt));
    const Tol sum_tol{tol.atol * static_cast<double>(B * T), tol.rtol};
    expect_close(dw, want_dw, sum_tol, "layernorm dweight " + dtype_label(dt));
    expect_close(db, want_db, sum_tol, "layernorm dbias " + dtype_label(dt));
  }
}

TEST_P(LayernormTest, FusedResidualEqualsAddThenLayernorm) {
  const DType dt = GetParam();
  std::mt19937_64 rng(32);
  for (const LayernormCase& c : kLayernormCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, N = B * T * C;
    Buf a(dt, N), bb(dt, N), w(dt, C), bias(dt, C), res(dt, N), y(dt, N), y2(dt, N);
    a.fill_uniform(rng, -2, 2);
    bb.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5, 1.5);
    bias.fill_uniform(rng, -0.5, 0.5);
    std::vector<float> m(static_cast<std::size_t>(B * T)), r(m.size()), m2(m.size()), r2(m.size());
    fused_residual_layernorm_forward(res.tensor({B, T, C}), y.tensor({B, T, C}), f32(m, {B, T}), f32(r, {B, T}), a.tensor({B, T, C}),
                                     bb.tensor({B, T, C}), w.tensor({C}), bias.tensor({C}));
    // Reference residual: a + b in double, rounded once to the storage type.
    Buf want_res(dt, N);
    for (std::int64_t i = 0; i < N; ++i) want_res.set(i, a.get(i) + bb.get(i));
    for (std::int64_t i = 0; i < N; ++i) ASSERT_EQ(res.get(i), want_res.get(i)) << "residual " << i;
    const RefLn ref = ref_forward(want_res.values(), w.values(), bias.values(), B * T, C);
    expect_close(y, ref.out, kLayernormTols.of(dt), "fused out " + dtype_label(dt));
    // Bitwise equal to the unfused kernel on the stored residual.
    layernorm_forward(y2.tensor({B, T, C}), f32(m2, {B, T}), f32(r2, {B, T}), res.tensor({B, T, C}), w.tensor({C}), bias.tensor({C}));
    for (std::int64_t i = 0; i < N; ++i) ASSERT_EQ(y.get(i), y2.get(i)) << i;
    for (std::size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m[i], m2[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, LayernormTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Layernorm, FiniteDifferences) {
  std::mt19937_64 rng(33);
  const std::int64_t B = 2, T = 2, C = 7, N = B * T * C;
  Buf x(DType::fp32, N), w(DType::fp32, C), b(DType::fp32, C), y(DType::fp32, N), g(DType::fp32, N), dx(DType::fp32, N), dw(DType::fp32, C),
      db(DType::fp32, C);
  x.fill_uniform(rng, -2, 2);
  w.fill_uniform(rng, 0.5, 1.5);
  b.fill_uniform(rng, -0.5, 0.5);
  const auto proj = random_vec(rng, static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) g.set(i, proj[static_cast<std::size_t>(i)]);
  std::vector<float> mean(static_cast<std::size_t>(B * T)), rstd(mean.size());
  layernorm_forward(y.tensor({B, T, C}), f32(mean, {B, T}), f32(rstd, {B, T}), x.tensor({B, T, C}), w.tensor({C}), b.tensor({C}));
  layernorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), db.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}), f32(mean, {B, T}),
                     f32(rstd, {B, T}));
  std::vector<float> m2(mean.size()), r2(mean.size());
  auto loss = [&] {
    layernorm_forward(y.tensor({B, T, C}), f32(m2, {B, T}), f32(r2, {B, T}), x.tensor({B, T, C}), w.tensor({C}), b.tensor({C}));
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
    const double fdb = central_difference(static_cast<float*>(b.data()), i, 1e-2, loss);
    EXPECT_NEAR(db.get(i), fdb, kFdTol.atol + kFdTol.rtol * std::abs(fdb)) << "dbias " << i;
  }
}

TEST(Layernorm, BadArgumentsNameTheOpAndShapes) {
  Buf x(DType::fp32, 24), w(DType::fp32, 6), b(DType::fp32, 6), y(DType::fp32, 24), h(DType::bf16, 6);
  std::vector<float> m(4), r(4);
  expect_error(
      [&] {
        layernorm_forward(y.tensor({4, 6}), f32(m, {4}), f32(r, {4}), x.tensor({4, 6}), w.tensor({6}), b.tensor({3, 2}));
      },
      {"layernorm_forward", "bias", "[3, 2]", "[6]"});
  expect_error(
      [&] {
        layernorm_forward(y.tensor({4, 6}), f32(m, {4}), f32(r, {4}), x.tensor({4, 6}), h.tensor({6}), b.tensor({6}));
      },
      {"layernorm_forward", "bf16", "fp32"});
  expect_error(
      [&] {
        layernorm_forward(y.tensor({4, 6}), f32(m, {2, 2}), f32(r, {2}), x.tensor({4, 6}), w.tensor({6}), b.tensor({6}));
      },
      {"layernorm_forward", "mean", "[4, 6]"});
  expect_error(
      [&] {
        layernorm_forward(y.tensor({6, 4}), f32(m, {4}), f32(r, {4}), x.tensor({4, 6}), w.tensor({6}), b.tensor({6}));
      },
      {"layernorm_forward", "out", "[6, 4]", "[4, 6]"});
  Tensor gx(x.data(), DType::fp32, Shape{4, 6}, Device::cuda(0));
  expect_error(
      [&] {
        layernorm_forward(y.tensor({4, 6}), f32(m, {4}), f32(r, {4}), gx, w.tensor({6}), b.tensor({6}));
      },
      {"layernorm_forward", "cuda:0"});
  expect_error(
      [&] {
        fused_residual_layernorm_forward(y.tensor({4, 6}), y.tensor({4, 6}), f32(m, {4}), f32(r, {4}), x.tensor({4, 6}), x.tensor({2, 12}),
                                         w.tensor({6}), b.tensor({6}));
      },
      {"fused_residual_layernorm_forward", "[2, 12]", "[4, 6]"});
  expect_error(
      [&] {
        layernorm_backward(x.tensor({4, 6}), w.tensor({6}), b.tensor({6}), y.tensor({4, 6}), x.tensor({4, 6}), w.tensor({6}), f32(m, {4}),
                           f32(r, {4}));
      },
      {"layernorm_backward", "alias"});
}
