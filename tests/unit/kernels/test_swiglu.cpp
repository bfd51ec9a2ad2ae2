// SwiGLU against a double reference, finite differences, in-place forward and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/swiglu.h"
#include "swiglu_cases.h"

using namespace dstrain;
using namespace dstrain::test;

class SwigluTest : public ::testing::TestWithParam<DType> {};

TEST_P(SwigluTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kSwigluTols.of(dt);
  std::mt19937_64 rng(51);
  for (const SwigluCase& c : kSwigluCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.B * c.T * c.I;
    const Shape s{c.B, c.T, c.I};
    Buf gate(dt, n), up(dt, n), out(dt, n), dout(dt, n), dgate(dt, n), dup(dt, n);
    gate.fill_uniform(rng, -12, 12);
    up.fill_uniform(rng, -2, 2);
    dout.fill_uniform(rng, -1, 1);
    dgate.fill_uniform(rng, -1, 1);
    dup.fill_uniform(rng, -1, 1);
    auto want_dg = dgate.values(), want_du = dup.values();
    std::vector<double> want_out(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const double x = gate.get(i), u = up.get(i), d = dout.get(i);
      want_out[k] = silu_ref(x) * u;
      want_dg[k] += d * u * silu_grad_ref(x);
      want_du[k] += d * silu_ref(x);
    }
    swiglu_forward(out.tensor(s), gate.tensor(s), up.tensor(s));
    swiglu_backward(dgate.tensor(s), dup.tensor(s), dout.tensor(s), gate.tensor(s), up.tensor(s));
    expect_close(out, want_out, tol, "swiglu out " + dtype_label(dt));
    expect_close(dgate, want_dg, tol, "swiglu dgate " + dtype_label(dt));
    expect_close(dup, want_du, tol, "swiglu dup " + dtype_label(dt));
    // In place over gate gives the same bits.
    swiglu_forward(gate.tensor(s), gate.tensor(s), up.tensor(s));
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(gate.get(i), out.get(i)) << "in place " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SwigluTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Swiglu, FiniteDifferences) {
  std::mt19937_64 rng(52);
  const std::int64_t n = 40;
  const Shape s{n};
  Buf gate(DType::fp32, n), up(DType::fp32, n), out(DType::fp32, n), dout(DType::fp32, n), dgate(DType::fp32, n), dup(DType::fp32, n);
  gate.fill_uniform(rng, -6, 6);
  up.fill_uniform(rng, -2, 2);
  const auto proj = random_vec(rng, static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) dout.set(i, proj[static_cast<std::size_t>(i)]);
  swiglu_backward(dgate.tensor(s), dup.tensor(s), dout.tensor(s), gate.tensor(s), up.tensor(s));
  auto loss = [&] {
    swiglu_forward(out.tensor(s), gate.tensor(s), up.tensor(s));
    double l = 0;
    for (std::int64_t i = 0; i < n; ++i) l += proj[static_cast<std::size_t>(i)] * out.get(i);
    return l;
  };
  for (std::int64_t i = 0; i < n; ++i) {
    const double fg = central_difference(static_cast<float*>(gate.data()), i, 1e-2, loss);
    EXPECT_NEAR(dgate.get(i), fg, kFdTol.atol + kFdTol.rtol * std::abs(fg)) << "dgate " << i;
    const double fu = central_difference(static_cast<float*>(up.data()), i, 1e-2, loss);
    EXPECT_NEAR(dup.get(i), fu, kFdTol.atol + kFdTol.rtol * std::abs(fu)) << "dup " << i;
  }
}

TEST(Swiglu, BadArgumentsNameTheOpAndShapes) {
  Buf a(DType::fp32, 12), b(DType::fp32, 12), c(DType::fp32, 12), d(DType::fp32, 12), h(DType::bf16, 12);
  expect_error([&] { swiglu_forward(c.tensor({3, 4}), a.tensor({3, 4}), b.tensor({4, 3})); }, {"swiglu_forward", "up", "[4, 3]", "[3, 4]"});
  expect_error([&] { swiglu_forward(c.tensor({3, 4}), a.tensor({3, 4}), h.tensor({3, 4})); }, {"swiglu_forward", "bf16", "fp32"});
  expect_error([&] { swiglu_backward(a.tensor({12}), d.tensor({12}), c.tensor({12}), a.tensor({12}), b.tensor({12})); },
               {"swiglu_backward", "alias"});
  Tensor ga(a.data(), DType::fp32, Shape{12}, Device::cuda(0));
  expect_error([&] { swiglu_forward(c.tensor({12}), ga, b.tensor({12})); }, {"swiglu_forward", "cuda:0"});
}
