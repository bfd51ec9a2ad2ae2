// grad_norm_overflow against a naive double loop; inf / NaN anywhere (first, last, middle element,
// fp16 / bf16 infinities and overflow to inf on conversion); thread-count invariance; the
// un-scale / clip divisor against the formula of docs/precision.md §7; scale_grads; bad inputs.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "grad_norm_overflow_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/grad_norm_overflow.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

double naive_norm_sq(const Buf& g) {
  double s = 0;
  for (std::int64_t i = 0; i < g.size(); ++i) s += g.get(i) * g.get(i);
  return s;
}

}  // namespace

class GradNormOverflowTest : public ::testing::TestWithParam<DType> {};

TEST_P(GradNormOverflowTest, MatchesNaiveDoubleSum) {
  const DType dt = GetParam();
  std::mt19937_64 rng(5);
  for (const auto& c : kGradNormOverflowCases) {
    SCOPED_TRACE(c.name);
    Buf g(dt, c.n);
    g.fill_uniform(rng, -3, 3);
    const GradNormOverflow r = grad_norm_overflow(g.tensor({c.n}));
    const double want = naive_norm_sq(g);
    EXPECT_NEAR(r.norm_sq, want, kGradNormOverflowTol.rtol * want);
    EXPECT_EQ(r.nonfinite, 0.0);
    EXPECT_FALSE(r.overflow());
    EXPECT_NEAR(r.norm(), std::sqrt(want), 1e-12 * std::sqrt(want));
  }
}

// Hand-checked: 3² + 4² = 25, and a 2-D shape is read flat.
TEST_P(GradNormOverflowTest, SmallExactValues) {
  Buf g(GetParam(), 4);
  g.set(0, 3);
  g.set(1, 0);
  g.set(2, -4);
  g.set(3, 0);
  const auto r = grad_norm_overflow(g.tensor({2, 2}));
  EXPECT_EQ(r.norm_sq, 25.0);
  EXPECT_EQ(r.norm(), 5.0);
}

TEST_P(GradNormOverflowTest, InfAndNanAnywhere) {
  const DType dt = GetParam();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{13}, std::int64_t{4096 * 3 + 5}}) {
    for (const std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
      for (const double bad : {inf, -inf, nan}) {
        SCOPED_TRACE(testing::Message() << "n " << n << " at " << at << " value " << bad);
        Buf g(dt, n);
        g.fill(0.5);
        g.set(at, bad);
        const auto r = grad_norm_overflow(g.tensor({n}));
        EXPECT_TRUE(r.overflow());
        EXPECT_EQ(r.nonfinite, 1.0);
      }
    }
  }
}

TEST_P(GradNormOverflowTest, CountsEveryNonFiniteElement) {
  Buf g(GetParam(), 10000);
  g.fill(1.0);
  for (std::int64_t i : {0, 17, 4095, 4096, 9999}) g.set(i, std::numeric_limits<double>::infinity());
  g.set(5000, std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(grad_norm_overflow(g.tensor({10000})).nonfinite, 6.0);
}

TEST_P(GradNormOverflowTest, SameBitsForAnyThreadCount) {
  const DType dt = GetParam();
  std::mt19937_64 rng(9);
  const std::int64_t n = 256 * 4096 + 12345;
  Buf g(dt, n);
  g.fill_uniform(rng, -1, 1);
  const int saved = omp_get_max_threads();
  std::vector<double> got;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    got.push_back(grad_norm_overflow(g.tensor({n})).norm_sq);
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&got[0], &got[2], sizeof(double)), 0);
}

INSTANTIATE_TEST_SUITE_P(AllGradDTypes, GradNormOverflowTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// Values that are finite in fp32 but whose squares overflow fp32 are not an overflow: the
// squares are summed in double.
TEST(GradNormOverflow, LargeFiniteFp32IsNotAnOverflow) {
  Buf g(DType::fp32, 2);
  g.set(0, 3e38);
  g.set(1, -3e38);
  const auto r = grad_norm_overflow(g.tensor({2}));
  EXPECT_FALSE(r.overflow());
  EXPECT_NEAR(r.norm_sq, 2 * 9e76, 1e-6 * 18e76);
}

// 16-bit infinities as they arrive from the backward pass: fp16 0x7c00 / 0xfc00, bf16 0x7f80.
TEST(GradNormOverflow, SixteenBitInfinityBitPatterns) {
  std::vector<std::uint16_t> h = {0x3c00, 0x7c00, 0x3c00};  // 1, +inf, 1
  EXPECT_TRUE(grad_norm_overflow(Tensor(h.data(), DType::fp16, Shape{3})).overflow());
  h[1] = 0xfc00;  // -inf
  EXPECT_TRUE(grad_norm_overflow(Tensor(h.data(), DType::fp16, Shape{3})).overflow());
  h[1] = 0x7bff;  // 65504, the largest finite fp16
  const auto r = grad_norm_overflow(Tensor(h.data(), DType::fp16, Shape{3}));
  EXPECT_FALSE(r.overflow());
  EXPECT_EQ(r.norm_sq, 65504.0 * 65504.0 + 2.0);
  std::vector<std::uint16_t> b = {0x3f80, 0x7f80};  // bf16 1, +inf
  EXPECT_TRUE(grad_norm_overflow(Tensor(b.data(), DType::bf16, Shape{2})).overflow());
  b[1] = 0x7fc1;  // bf16 NaN
  EXPECT_TRUE(grad_norm_overflow(Tensor(b.data(), DType::bf16, Shape{2})).overflow());
}

// Partition results combine by summing both fields (one all-reduce SUM of two doubles).
TEST(GradNormOverflow, PartitionsCombineBySum) {
  std::mt19937_64 rng(11);
  const std::int64_t n = 30000;
  Buf g(DType::fp32, n);
  g.fill_uniform(rng, -1, 1);
  g.set(20000, std::numeric_limits<double>::infinity());
  auto* base = static_cast<float*>(g.data());
  GradNormOverflow total;
  for (std::int64_t lo = 0; lo < n; lo += 10000) total += grad_norm_overflow(Tensor(base + lo, DType::fp32, Shape{10000}));
  EXPECT_EQ(total.nonfinite, 1.0);
  g.set(20000, 0.0);
  GradNormOverflow clean;
  for (std::int64_t lo = 0; lo < n; lo += 10000) clean += grad_norm_overflow(Tensor(base + lo, DType::fp32, Shape{10000}));
  const double want = naive_norm_sq(g);
  EXPECT_NEAR(clean.norm_sq, want, 1e-12 * want);
}

TEST(GradNormOverflow, EmptyBufferIsZero) {
  const auto r = grad_norm_overflow(Tensor(nullptr, DType::fp32, Shape{0}));
  EXPECT_EQ(r.norm_sq, 0.0);
  EXPECT_FALSE(r.overflow());
}

TEST(GradNormOverflow, BadInputs) {
  std::vector<std::int32_t> ints(4, 1);
  expect_error([&] { grad_norm_overflow(Tensor(ints.data(), DType::int32, Shape{4})); }, {"grad_norm_overflow", "grads", "fp32, fp16 or bf16"});
  expect_error([&] { grad_norm_overflow(Tensor(nullptr, DType::fp32, Shape{4})); }, {"grad_norm_overflow", "grads", "null"});
  expect_error([&] { scale_grads(Tensor(ints.data(), DType::int32, Shape{4}), 2.0f); }, {"scale_grads", "grads"});
}

// docs/precision.md §7: clip = (N_s / S + 1e-6) / c; divide by clip·S when clip > 1, else by S.
TEST(UnscaleClipDivisor, ReferenceFormula) {
  // Scaled norm 3000 at scale 1000: true norm 3. Clip 1: clip = (3 + 1e-6) / 1 > 1.
  EXPECT_DOUBLE_EQ(unscale_clip_divisor(3000.0 * 3000.0, 1000.0, 1.0), (3.0 + 1e-6) * 1000.0);
  // True norm 0.5 < clip 1: only un-scaling.
  EXPECT_EQ(unscale_clip_divisor(500.0 * 500.0, 1000.0, 1.0), 1000.0);
  // Clipping off (0 or negative).
  EXPECT_EQ(unscale_clip_divisor(1e12, 1000.0, 0.0), 1000.0);
  EXPECT_EQ(unscale_clip_divisor(1e12, 1000.0, -1.0), 1000.0);
  // No loss scale (bf16): divisor = ||g|| + 1e-6 over c when clipping.
  EXPECT_DOUBLE_EQ(unscale_clip_divisor(16.0, 1.0, 2.0), (4.0 + 1e-6) / 2.0);
}

TEST(ScaleGrads, MultipliesAndRoundsOnce) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(dtype_label(dt));
    std::mt19937_64 rng(3);
    Buf g(dt, 5000);
    g.fill_uniform(rng, -4, 4);
    const auto before = g.values();
    const float factor = 1.0f / 3.0f;
    scale_grads(g.tensor({5000}), factor);
    Buf want(dt, 1);
    for (std::int64_t i = 0; i < 5000; ++i) {
      // fp32 product, then one round-to-nearest-even into the storage dtype.
      want.set(0, static_cast<double>(static_cast<float>(before[static_cast<std::size_t>(i)]) * factor));
      ASSERT_EQ(g.get(i), want.get(0)) << i;
    }
  }
}
