// Causal multi-head attention against a naive double reference that materialises the T×T
// probabilities (the textbook algorithm, independent of the kernel's flash-style recompute),
// finite differences with and without dropout, and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attention_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/philox.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

struct RefAtt {
  std::vector<double> out, lse, dqkv;
};

// Reference in double; dqkv starts from dqkv0 (the kernel accumulates). qkv rows are
// [q (NH·HS) | k (NKV·HS) | v (NKV·HS)]; query head h uses KV head h / (NH / NKV), written as
// Hugging Face's repeat_kv does it (the KV head index of each query head), NKV = NH for GPT-2.
// window > 0: query i sees keys i - window < j <= i only (every other probability is 0).
RefAtt ref_attention(const std::vector<double>& qkv, const std::vector<double>& dout, const std::vector<double>& dqkv0, std::int64_t B,
                     std::int64_t T, std::int64_t C, std::int64_t NH, const DropoutParams& dp, std::int64_t NKV = 0, std::int64_t window = 0) {
  if (NKV == 0) NKV = NH;
  const std::int64_t HS = C / NH, C3 = C + 2 * NKV * HS, KOFF = C, VOFF = C + NKV * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  RefAtt r{std::vector<double>(static_cast<std::size_t>(B * T * C)), std::vector<double>(static_cast<std::size_t>(B * NH * T)), dqkv0};
  auto at = [](const std::vector<double>& v, std::int64_t i) { return v[static_cast<std::size_t>(i)]; };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < NH; ++h) {
      const std::int64_t kvh = h / (NH / NKV);
      std::vector<double> P(static_cast<std::size_t>(T * T), 0.0), M(static_cast<std::size_t>(T * T), 0.0);
      auto q = [&](std::int64_t t, std::int64_t d) { return at(qkv, (b * T + t) * C3 + h * HS + d); };
      auto k = [&](std::int64_t t, std::int64_t d) { return at(qkv, (b * T + t) * C3 + KOFF + kvh * HS + d); };
      auto v = [&](std::int64_t t, std::int64_t d) { return at(qkv, (b * T + t) * C3 + VOFF + kvh * HS + d); };
      auto go = [&](std::int64_t t, std::int64_t d) { return at(dout, (b * T + t) * C + h * HS + d); };
      auto first_key = [&](std::int64_t i) { return window > 0 ? std::max<std::int64_t>(0, i - window + 1) : std::int64_t{0}; };
      for (std::int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        std::vector<double> s(static_cast<std::size_t>(i + 1));
        for (std::int64_t j = first_key(i); j <= i; ++j) {
          double acc = 0;
          for (std::int64_t d = 0; d < HS; ++d) acc += q(i, d) * k(j, d);
          s[static_cast<std::size_t>(j)] = acc * scale;
          mx = std::max(mx, acc * scale);
        }
        double sum = 0;
        for (std::int64_t j = first_key(i); j <= i; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        r.lse[static_cast<std::size_t>((b * NH + h) * T + i)] = mx + std::log(sum);
        for (std::int64_t j = first_key(i); j <= i; ++j) {
          P[static_cast<std::size_t>(i * T + j)] = std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
          double m = 1.0;
          if (dp.p > 0) {
            const std::uint64_t e = static_cast<std::uint64_t>(((b * NH + h) * T + i) * T + j);
            const std::uint32_t bits = philox4x32_10(dp.rng.counter(e / 4), dp.rng.key()).v[e % 4];
            m = (static_cast<double>(bits >> 8) / 16777216.0 >= dp.p) ? 1.0 / (1.0 - dp.p) : 0.0;
          }
          M[static_cast<std::size_t>(i * T + j)] = m;
        }
        for (std::int64_t d = 0; d < HS; ++d) {
          double acc = 0;
          for (std::int64_t j = 0; j <= i; ++j) acc += P[static_cast<std::size_t>(i * T + j)] * M[static_cast<std::size_t>(i * T + j)] * v(j, d);
          r.out[static_cast<std::size_t>((b * T + i) * C + h * HS + d)] = acc;
        }
      }
      // Backward: dPd = dout vᵀ; dV = (P∘M)ᵀ dout; dP = dPd∘M; dS = P∘(dP - rowsum(P∘dP)).
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> dP(static_cast<std::size_t>(i + 1));
        double rs = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (std::int64_t d = 0; d < HS; ++d) acc += go(i, d) * v(j, d);
          dP[static_cast<std::size_t>(j)] = acc * M[static_cast<std::size_t>(i * T + j)];
          rs += P[static_cast<std::size_t>(i * T + j)] * dP[static_cast<std::size_t>(j)];
        }
        for (std::int64_t j = 0; j <= i; ++j) {
          const double pij = P[static_cast<std::size_t>(i * T + j)];
          const double ds = pij * (dP[static_cast<std::size_t>(j)] - rs) * scale;
          for (std::int64_t d = 0; d < HS; ++d) {
            r.dqkv[static_cast<std::size_t>((b * T + i) * C3 + h * HS + d)] += ds * k(j, d);
            r.dqkv[static_cast<std::size_t>((b * T + j) * C3 + KOFF + kvh * HS + d)] += ds * q(i, d);
            r.dqkv[static_cast<std::size_t>((b * T + j) * C3 + VOFF + kvh * HS + d)] += pij * M[static_cast<std::size_t>(i * T + j)] * go(i, d);
          }
        }
      }
    }
  return r;
}

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }

}  // namespace

class AttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kAttentionTols.of(dt);
  std::mt19937_64 rng(51);
  for (const AttentionCase& c : kAttentionCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, NH = c.NH;
    const DropoutParams dp{c.dropout_p, RngKey{99, 3, 7, 1, 0}};
    Buf qkv(dt, B * T * 3 * C), out(dt, B * T * C), dout(dt, B * T * C), dqkv(dt, B * T * 3 * C);
    qkv.fill_uniform(rng, -1.5, 1.5);
    dout.fill_uniform(rng, -1, 1);
    dqkv.fill_uniform(rng, -1, 1);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    const RefAtt ref = ref_attention(qkv.values(), dout.values(), dqkv.values(), B, T, C, NH, dp);
    attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
    attention_backward(dqkv.tensor({B, T, 3 * C}), dout.tensor({B, T, C}), qkv.tensor({B, T, 3 * C}), out.tensor({B, T, C}), f32(lse, {B, NH, T}), NH,
                       f32(scratch, {static_cast<std::int64_t>(scratch.size())}), dp);
    expect_close(out, ref.out, tol, "attention out " + dtype_label(dt));
    expect_close(std::vector<double>(lse.begin(), lse.end()), ref.lse, Tol{1e-4, 1e-5}, "attention lse");
    // The kernel's D_i uses the stored (rounded) out: allow a few output roundings more.
    expect_close(dqkv, ref.dqkv, Tol{tol.atol * 4, tol.rtol * 2}, "attention dqkv " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, AttentionTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

class GqaAttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(GqaAttentionTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kAttentionTols.of(dt);
  std::mt19937_64 rng(54);
  for (const GqaAttentionCase& c : kGqaAttentionCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
    const DropoutParams dp{c.dropout_p, RngKey{98, 4, 6, 2, 0}};
    Buf qkv(dt, B * T * W), out(dt, B * T * C), dout(dt, B * T * C), dqkv(dt, B * T * W);
    qkv.fill_uniform(rng, -1.5, 1.5);
    dout.fill_uniform(rng, -1, 1);
    dqkv.fill_uniform(rng, -1, 1);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    const RefAtt ref = ref_attention(qkv.values(), dout.values(), dqkv.values(), B, T, C, NH, dp, NKV);
    attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, dp);
    attention_backward(dqkv.tensor({B, T, W}), dout.tensor({B, T, C}), qkv.tensor({B, T, W}), out.tensor({B, T, C}), f32(lse, {B, NH, T}), {NH, NKV},
                       f32(scratch, {static_cast<std::int64_t>(scratch.size())}), dp);
    expect_close(out, ref.out, tol, "gqa attention out " + dtype_label(dt));
    expect_close(std::vector<double>(lse.begin(), lse.end()), ref.lse, Tol{1e-4, 1e-5}, "gqa attention lse");
    // dk/dv sum over the G query heads of a group: a few more roundings than multi-head.
    expect_close(dqkv, ref.dqkv, Tol{tol.atol * 6, tol.rtol * 3}, "gqa attention dqkv " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, GqaAttentionTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// Mistral's sliding window (query i sees keys i - W < j <= i): windows of 1 (each query only
// itself), within one 32-key block, across block edges, longer than a block (whole key blocks
// skipped in forward, query ranges cut in backward), with dropout, and W >= T (plain causal).
struct WindowAttentionCase {
  const char* name;
  std::int64_t B, T, NH, NKV, HS, window;
  float dropout_p;
};
constexpr WindowAttentionCase kWindowAttentionCases[] = {
    {"win1", 1, 9, 2, 1, 8, 1, 0.0f},
    {"win3_mqa", 2, 21, 4, 1, 8, 3, 0.0f},
    {"win5_kv2_blocks", 1, 70, 4, 2, 16, 5, 0.0f},
    {"win40_longer_than_a_block", 1, 100, 2, 2, 8, 40, 0.0f},
    {"win7_dropout", 2, 37, 4, 2, 6, 7, 0.2f},
    {"win_equals_T", 1, 19, 2, 1, 8, 19, 0.0f},
};

class WindowAttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(WindowAttentionTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kAttentionTols.of(dt);
  std::mt19937_64 rng(57);
  for (const WindowAttentionCase& c : kWindowAttentionCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
    const DropoutParams dp{c.dropout_p, RngKey{97, 4, 6, 2, 0}};
    Buf qkv(dt, B * T * W), out(dt, B * T * C), dout(dt, B * T * C), dqkv(dt, B * T * W);
    qkv.fill_uniform(rng, -1.5, 1.5);
    dout.fill_uniform(rng, -1, 1);
    dqkv.fill_uniform(rng, -1, 1);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    const RefAtt ref = ref_attention(qkv.values(), dout.values(), dqkv.values(), B, T, C, NH, dp, NKV, c.window);
    attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, dp, c.window);
    attention_backward(dqkv.tensor({B, T, W}), dout.tensor({B, T, C}), qkv.tensor({B, T, W}), out.tensor({B, T, C}), f32(lse, {B, NH, T}), {NH, NKV},
                       f32(scratch, {static_cast<std::int64_t>(scratch.size())}), dp, c.window);
    expect_close(out, ref.out, tol, "window attention out " + dtype_label(dt));
    expect_close(std::vector<double>(lse.begin(), lse.end()), ref.lse, Tol{1e-4, 1e-5}, "window attention lse");
    expect_close(dqkv, ref.dqkv, Tol{tol.atol * 6, tol.rtol * 3}, "window attention dqkv " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, WindowAttentionTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// A window of one key: each query attends only to itself, so out = v of its own position exactly
// (the probability is 1) — a check that does not go through the reference's own masking.
TEST(WindowAttention, WindowOfOneCopiesV) {
  std::mt19937_64 rng(58);
  const std::int64_t B = 2, T = 40, NH = 4, NKV = 2, HS = 8, C = NH * HS, W = (NH + 2 * NKV) * HS;
  Buf qkv(DType::fp32, B * T * W), out(DType::fp32, B * T * C);
  qkv.fill_uniform(rng, -3, 3);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T));
  attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, {}, 1);
  for (std::int64_t bt = 0; bt < B * T; ++bt)
    for (std::int64_t h = 0; h < NH; ++h)
      for (std::int64_t d = 0; d < HS; ++d)
        ASSERT_NEAR(out.get(bt * C + h * HS + d), qkv.get(bt * W + C + NKV * HS + (h / 2) * HS + d), 1e-6) << bt << " " << h << " " << d;
  expect_error(
      [&] {
        attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, {}, -1);
      },
      {"attention_forward", "sliding window = -1"});
}

// Grouped KV heads through the multi-head kernel: repeating each KV head G times (repeat_kv) and
// running NKV = NH must give the same output, and the multi-head dk/dv summed over each group
// must give the grouped kernel's dk/dv.
TEST(GqaAttention, EqualsMultiHeadOnRepeatedKv) {
  std::mt19937_64 rng(55);
  const std::int64_t B = 2, T = 17, NH = 6, NKV = 2, HS = 8, G = NH / NKV, C = NH * HS, W = (NH + 2 * NKV) * HS;
  Buf qkv(DType::fp32, B * T * W), rep(DType::fp32, B * T * 3 * C);
  qkv.fill_uniform(rng, -1, 1);
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    for (std::int64_t d = 0; d < C; ++d) rep.set(bt * 3 * C + d, qkv.get(bt * W + d));
    for (std::int64_t h = 0; h < NH; ++h)
      for (std::int64_t d = 0; d < HS; ++d) {
        rep.set(bt * 3 * C + C + h * HS + d, qkv.get(bt * W + C + (h / G) * HS + d));
        rep.set(bt * 3 * C + 2 * C + h * HS + d, qkv.get(bt * W + C + NKV * HS + (h / G) * HS + d));
      }
  }
  Buf o1(DType::fp32, B * T * C), o2(DType::fp32, B * T * C), dout(DType::fp32, B * T * C), d1(DType::fp32, B * T * W),
      d2(DType::fp32, B * T * 3 * C);
  dout.fill_uniform(rng, -1, 1);
  std::vector<float> l1(static_cast<std::size_t>(B * NH * T)), l2(l1.size()), scratch(attention_backward_scratch_elems(B, T, C, NH));
  const Tensor sc = f32(scratch, {static_cast<std::int64_t>(scratch.size())});
  attention_forward(o1.tensor({B, T, C}), f32(l1, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV});
  attention_forward(o2.tensor({B, T, C}), f32(l2, {B, NH, T}), rep.tensor({B, T, 3 * C}), NH);
  attention_backward(d1.tensor({B, T, W}), dout.tensor({B, T, C}), qkv.tensor({B, T, W}), o1.tensor({B, T, C}), f32(l1, {B, NH, T}), {NH, NKV}, sc);
  attention_backward(d2.tensor({B, T, 3 * C}), dout.tensor({B, T, C}), rep.tensor({B, T, 3 * C}), o2.tensor({B, T, C}), f32(l2, {B, NH, T}), NH, sc);
  for (std::int64_t i = 0; i < B * T * C; ++i) ASSERT_NEAR(o1.get(i), o2.get(i), 1e-6) << i;
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    for (std::int64_t d = 0; d < C; ++d) ASSERT_NEAR(d1.get(bt * W + d), d2.get(bt * 3 * C + d), 1e-5) << "dq " << bt << " " << d;
    for (std::int64_t g = 0; g < NKV; ++g)
      for (std::int64_t d = 0; d < HS; ++d) {
        double dk = 0, dv = 0;
        for (std::int64_t h = g * G; h < (g + 1) * G; ++h) {
          dk += d2.get(bt * 3 * C + C + h * HS + d);
          dv += d2.get(bt * 3 * C + 2 * C + h * HS + d);
        }
        ASSERT_NEAR(d1.get(bt * W + C + g * HS + d), dk, 1e-5) << "dk " << bt;
        ASSERT_NEAR(d1.get(bt * W + C + NKV * HS + g * HS + d), dv, 1e-5) << "dv " << bt;
      }
  }
}

TEST(GqaAttention, FiniteDifferences) {
  for (float p : {0.0f, 0.3f}) {
    SCOPED_TRACE(p);
    std::mt19937_64 rng(56);
    const std::int64_t B = 1, T = 5, NH = 4, NKV = 2, HS = 3, C = NH * HS, W = (NH + 2 * NKV) * HS;
    const DropoutParams dp{p, RngKey{5, 1, 2, 0, 0}};
    Buf qkv(DType::fp32, B * T * W), out(DType::fp32, B * T * C), dqkv(DType::fp32, B * T * W), dout(DType::fp32, B * T * C);
    qkv.fill_uniform(rng, -1, 1);
    const auto proj = random_vec(rng, static_cast<std::size_t>(B * T * C));
    for (std::int64_t i = 0; i < B * T * C; ++i) dout.set(i, proj[static_cast<std::size_t>(i)]);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, dp);
    attention_backward(dqkv.tensor({B, T, W}), dout.tensor({B, T, C}), qkv.tensor({B, T, W}), out.tensor({B, T, C}), f32(lse, {B, NH, T}), {NH, NKV},
                       f32(scratch, {static_cast<std::int64_t>(scratch.size())}), dp);
    Buf o2(DType::fp32, B * T * C);
    std::vector<float> l2(lse.size());
    auto loss = [&] {
      attention_forward(o2.tensor({B, T, C}), f32(l2, {B, NH, T}), qkv.tensor({B, T, W}), {NH, NKV}, dp);
      double l = 0;
      for (std::int64_t i = 0; i < B * T * C; ++i) l += proj[static_cast<std::size_t>(i)] * o2.get(i);
      return l;
    };
    for (std::int64_t i = 0; i < qkv.size(); ++i) {
      const double fd = central_difference(static_cast<float*>(qkv.data()), i, 1e-2, loss);
      EXPECT_NEAR(dqkv.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dqkv " << i;
    }
  }
}

TEST(GqaAttention, BadHeadCountsNameTheCounts) {
  Buf qkv(DType::fp32, 2 * 3 * 32), out(DType::fp32, 2 * 3 * 16);
  std::vector<float> lse(2 * 4 * 3);
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 16}), f32(lse, {2, 4, 3}), qkv.tensor({2, 3, 32}), {4, 3});
      },
      {"attention_forward", "NKV = 3", "NH = 4"});
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 16}), f32(lse, {2, 4, 3}), qkv.tensor({2, 3, 32}), {4, 0});
      },
      {"attention_forward", "NKV = 0"});
  // (NH + 2·NKV) = 6 does not divide 32.
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 16}), f32(lse, {2, 4, 3}), qkv.tensor({2, 3, 32}), {4, 1});
      },
      {"attention_forward", "[2, 3, 32]", "NKV = 1", "multiple of 6"});
}

TEST(Attention, FiniteDifferencesWithAndWithoutDropout) {
  for (float p : {0.0f, 0.3f}) {
    SCOPED_TRACE(p);
    std::mt19937_64 rng(52);
    const std::int64_t B = 1, T = 4, C = 6, NH = 2;
    const DropoutParams dp{p, RngKey{5, 1, 2, 0, 0}};
    Buf qkv(DType::fp32, B * T * 3 * C), out(DType::fp32, B * T * C), dout(DType::fp32, B * T * C), dqkv(DType::fp32, B * T * 3 * C);
    qkv.fill_uniform(rng, -1, 1);
    const auto proj = random_vec(rng, static_cast<std::size_t>(B * T * C));
    for (std::int64_t i = 0; i < B * T * C; ++i) dout.set(i, proj[static_cast<std::size_t>(i)]);
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
    attention_forward(out.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
    attention_backward(dqkv.tensor({B, T, 3 * C}), dout.tensor({B, T, C}), qkv.tensor({B, T, 3 * C}), out.tensor({B, T, C}), f32(lse, {B, NH, T}), NH,
                       f32(scratch, {static_cast<std::int64_t>(scratch.size())}), dp);
    Buf o2(DType::fp32, B * T * C);
    std::vector<float> l2(lse.size());
    auto loss = [&] {
      attention_forward(o2.tensor({B, T, C}), f32(l2, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
      double l = 0;
      for (std::int64_t i = 0; i < B * T * C; ++i) l += proj[static_cast<std::size_t>(i)] * o2.get(i);
      return l;
    };
    for (std::int64_t i = 0; i < qkv.size(); ++i) {
      const double fd = central_difference(static_cast<float*>(qkv.data()), i, 1e-2, loss);
      EXPECT_NEAR(dqkv.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dqkv " << i;
    }
  }
}

TEST(Attention, DropoutMaskRegeneratedOnRecompute) {
  std::mt19937_64 rng(53);
  const std::int64_t B = 2, T = 9, C = 8, NH = 2;
  Buf qkv(DType::fp32, B * T * 3 * C), o1(DType::fp32, B * T * C), o2(DType::fp32, B * T * C), o3(DType::fp32, B * T * C);
  qkv.fill_uniform(rng, -1, 1);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T));
  DropoutParams dp{0.5f, RngKey{1, 1, 1, 1, 0}};
  attention_forward(o1.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
  attention_forward(o2.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
  dp.rng.step = 2;
  attention_forward(o3.tensor({B, T, C}), f32(lse, {B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
  int differ = 0;
  for (std::int64_t i = 0; i < B * T * C; ++i) {
    ASSERT_EQ(o1.get(i), o2.get(i));
    differ += o1.get(i) != o3.get(i);
  }
  EXPECT_GT(differ, 0);
}

TEST(Attention, BadArgumentsNameTheOpAndShapes) {
  Buf qkv(DType::fp32, 2 * 3 * 24), out(DType::fp32, 2 * 3 * 8), h(DType::fp16, 2 * 3 * 8);
  std::vector<float> lse(2 * 2 * 3);
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 8}), f32(lse, {2, 2, 3}), qkv.tensor({2, 3, 24}), 3);
      },
      {"attention_forward", "NH = 3", "C = 8"});
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 8}), f32(lse, {2, 3, 2}), qkv.tensor({2, 3, 24}), 2);
      },
      {"attention_forward", "lse", "[2, 3, 2]", "[2, 2, 3]"});
  expect_error(
      [&] {
        attention_forward(out.tensor({2, 3, 8}), f32(lse, {2, 2, 3}), qkv.tensor({2, 72, 1}), 2);
      },
      {"attention_forward", "qkv", "[2, 72, 1]"});
  Buf wide(DType::fp32, 1 * 2 * 3 * 130), wout(DType::fp32, 1 * 2 * 130);
  std::vector<float> wl(2);
  expect_error(
      [&] {
        attention_forward(wout.tensor({1, 2, 130}), f32(wl, {1, 1, 2}), wide.tensor({1, 2, 390}), 1);
      },
      {"attention_forward", "head size", "130", "128"});
  expect_error(
      [&] {
        attention_forward(h.tensor({2, 3, 8}), f32(lse, {2, 2, 3}), qkv.tensor({2, 3, 24}), 2);
      },
      {"attention_forward", "fp16", "fp32"});
  Tensor g(qkv.data(), DType::fp32, Shape{2, 3, 24}, Device::cuda(0));
  expect_error([&] { attention_forward(out.tensor({2, 3, 8}), f32(lse, {2, 2, 3}), g, 2); }, {"attention_forward", "cuda:0"});
  Buf dqkv(DType::fp32, 2 * 3 * 24);
  std::vector<float> small(5);
  expect_error(
      [&] {
        attention_backward(dqkv.tensor({2, 3, 24}), out.tensor({2, 3, 8}), qkv.tensor({2, 3, 24}), out.tensor({2, 3, 8}), f32(lse, {2, 2, 3}), 2,
                           f32(small, {5}));
      },
      {"attention_backward", "scratch", "B*T*C + B*NH*T = 60"});
}
