// GELU (tanh form) against a naive double reference and finite differences.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "dropout_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/gelu.h"

using namespace dstrain;
using namespace dstrain::test;

class GeluTest : public ::testing::TestWithParam<DType> {};

TEST_P(GeluTest, MatchesReference) {
  const DType dt = GetParam();
  const Tol tol = kGeluTols.of(dt);
  std::mt19937_64 rng(11);
  for (const GeluCase& c : kGeluCases) {
    SCOPED_TRACE(c.name);
    Buf x(dt, c.n), y(dt, c.n), dy(dt, c.n), dx(dt, c.n);
    x.fill_uniform(rng, -c.range, c.range);
    dy.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);
    const auto xv = x.values(), dyv = dy.values(), dx0 = dx.values();
    gelu_forward(y.tensor({c.n}), x.tensor({c.n}));
    gelu_backward(dx.tensor({c.n}), x.tensor({c.n}), dy.tensor({c.n}));
    std::vector<double> want_y(xv.size()), want_dx(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) {
      want_y[i] = gelu_ref(xv[i]);
      want_dx[i] = dx0[i] + gelu_grad_ref(xv[i]) * dyv[i];
    }
    expect_close(y, want_y, tol, "gelu out " + dtype_label(dt));
    expect_close(dx, want_dx, tol, "gelu dinp " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, GeluTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Gelu, InPlaceForward) {
  Buf x(DType::bf16, 9), y(DType::bf16, 9);
  for (int i = 0; i < 9; ++i) x.set(i, i - 4.0);
  gelu_forward(y.tensor({9}), x.tensor({9}));
  gelu_forward(x.tensor({9}), x.tensor({9}));
  for (int i = 0; i < 9; ++i) EXPECT_EQ(x.get(i), y.get(i));
}

TEST(Gelu, FiniteDifferences) {
  std::mt19937_64 rng(12);
  const std::int64_t n = 41;
  Buf x(DType::fp32, n), y(DType::fp32, n), dy(DType::fp32, n), dx(DType::fp32, n);
  x.fill_uniform(rng, -4, 4);
  const auto w = random_vec(rng, static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) dy.set(i, w[static_cast<std::size_t>(i)]);
  dx.fill(0);
  gelu_backward(dx.tensor({n}), x.tensor({n}), dy.tensor({n}));
  auto loss = [&] {
    gelu_forward(y.tensor({n}), x.tensor({n}));
    double l = 0;
    for (std::int64_t i = 0; i < n; ++i) l += w[static_cast<std::size_t>(i)] * y.get(i);
    return l;
  };
  auto* xs = static_cast<float*>(x.data());
  for (std::int64_t i = 0; i < n; ++i) {
    const double fd = central_difference(xs, i, 1e-2, loss);
    EXPECT_NEAR(dx.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << i;
  }
}

TEST(Gelu, BadArgumentsNameTheOpAndShapes) {
  Buf a(DType::fp32, 6), b(DType::fp32, 6), h(DType::bf16, 6);
  expect_error([&] { gelu_forward(b.tensor({2, 3}), a.tensor({3, 2})); }, {"gelu_forward", "[2, 3]", "[3, 2]"});
  expect_error([&] { gelu_backward(h.tensor({6}), a.tensor({6}), b.tensor({6})); }, {"gelu_backward", "bf16", "fp32"});
  Tensor gpu(a.data(), DType::fp32, Shape{6}, Device::cuda(1));
  expect_error([&] { gelu_forward(a.tensor({6}), gpu); }, {"gelu_forward", "cuda:1"});
  Buf i32(DType::int32, 6);
  expect_error([&] { gelu_forward(Tensor(i32.data(), DType::int32, Shape{6}), Tensor(i32.data(), DType::int32, Shape{6})); },
               {"gelu_forward", "int32"});
}

// Large pre-activations (a trained MLP reaches them): GELU'(x) -> 1 for x >> 0 and -> 0 for x << 0,
// finite everywhere. The exp of the tanh argument saturates for x > ~10.5, where an
// overflowing 4·e·inv·inv once gave NaN gradients in the middle of a training run.
TEST(Gelu, BackwardFiniteForLargeInputs) {
  std::vector<float> x{10.0f, 10.6f, 12.0f, 20.0f, 100.0f, 1e4f, -10.6f, -20.0f, -100.0f}, g(x.size(), 1.0f), d(x.size(), 0.0f);
  const dstrain::Shape s{static_cast<std::int64_t>(x.size())};
  dstrain::gelu_backward(dstrain::Tensor(d.data(), dstrain::DType::fp32, s), dstrain::Tensor(x.data(), dstrain::DType::fp32, s),
                         dstrain::Tensor(g.data(), dstrain::DType::fp32, s));
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(std::isfinite(d[i])) << "x = " << x[i];
    EXPECT_NEAR(d[i], x[i] > 0 ? 1.0f : 0.0f, 1e-5f) << "x = " << x[i];
  }
}
