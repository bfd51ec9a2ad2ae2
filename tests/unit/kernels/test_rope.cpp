// RoPE: frequencies against values computed with PyTorch from transformers' modeling_rope_utils
// formulas (default, linear, llama3), the rotation against a double reference, the backward as
// the transposed rotation, in-place use on a fused q|k|v layout, and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/rope.h"
#include "rope_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Tensor f32(std::vector<float>& v) { return Tensor(v.data(), DType::fp32, Shape{static_cast<std::int64_t>(v.size())}); }

void expect_freqs(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 2e-6 * std::abs(want[j])) << what << " j=" << j;
}

}  // namespace

// Values from /usr/bin/python3 with torch 1.13, transformers' _compute_default_rope_parameters /
// _compute_linear_scaling_rope_parameters / _compute_llama3_parameters written out term for term
// (head_dim 16, rope_theta 10000; llama3: factor 8, low 1, high 4, original 64, so the three
// bands all occur: j = 0 kept, j = 1, 2 smoothed, j >= 3 divided by the factor).
TEST(Rope, InvFreqMatchesTransformers) {
  expect_freqs(rope_inv_freq(16, 10000.0, {RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 64.0}),
               {1.000000000e+00, 2.443845868e-01, 1.304225624e-02, 3.952847328e-03, 1.249999972e-03, 3.952847328e-04, 1.250000059e-04,
                3.952847328e-05},
               "llama3");
  expect_freqs(rope_inv_freq(16, 10000.0, {RopeScaling::Kind::linear, 4.0}),
               {2.500000000e-01, 7.905694097e-02, 2.500000037e-02, 7.905694656e-03, 2.499999944e-03, 7.905694656e-04, 2.500000119e-04,
                7.905694656e-05},
               "linear");
  std::vector<double> plain;
  for (int j = 0; j < 8; ++j) plain.push_back(std::pow(10000.0, -2.0 * j / 16.0));
  expect_freqs(rope_inv_freq(16, 10000.0), plain, "default");
}

class RopeTest : public ::testing::TestWithParam<DType> {};

TEST_P(RopeTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kRopeTols.of(dt);
  std::mt19937_64 rng(61);
  for (const RopeCase& c : kRopeCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.B * c.T * c.H * c.D;
    const Shape s{c.B, c.T, c.H, c.D};
    std::vector<float> freq = rope_inv_freq(c.D, c.theta, c.scaling);
    Buf x(dt, n), y(dt, n), g(dt, n), dx(dt, n);
    x.fill_uniform(rng, -2, 2);
    g.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);  // overwritten: rope_backward writes
    rope_forward(y.tensor(s), x.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    rope_backward(dx.tensor(s), g.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    expect_close(y, rope_ref(x.values(), freq, c, 1.0), tol, "rope out " + dtype_label(dt));
    expect_close(dx, rope_ref(g.values(), freq, c, -1.0), tol, "rope dinp " + dtype_label(dt));
    // The heads past rotate_heads are copied bit for bit.
    for (std::int64_t i = 0; i < n; ++i) {
      if ((i / c.D) % c.H >= c.rotate_heads) {
        ASSERT_EQ(y.get(i), x.get(i)) << "unrotated head element " << i;
      }
    }
    // In place gives the same bits.
    Buf z(dt, n);
    for (std::int64_t i = 0; i < n; ++i) z.set(i, x.get(i));
    rope_forward(z.tensor(s), z.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(z.get(i), y.get(i)) << "in place " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RopeTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// The backward is the adjoint of the forward: <R x, g> = <x, R^T g>, and R^T R = I.
TEST(Rope, BackwardIsTheTransposedRotation) {
  std::mt19937_64 rng(62);
  for (const RopeCase& c : kRopeCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.B * c.T * c.H * c.D;
    const Shape s{c.B, c.T, c.H, c.D};
    std::vector<float> freq = rope_inv_freq(c.D, c.theta, c.scaling);
    Buf x(DType::fp32, n), y(DType::fp32, n), g(DType::fp32, n), dx(DType::fp32, n), back(DType::fp32, n);
    x.fill_uniform(rng, -1, 1);
    g.fill_uniform(rng, -1, 1);
    rope_forward(y.tensor(s), x.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    rope_backward(dx.tensor(s), g.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    double lhs = 0, rhs = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      lhs += y.get(i) * g.get(i);
      rhs += x.get(i) * dx.get(i);
    }
    EXPECT_NEAR(lhs, rhs, 1e-5 * static_cast<double>(n));
    rope_backward(back.tensor(s), y.tensor(s), f32(freq), c.rotate_heads, c.pos_offset);
    expect_close(back, x.values(), Tol{1e-5, 1e-5}, "R^T R x");
  }
}

TEST(Rope, BadArgumentsNameTheOpAndShapes) {
  Buf x(DType::fp32, 2 * 3 * 2 * 4), y(DType::fp32, 2 * 3 * 2 * 4), h(DType::bf16, 2 * 3 * 2 * 4);
  std::vector<float> freq(2), freq3(3);
  expect_error([&] { rope_forward(y.tensor({2, 3, 2, 4}), x.tensor({2, 3, 2, 4}), f32(freq3), 2); }, {"rope_forward", "inv_freq", "[3]", "[2]"});
  expect_error([&] { rope_forward(y.tensor({2, 3, 2, 4}), x.tensor({2, 3, 2, 4}), f32(freq), 3); }, {"rope_forward", "rotate_heads = 3", "H = 2"});
  expect_error([&] { rope_forward(y.tensor({2, 3, 8, 1}), x.tensor({2, 3, 8, 1}), f32(freq), 1); }, {"rope_forward", "even"});
  expect_error([&] { rope_forward(h.tensor({2, 3, 2, 4}), x.tensor({2, 3, 2, 4}), f32(freq), 2); }, {"rope_forward", "bf16", "fp32"});
  expect_error([&] { rope_backward(y.tensor({6, 8}), x.tensor({6, 8}), f32(freq), 1); }, {"rope_backward", "(B, T, H, D)"});
  expect_error([&] { rope_inv_freq(15, 10000.0); }, {"head_dim", "15"});
  expect_error([&] { rope_inv_freq(16, 10000.0, {RopeScaling::Kind::llama3, 8.0, 4.0, 1.0, 64.0}); }, {"llama3", "high_freq_factor"});
  expect_error([&] { rope_inv_freq(16, 10000.0, {RopeScaling::Kind::linear, 0.0}); }, {"rope_scaling.factor"});
}
