// Vocabulary-parallel cross-entropy: the whole vocabulary cut into shards (first row 0, middle,
// the last with padding or no real row), the three phases per shard with the group's max and sum
// done here as the tensor-parallel group does them, against a naive double reference of the
// whole-vocabulary loss; ignored targets, the backward written over a filled buffer and in place,
// and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/vocab_parallel_cross_entropy.h"
#include "vocab_parallel_cross_entropy_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Tensor f32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::fp32, s); }
Tensor i32(std::vector<std::int32_t>& v, Shape s) { return Tensor(v.data(), DType::int32, s); }

// Columns [p.first, p.first + p.rows) of the whole (BT, Vp) table.
Buf shard_of_table(const Buf& whole, std::int64_t BT, std::int64_t Vp, const VocabShardPiece& p) {
  Buf s(whole.dtype(), BT * p.rows);
  for (std::int64_t i = 0; i < BT; ++i)
    for (std::int64_t v = 0; v < p.rows; ++v) s.set(i * p.rows + v, whole.get(i * Vp + p.first + v));
  return s;
}

}  // namespace

class VocabParallelCrossEntropyTest : public ::testing::TestWithParam<DType> {};

TEST_P(VocabParallelCrossEntropyTest, ShardsMatchTheWholeVocabularyReference) {
  const DType dt = GetParam();
  const Tol tol = kVocabParallelTols.of(dt), ftol = kVocabParallelTols.fp32;
  std::mt19937_64 rng(67);
  for (const VocabParallelCase& c : kVocabParallelCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT, V = c.V, Vp = c.Vp;
    Buf logits(dt, BT * Vp);
    logits.fill_uniform(rng, -c.logit_range, c.logit_range);
    for (std::int64_t i = 0; i < BT; ++i)
      for (std::int64_t v = V; v < Vp; ++v) logits.set(i * Vp + v, 1000.0);  // padding must never contribute
    std::vector<std::int32_t> tg(static_cast<std::size_t>(BT));
    std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < BT; ++i) {
      tg[static_cast<std::size_t>(i)] = (c.ignore_every > 0 && i % c.ignore_every == 0) ? -1 : d(rng);
      n += tg[static_cast<std::size_t>(i)] >= 0;
    }
    const float dloss = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    const Shape rs{BT};

    // Phase 1 per shard, then the group's max.
    std::vector<Buf> shards;
    std::vector<float> rowmax(static_cast<std::size_t>(BT), -std::numeric_limits<float>::infinity());
    for (int r = 0; r < c.ranks; ++r) {
      const VocabShardPiece p = vocab_shard_piece(c, r);
      shards.push_back(shard_of_table(logits, BT, Vp, p));
      std::vector<float> m(static_cast<std::size_t>(BT), 5.0f);
      vocab_shard_max(f32(m, rs), shards.back().tensor({BT, p.rows}), p.valid);
      for (std::int64_t i = 0; i < BT; ++i) {
        if (p.valid == 0) {
          EXPECT_EQ(m[static_cast<std::size_t>(i)], -std::numeric_limits<float>::infinity()) << "a shard without real columns";
        }
        rowmax[static_cast<std::size_t>(i)] = std::max(rowmax[static_cast<std::size_t>(i)], m[static_cast<std::size_t>(i)]);
      }
    }
    // Phase 2 per shard against the group's max, then the group's sum (fp32, in rank order).
    std::vector<float> stats(static_cast<std::size_t>(2 * BT), 0.0f);
    for (int r = 0; r < c.ranks; ++r) {
      const VocabShardPiece p = vocab_shard_piece(c, r);
      std::vector<float> st(static_cast<std::size_t>(2 * BT), 9.0f);
      vocab_shard_sum_exp(f32(st, {BT, 2}), shards[static_cast<std::size_t>(r)].tensor({BT, p.rows}), f32(rowmax, rs), i32(tg, rs), p.first, p.valid);
      for (std::size_t k = 0; k < st.size(); ++k) stats[k] += st[k];
    }
    // Phase 3.
    std::vector<float> losses(static_cast<std::size_t>(BT), 3.0f), lse(static_cast<std::size_t>(BT), 3.0f);
    const float mean = vocab_parallel_losses(f32(losses, rs), f32(lse, rs), f32(rowmax, rs), f32(stats, {BT, 2}), i32(tg, rs));

    // Reference over the whole real vocabulary, in double from the rounded logits.
    const std::vector<double> x = logits.values();
    std::vector<double> want_loss(static_cast<std::size_t>(BT), 0.0), want_lse(static_cast<std::size_t>(BT), 0.0),
        want_d(static_cast<std::size_t>(BT * Vp), 0.0);
    double want_mean = 0;
    for (std::int64_t i = 0; i < BT; ++i) {
      double mx = -1e300, sum = 0;
      for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, x[static_cast<std::size_t>(i * Vp + v)]);
      for (std::int64_t v = 0; v < V; ++v) sum += std::exp(x[static_cast<std::size_t>(i * Vp + v)] - mx);
      const double l = mx + std::log(sum);
      want_lse[static_cast<std::size_t>(i)] = l;
      const std::int32_t t = tg[static_cast<std::size_t>(i)];
      if (t < 0) continue;
      want_loss[static_cast<std::size_t>(i)] = l - x[static_cast<std::size_t>(i * Vp + t)];
      want_mean += want_loss[static_cast<std::size_t>(i)] / static_cast<double>(n);
      for (std::int64_t v = 0; v < V; ++v)
        want_d[static_cast<std::size_t>(i * Vp + v)] = (std::exp(x[static_cast<std::size_t>(i * Vp + v)] - l) - (v == t ? 1.0 : 0.0)) * dloss;
    }
    expect_close(std::vector<double>(lse.begin(), lse.end()), want_lse, ftol, "lse");
    expect_close(std::vector<double>(losses.begin(), losses.end()), want_loss, ftol, "losses");
    for (std::int64_t i = 0; i < BT; ++i) {
      if (tg[static_cast<std::size_t>(i)] < 0) {
        EXPECT_EQ(losses[static_cast<std::size_t>(i)], 0.0f) << "ignored position " << i;
      }
    }
    EXPECT_NEAR(mean, want_mean, ftol.atol + ftol.rtol * std::abs(want_mean));
    if (n == 0) {
      EXPECT_EQ(mean, 0.0f);
    }

    // Backward per shard: written over a filled buffer, and in place over the shard's logits.
    for (int r = 0; r < c.ranks; ++r) {
      SCOPED_TRACE(r);
      const VocabShardPiece p = vocab_shard_piece(c, r);
      const Shape ls{BT, p.rows};
      Buf& xs = shards[static_cast<std::size_t>(r)];
      Buf dl(dt, BT * p.rows);
      dl.fill(7.0);
      vocab_shard_cross_entropy_backward(dl.tensor(ls), xs.tensor(ls), f32(lse, rs), i32(tg, rs), dloss, p.first, p.valid);
      std::vector<double> want(static_cast<std::size_t>(BT * p.rows));
      for (std::int64_t i = 0; i < BT; ++i)
        for (std::int64_t v = 0; v < p.rows; ++v) want[static_cast<std::size_t>(i * p.rows + v)] = want_d[static_cast<std::size_t>(i * Vp + p.first + v)];
      expect_close(dl, want, tol, "dlogits " + dtype_label(dt));
      for (std::int64_t i = 0; i < BT; ++i) {
        for (std::int64_t v = 0; v < p.rows; ++v) {
          if (v >= p.valid || tg[static_cast<std::size_t>(i)] < 0) {
            ASSERT_EQ(dl.get(i * p.rows + v), 0.0) << "padding / ignored row " << i << ", " << v;
          }
        }
      }
      vocab_shard_cross_entropy_backward(xs.tensor(ls), xs.tensor(ls), f32(lse, rs), i32(tg, rs), dloss, p.first, p.valid);
      expect_close(xs, dl.values(), Tol{}, "in place equals out of place");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, VocabParallelCrossEntropyTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(VocabParallelCrossEntropyErrors, NameTheOpAndTheTensor) {
  std::vector<float> x(4 * 6, 0.0f), m(4), st(8), l(4), z(4);
  std::vector<std::int32_t> tg(4, 0);
  expect_error([&] { vocab_shard_max(f32(m, {4}), f32(x, {4, 6}), 7); }, {"vocab_shard_max", "7 real columns", "6 columns"});
  expect_error([&] { vocab_shard_max(f32(m, {3}), f32(x, {4, 6}), 6); }, {"vocab_shard_max", "'rowmax'", "3 elements"});
  expect_error([&] { vocab_shard_sum_exp(f32(st, {3, 2}), f32(x, {4, 6}), f32(m, {4}), i32(tg, {4}), 0, 6); }, {"vocab_shard_sum_exp", "'stats'"});
  expect_error([&] { vocab_parallel_losses(f32(l, {4}), f32(z, {4}), f32(m, {4}), f32(st, {2, 2}), i32(tg, {4})); },
               {"vocab_parallel_losses", "stats"});
  expect_error([&] { vocab_shard_cross_entropy_backward(f32(x, {4, 6}), f32(x, {4, 6}), f32(z, {3}), i32(tg, {4}), 1.0f, 0, 6); },
               {"vocab_shard_cross_entropy_backward", "'lse'"});
}
