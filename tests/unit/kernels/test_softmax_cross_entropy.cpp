// Fused softmax + cross-entropy against a naive double reference (padding, ignored positions),
// finite differences, in-place backward and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "softmax_cross_entropy_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }
Tensor i32(std::vector<std::int32_t>& v, Shape s) { return Tensor(v.data(), DType::int32, s); }

}  // namespace

class SoftmaxCrossEntropyTest : public ::testing::TestWithParam<DType> {};

TEST_P(SoftmaxCrossEntropyTest, MatchesReference) {
  const DType dt = GetParam();
  const Tol tol = kSoftmaxCrossEntropyTols.of(dt);
  std::mt19937_64 rng(61);
  for (const SoftmaxCrossEntropyCase& c : kSoftmaxCrossEntropyCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT, V = c.V, Vp = c.Vp;
    Buf logits(dt, BT * Vp), dlogits(dt, BT * Vp);
    logits.fill_uniform(rng, -c.logit_range, c.logit_range);
    for (std::int64_t i = 0; i < BT; ++i)
      for (std::int64_t v = V; v < Vp; ++v) logits.set(i * Vp + v, 1000.0);  // padding must never contribute
    dlogits.fill(7.0);
    std::vector<std::int32_t> tg(static_cast<std::size_t>(BT));
    std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
    std::int64_t valid = 0;
    for (std::int64_t i = 0; i < BT; ++i) {
      tg[static_cast<std::size_t>(i)] = (c.ignore_every > 0 && i % c.ignore_every == 0) ? -1 : d(rng);
      valid += tg[static_cast<std::size_t>(i)] >= 0;
    }
    const double dloss = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
    std::vector<float> losses(static_cast<std::size_t>(BT)), lse(static_cast<std::size_t>(BT));
    const float mean = softmax_cross_entropy_forward(f32(losses, {BT}), f32(lse, {BT}), logits.tensor({BT, Vp}), i32(tg, {BT}), V);
    softmax_cross_entropy_backward(dlogits.tensor({BT, Vp}), logits.tensor({BT, Vp}), f32(lse, {BT}), i32(tg, {BT}), static_cast<float>(dloss), V);
    const auto x = logits.values();
    std::vector<double> want_loss(static_cast<std::size_t>(BT), 0.0), want_d(static_cast<std::size_t>(BT * Vp), 0.0);
    double want_mean = 0;
    for (std::int64_t i = 0; i < BT; ++i) {
      const std::int32_t t = tg[static_cast<std::size_t>(i)];
      if (t < 0) continue;
      double mx = -1e300, sum = 0;
      for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, x[static_cast<std::size_t>(i * Vp + v)]);
      for (std::int64_t v = 0; v < V; ++v) sum += std::exp(x[static_cast<std::size_t>(i * Vp + v)] - mx);
      want_loss[static_cast<std::size_t>(i)] = -(x[static_cast<std::size_t>(i * Vp + t)] - mx - std::log(sum));
      want_mean += want_loss[static_cast<std::size_t>(i)] / static_cast<double>(valid);
      for (std::int64_t v = 0; v < V; ++v) {
        const double p = std::exp(x[static_cast<std::size_t>(i * Vp + v)] - mx) / sum;
        want_d[static_cast<std::size_t>(i * Vp + v)] = (p - (v == t ? 1.0 : 0.0)) * dloss;
      }
    }
    const Tol loss_tol{tol.atol * (1 + c.logit_range), 1e-5};
    expect_close(std::vector<double>(losses.begin(), losses.end()), want_loss, loss_tol, "losses " + dtype_label(dt));
    EXPECT_NEAR(mean, want_mean, loss_tol.atol + 1e-5 * std::abs(want_mean));
    expect_close(dlogits, want_d, Tol{tol.atol * dloss + 1e-7, tol.rtol}, "dlogits " + dtype_label(dt));
    // In place: dlogits written over the logits gives the same bits.
    Buf inplace(dt, BT * Vp);
    for (std::int64_t i = 0; i < BT * Vp; ++i) inplace.set(i, logits.get(i));
    softmax_cross_entropy_backward(inplace.tensor({BT, Vp}), inplace.tensor({BT, Vp}), f32(lse, {BT}), i32(tg, {BT}), static_cast<float>(dloss), V);
    for (std::int64_t i = 0; i < BT * Vp; ++i) ASSERT_EQ(inplace.get(i), dlogits.get(i)) << "in-place element " << i;
    // Forward and backward in one call: the same losses, lse and mean, and the same dlogits
    // written over the logits.
    Buf fused(dt, BT * Vp);
    for (std::int64_t i = 0; i < BT * Vp; ++i) fused.set(i, logits.get(i));
    std::vector<float> f_losses(losses.size()), f_lse(lse.size());
    const float f_mean = softmax_cross_entropy_forward_backward(f32(f_losses, {BT}), f32(f_lse, {BT}), fused.tensor({BT, Vp}), i32(tg, {BT}),
                                                                static_cast<float>(dloss), V);
    EXPECT_EQ(f_mean, mean);
    EXPECT_EQ(f_losses, losses);
    EXPECT_EQ(f_lse, lse);
    for (std::int64_t i = 0; i < BT * Vp; ++i) ASSERT_EQ(fused.get(i), dlogits.get(i)) << "fused element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SoftmaxCrossEntropyTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(SoftmaxCrossEntropy, FiniteDifferences) {
  std::mt19937_64 rng(62);
  const std::int64_t B = 2, T = 3, V = 7, Vp = 8;
  Buf logits(DType::fp32, B * T * Vp), dlogits(DType::fp32, B * T * Vp);
  logits.fill_uniform(rng, -3, 3);
  std::vector<std::int32_t> tg = {1, -1, 6, 0, 3, 5};
  std::vector<float> losses(static_cast<std::size_t>(B * T)), lse(losses.size());
  // Loss = a random projection of the per-position losses; dloss differs per position, so check
  // position by position with dloss = w_i (the kernel takes one scalar dloss per call).
  const auto w = random_vec(rng, static_cast<std::size_t>(B * T), 0.5, 1.5);
  softmax_cross_entropy_forward(f32(losses, {B, T}), f32(lse, {B, T}), logits.tensor({B, T, Vp}), i32(tg, {B, T}), V);
  for (std::int64_t pos = 0; pos < B * T; ++pos) {
    std::vector<std::int32_t> only(tg.size(), -1);
    only[static_cast<std::size_t>(pos)] = tg[static_cast<std::size_t>(pos)];
    softmax_cross_entropy_backward(dlogits.tensor({B, T, Vp}), logits.tensor({B, T, Vp}), f32(lse, {B, T}), i32(only, {B, T}),
                                   static_cast<float>(w[static_cast<std::size_t>(pos)]), V);
    std::vector<float> l2(losses.size()), s2(losses.size());
    auto loss = [&] {
      softmax_cross_entropy_forward(f32(l2, {B, T}), f32(s2, {B, T}), logits.tensor({B, T, Vp}), i32(tg, {B, T}), V);
      return w[static_cast<std::size_t>(pos)] * static_cast<double>(l2[static_cast<std::size_t>(pos)]);
    };
    for (std::int64_t v = 0; v < Vp; ++v) {
      const std::int64_t i = pos * Vp + v;
      const double fd = central_difference(static_cast<float*>(logits.data()), i, 1e-2, loss);
      EXPECT_NEAR(dlogits.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "position " << pos << " column " << v;
    }
  }
}

TEST(SoftmaxCrossEntropy, BadArgumentsNameTheOpAndShapes) {
  Buf logits(DType::fp32, 4 * 8);
  std::vector<float> losses(4), lse(4);
  std::vector<std::int32_t> tg = {0, 1, 7, 2};
  expect_error(
      [&] {
        softmax_cross_entropy_forward(f32(losses, {4}), f32(lse, {4}), logits.tensor({4, 8}), i32(tg, {4}), 6);
      },
      {"softmax_cross_entropy_forward", "target 7", "position 2", "[0, 6)"});
  tg[2] = 3;
  expect_error(
      [&] {
        softmax_cross_entropy_forward(f32(losses, {4}), f32(lse, {4}), logits.tensor({4, 8}), i32(tg, {4}), 9);
      },
      {"softmax_cross_entropy_forward", "V = 9", "Vp = 8"});
  expect_error(
      [&] {
        softmax_cross_entropy_forward(f32(losses, {4}), f32(lse, {4}), logits.tensor({2, 16}), i32(tg, {4}), 8);
      },
      {"softmax_cross_entropy_forward", "targets", "[4]", "[2]"});
  Buf half(DType::fp16, 4 * 8);
  expect_error(
      [&] {
        softmax_cross_entropy_backward(half.tensor({4, 8}), logits.tensor({4, 8}), f32(lse, {4}), i32(tg, {4}), 1.0f, 8);
      },
      {"softmax_cross_entropy_backward", "fp16", "fp32"});
  Tensor g(logits.data(), DType::fp32, Shape{4, 8}, Device::cuda(0));
  expect_error([&] { softmax_cross_entropy_forward(f32(losses, {4}), f32(lse, {4}), g, i32(tg, {4}), 8); },
               {"softmax_cross_entropy_forward", "cuda:0"});
}
