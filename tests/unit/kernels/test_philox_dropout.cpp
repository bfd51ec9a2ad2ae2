// Philox4x32-10 against Random123's known-answer vectors; dropout against a naive reference,
// keep-rate statistics, mask reproducibility, finite differences and argument errors.
#include <cmath>
#include <cstdint>
#include <random>

#include <gtest/gtest.h>

#include "dropout_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/philox.h"

using namespace dstrain;
using namespace dstrain::test;

// Compile-time evaluation works (CUDA device code relies on the same constexpr path).
static_assert(philox4x32_10(PhiloxCounter{{0, 0, 0, 0}}, PhiloxKey{{0, 0}}).v[0] == 0x6627e8d5u);

TEST(Philox, KnownAnswerVectors) {
  for (const PhiloxKat& k : kPhiloxKats) {
    const PhiloxCounter r = philox4x32_10(PhiloxCounter{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, PhiloxKey{{k.key[0], k.key[1]}});
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.out[i]) << "word " << i << " of KAT with ctr[0]=" << std::hex << k.ctr[0];
  }
}

TEST(Philox, UniformRange) {
  EXPECT_EQ(philox_uniform(0u), 0.0f);
  EXPECT_LT(philox_uniform(0xffffffffu), 1.0f);
  EXPECT_EQ(philox_uniform(0x80000000u), 0.5f);
}

TEST(Philox, AddressingFieldsChangeTheStream) {
  const RngKey a{42, 7, 3, 1, 2};
  RngKey b = a;
  b.step = 8;
  RngKey c = a;
  c.site = 4;
  RngKey d = a;
  d.micro_batch = 2;
  RngKey e = a;
  e.seed = 43;
  RngKey f = a;
  f.layer = 4;
  for (const RngKey& o : {b, c, d, e, f}) EXPECT_NE(a.element_bits(5), o.element_bits(5));
  EXPECT_NE(a.element_bits(4ull << 32), a.element_bits(0));  // high group bits are used
  EXPECT_NE(a.element_bits(0), a.element_bits(1));
  EXPECT_NE(a.element_bits(3), a.element_bits(4));  // neighbouring groups
}

namespace {

// Independent reference of the documented addressing:
// counter {g lo, g hi | site << 16, step, layer << 16 | micro_batch}, key {seed lo, seed hi}.
bool ref_keep(const RngKey& k, std::uint64_t i, float p) {
  const std::uint64_t g = i / 4;
  const PhiloxCounter c{
      {static_cast<std::uint32_t>(g & 0xffffffffu), static_cast<std::uint32_t>(g >> 32) + k.site * 65536u, k.step, k.layer * 65536u + k.micro_batch}};
  const PhiloxKey key{{static_cast<std::uint32_t>(k.seed & 0xffffffffu), static_cast<std::uint32_t>(k.seed >> 32)}};
  const std::uint32_t bits = philox4x32_10(c, key).v[i % 4];
  const double u = static_cast<double>(bits >> 8) / 16777216.0;
  return u >= p;
}

}  // namespace

class DropoutTest : public ::testing::TestWithParam<DType> {};

TEST_P(DropoutTest, MatchesReferenceForwardAndBackward) {
  const DType dt = GetParam();
  const Tol tol = kDropoutTols.of(dt);
  std::mt19937_64 rng(1);
  for (const DropoutCase& c : kDropoutCases) {
    SCOPED_TRACE(c.name);
    DropoutParams params{c.p, RngKey{0x123456789abcdefull, 11, 5, 2, 3}};
    Buf x(dt, c.n), y(dt, c.n), dy(dt, c.n), dx(dt, c.n);
    x.fill_uniform(rng, -2, 2);
    dy.fill_uniform(rng, -1, 1);
    dx.fill_uniform(rng, -1, 1);
    const std::vector<double> xv = x.values(), dyv = dy.values(), dx0 = dx.values();
    dropout_forward(y.tensor({c.n}), x.tensor({c.n}), params);
    dropout_backward(dx.tensor({c.n}), dy.tensor({c.n}), params);
    std::vector<double> want_y(xv.size()), want_dx(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const double m = ref_keep(params.rng, i, c.p) ? 1.0 / (1.0 - static_cast<double>(c.p)) : 0.0;
      want_y[i] = xv[i] * m;
      want_dx[i] = dx0[i] + dyv[i] * m;
    }
    expect_close(y, want_y, tol, "dropout out " + dtype_label(dt));
    expect_close(dx, want_dx, Tol{tol.atol + 1e-6, tol.rtol * 2 + 1e-6}, "dropout dinp " + dtype_label(dt));
  }
}

TEST_P(DropoutTest, InPlaceForwardEqualsOutOfPlace) {
  const DType dt = GetParam();
  std::mt19937_64 rng(2);
  const std::int64_t n = 1003;
  DropoutParams params{0.3f, RngKey{9, 1, 0, 0, 0}};
  Buf x(dt, n), y(dt, n);
  x.fill_uniform(rng, -1, 1);
  dropout_forward(y.tensor({n}), x.tensor({n}), params);
  dropout_forward(x.tensor({n}), x.tensor({n}), params);
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(x.get(i), y.get(i)) << i;
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DropoutTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Dropout, ZeroProbabilityIsBitwiseIdentity) {
  std::mt19937_64 rng(3);
  const std::int64_t n = 517;
  Buf x(DType::fp32, n), y(DType::fp32, n);
  x.fill_uniform(rng, -3, 3);
  dropout_forward(y.tensor({n}), x.tensor({n}), DropoutParams{0.0f, RngKey{}});
  for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(x.get(i), y.get(i));
}

TEST(Dropout, KeepRateStatistics) {
  const std::int64_t n = 200000;
  Buf x(DType::fp32, n), y(DType::fp32, n);
  x.fill(1.0);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    dropout_forward(y.tensor({n}), x.tensor({n}), DropoutParams{p, RngKey{2024, 3, 1, 0, 0}});
    std::int64_t kept = 0;
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      kept += y.get(i) != 0.0;
      sum += y.get(i);
    }
    const double rate = static_cast<double>(kept) / static_cast<double>(n);
    const double sigma = std::sqrt(p * (1.0 - p) / static_cast<double>(n));
    EXPECT_NEAR(rate, 1.0 - p, 5 * sigma) << "p = " << p;
    EXPECT_NEAR(sum / static_cast<double>(n), 1.0, 5 * sigma / (1.0 - p)) << "expectation is kept, p = " << p;
  }
}

TEST(Dropout, SameMaskOnRecomputeDifferentMaskOnNextStep) {
  const std::int64_t n = 4096;
  Buf x(DType::fp32, n), y1(DType::fp32, n), y2(DType::fp32, n), y3(DType::fp32, n), dy(DType::fp32, n), dx(DType::fp32, n);
  x.fill(1.0);
  dy.fill(1.0);
  dx.fill(0.0);
  const DropoutParams p{0.5f, RngKey{77, 10, 2, 0, 0}};
  DropoutParams next = p;
  next.rng.step = 11;
  dropout_forward(y1.tensor({n}), x.tensor({n}), p);
  dropout_forward(y2.tensor({n}), x.tensor({n}), p);
  dropout_forward(y3.tensor({n}), x.tensor({n}), next);
  dropout_backward(dx.tensor({n}), dy.tensor({n}), p);
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(y1.get(i), y2.get(i));
    EXPECT_EQ(y1.get(i) != 0.0, dx.get(i) != 0.0) << "backward mask equals forward mask at " << i;
    differ += (y1.get(i) != 0.0) != (y3.get(i) != 0.0);
  }
  EXPECT_GT(differ, n / 4);  // about half differ for p = 0.5
}

TEST(Dropout, FiniteDifferences) {
  std::mt19937_64 rng(5);
  const std::int64_t n = 37;
  const DropoutParams p{0.25f, RngKey{5, 5, 5, 5, 0}};
  Buf x(DType::fp32, n), y(DType::fp32, n), dy(DType::fp32, n), dx(DType::fp32, n);
  x.fill_uniform(rng, -1, 1);
  const std::vector<double> w = random_vec(rng, static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) dy.set(i, w[static_cast<std::size_t>(i)]);
  dx.fill(0);
  dropout_backward(dx.tensor({n}), dy.tensor({n}), p);
  auto loss = [&] {
    dropout_forward(y.tensor({n}), x.tensor({n}), p);
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

TEST(Dropout, BadArgumentsNameTheOpAndShapes) {
  Buf a(DType::fp32, 6), b(DType::fp32, 5), h(DType::fp16, 6);
  expect_error([&] { dropout_forward(b.tensor({5}), a.tensor({6}), DropoutParams{0.1f, {}}); }, {"dropout_forward", "[5]", "[6]"});
  expect_error([&] { dropout_forward(h.tensor({6}), a.tensor({6}), DropoutParams{0.1f, {}}); }, {"dropout_forward", "fp16", "fp32"});
  expect_error([&] { dropout_forward(a.tensor({6}), a.tensor({6}), DropoutParams{1.0f, {}}); }, {"dropout_forward", "p = 1"});
  expect_error([&] { dropout_backward(a.tensor({6}), a.tensor({6}), DropoutParams{0.1f, {}}); }, {"dropout_backward", "alias"});
  Tensor gpu(a.data(), DType::fp32, Shape{6}, Device::cuda(0));
  expect_error([&] { dropout_forward(gpu, a.tensor({6}), DropoutParams{0.1f, {}}); }, {"dropout_forward", "cuda:0"});
  RngKey bad{};
  bad.layer = 70000;
  expect_error([&] { dropout_forward(a.tensor({6}), a.tensor({6}), DropoutParams{0.1f, bad}); }, {"dropout_forward", "layer = 70000"});
}
