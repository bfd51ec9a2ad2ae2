// RMSNorm and fused residual + RMSNorm against a naive double reference (full Jacobian for the
// backward), finite differences and argument errors; the row cut across ranks (rmsnorm_shard_*)
// against the whole-row kernels and finite differences.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>
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

// ---- A row cut across ranks (rmsnorm_shard_*): OLMoE's q/k norm under tensor parallelism ----
//
// The ranks of a group are emulated here: the C columns of every row are cut into consecutive
// pieces (AutoTP's rule, uneven), each piece runs the shard kernels on its own columns, and the
// group's all-reduce is the fp32 sum of the pieces' row statistics in rank order. Put back
// together, the pieces must give what the whole-row kernels give (rmsnorm_forward /
// rmsnorm_backward, themselves checked against the double Jacobian above): out, rstd, dinp
// (accumulated onto what it held) and dweight (each piece its own slice, accumulated).
namespace {

struct ShardRun {
  Buf y, dx, dw;
  std::vector<float> rstd;  // rank 0's (every rank's is the same row statistic)
};

// `widths`: the columns of each rank (summing to C); `sum_over_group` false leaves each rank with
// its own statistics (the cut without the all-reduce: the negative control).
ShardRun run_shards(const Buf& x, const Buf& w, const Buf& g, const Buf& dx0, const Buf& dw0, std::int64_t rows, std::int64_t C,
                    const std::vector<std::int64_t>& widths, float eps, bool sum_over_group = true) {
  const DType dt = x.dtype();
  const std::size_t W = widths.size();
  ShardRun out{Buf(dt, rows * C), dx0, dw0, {}};
  std::vector<Buf> xs, ws, gs, dxs, dws, ys;
  std::vector<std::int64_t> col0;
  std::int64_t c0 = 0;
  for (std::int64_t c : widths) {
    col0.push_back(c0);
    Buf xk(dt, rows * c), gk(dt, rows * c), dxk(dt, rows * c), wk(dt, c), dwk(dt, c);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < c; ++j) {
        xk.set(r * c + j, x.get(r * C + c0 + j));
        gk.set(r * c + j, g.get(r * C + c0 + j));
        dxk.set(r * c + j, dx0.get(r * C + c0 + j));
      }
    }
    for (std::int64_t j = 0; j < c; ++j) {
      wk.set(j, w.get(c0 + j));
      dwk.set(j, dw0.get(c0 + j));
    }
    xs.push_back(xk), gs.push_back(gk), dxs.push_back(dxk), ws.push_back(wk), dws.push_back(dwk), ys.emplace_back(dt, rows * c);
    c0 += c;
  }
  EXPECT_EQ(c0, C);
  const auto all_reduce = [&](std::vector<std::vector<float>>& per_rank) {
    if (!sum_over_group) return;
    std::vector<float> total(static_cast<std::size_t>(rows), 0.0f);
    for (const auto& v : per_rank)
      for (std::size_t r = 0; r < total.size(); ++r) total[r] += v[r];
    for (auto& v : per_rank) v = total;
  };
  std::vector<std::vector<float>> sums(W, std::vector<float>(static_cast<std::size_t>(rows))), rstd = sums, dots = sums;
  for (std::size_t k = 0; k < W; ++k) rmsnorm_shard_sum_squares(f32(sums[k], {rows}), xs[k].tensor({rows, widths[k]}));
  all_reduce(sums);
  for (std::size_t k = 0; k < W; ++k) {
    const Shape s{rows, widths[k]};
    rmsnorm_shard_forward(ys[k].tensor(s), f32(rstd[k], {rows}), xs[k].tensor(s), ws[k].tensor({widths[k]}), f32(sums[k], {rows}), C, eps);
    rmsnorm_shard_backward_dot(f32(dots[k], {rows}), gs[k].tensor(s), xs[k].tensor(s), ws[k].tensor({widths[k]}), f32(rstd[k], {rows}));
  }
  all_reduce(dots);
  for (std::size_t k = 0; k < W; ++k) {
    const Shape s{rows, widths[k]};
    rmsnorm_shard_backward(dxs[k].tensor(s), dws[k].tensor({widths[k]}), gs[k].tensor(s), xs[k].tensor(s), ws[k].tensor({widths[k]}),
                           f32(rstd[k], {rows}), f32(dots[k], {rows}), C);
    if (sum_over_group) {
      EXPECT_EQ(rstd[k], rstd[0]) << "rank " << k << " has another row statistic";
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < widths[k]; ++j) {
        out.y.set(r * C + col0[k] + j, ys[k].get(r * widths[k] + j));
        out.dx.set(r * C + col0[k] + j, dxs[k].get(r * widths[k] + j));
      }
    }
    for (std::int64_t j = 0; j < widths[k]; ++j) out.dw.set(col0[k] + j, dws[k].get(j));
  }
  out.rstd = rstd[0];
  return out;
}

// AutoTP's split of C columns over W ranks: C / W + (r < C % W) each.
std::vector<std::int64_t> autotp_widths(std::int64_t C, std::int64_t W) {
  std::vector<std::int64_t> v;
  for (std::int64_t r = 0; r < W; ++r) v.push_back(C / W + (r < C % W ? 1 : 0));
  return v;
}

double max_abs_diff(const Buf& a, const Buf& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a.get(i) - b.get(i)));
  return m;
}

}  // namespace

class RmsnormShardTest : public ::testing::TestWithParam<DType> {};

TEST_P(RmsnormShardTest, PiecesOverTheGroupEqualTheWholeRow) {
  const DType dt = GetParam();
  const Tol tol = kRmsnormTols.of(dt);
  std::mt19937_64 rng(44);
  for (const RmsnormCase& c : kRmsnormCases) {
    for (const std::int64_t W : {1, 2, 3, 4}) {
      if (W > c.C) continue;
      SCOPED_TRACE(fmt::format("{} cut over {} ranks, {}", c.name, W, dtype_label(dt)));
      const std::int64_t rows = c.B * c.T, C = c.C, N = rows * C;
      const auto eps = static_cast<float>(c.eps);
      Buf x(dt, N), w(dt, C), g(dt, N), dx(dt, N), dw(dt, C), y(dt, N);
      x.fill_uniform(rng, -2, 3);
      w.fill_uniform(rng, 0.5, 1.5);
      g.fill_uniform(rng, -1, 1);
      dx.fill_uniform(rng, -1, 1);
      dw.fill_uniform(rng, -1, 1);
      const ShardRun cut = run_shards(x, w, g, dx, dw, rows, C, autotp_widths(C, W), eps);
      std::vector<float> rstd(static_cast<std::size_t>(rows));
      rmsnorm_forward(y.tensor({rows, C}), f32(rstd, {rows}), x.tensor({rows, C}), w.tensor({C}), eps);
      rmsnorm_backward(dx.tensor({rows, C}), dw.tensor({C}), g.tensor({rows, C}), x.tensor({rows, C}), w.tensor({C}), f32(rstd, {rows}));
      if (W == 1) {
        // One rank: the same float operations as the whole-row kernels, bit for bit.
        EXPECT_EQ(cut.rstd, rstd);
        EXPECT_EQ(max_abs_diff(cut.y, y), 0.0);
        EXPECT_EQ(max_abs_diff(cut.dx, dx), 0.0);
        EXPECT_EQ(max_abs_diff(cut.dw, dw), 0.0);
        continue;
      }
      // Cut: the row sums add the pieces' fp32 partial sums (another order than one pass).
      expect_close(std::vector<double>(cut.rstd.begin(), cut.rstd.end()), std::vector<double>(rstd.begin(), rstd.end()), kRmsnormTols.fp32, "rstd");
      expect_close(cut.y, y.values(), tol, "out");
      expect_close(cut.dx, dx.values(), Tol{tol.atol * 4, tol.rtol * 2}, "dinp");
      expect_close(cut.dw, dw.values(), Tol{tol.atol * static_cast<double>(rows), tol.rtol}, "dweight");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, RmsnormShardTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// The negative control: a rank that normalises its columns by their own statistics (no sum over
// the group) is off by O(1), far beyond the tolerances above.
TEST(RmsnormShard, WithoutTheGroupsSumsThePiecesAreWrong) {
  std::mt19937_64 rng(45);
  const std::int64_t rows = 6, C = 16;
  Buf x(DType::fp32, rows * C), w(DType::fp32, C), g(DType::fp32, rows * C), dx(DType::fp32, rows * C), dw(DType::fp32, C), y(DType::fp32, rows * C);
  x.fill_uniform(rng, -2, 3);
  w.fill_uniform(rng, 0.5, 1.5);
  g.fill_uniform(rng, -1, 1);
  const ShardRun local = run_shards(x, w, g, dx, dw, rows, C, {8, 8}, 1e-5f, /*sum_over_group=*/false);
  std::vector<float> rstd(static_cast<std::size_t>(rows));
  rmsnorm_forward(y.tensor({rows, C}), f32(rstd, {rows}), x.tensor({rows, C}), w.tensor({C}), 1e-5f);
  rmsnorm_backward(dx.tensor({rows, C}), dw.tensor({C}), g.tensor({rows, C}), x.tensor({rows, C}), w.tensor({C}), f32(rstd, {rows}));
  EXPECT_GT(max_abs_diff(local.y, y), 0.05);
  EXPECT_GT(max_abs_diff(local.dx, dx), 0.05);
}

// Finite differences through the cut (3 uneven ranks): the gradient of Σ proj·out with respect to
// every input and weight element, the group's sums formed anew for each probe.
TEST(RmsnormShard, FiniteDifferencesThroughTheCut) {
  std::mt19937_64 rng(46);
  const std::int64_t rows = 4, C = 7;
  const std::vector<std::int64_t> widths{3, 2, 2};
  const float eps = 1e-5f;
  Buf x(DType::fp32, rows * C), w(DType::fp32, C), g(DType::fp32, rows * C), dx(DType::fp32, rows * C), dw(DType::fp32, C);
  x.fill_uniform(rng, -2, 2);
  w.fill_uniform(rng, 0.5, 1.5);
  const auto proj = random_vec(rng, static_cast<std::size_t>(rows * C));
  for (std::int64_t i = 0; i < rows * C; ++i) g.set(i, proj[static_cast<std::size_t>(i)]);
  const ShardRun cut = run_shards(x, w, g, dx, dw, rows, C, widths, eps);
  const Buf zero_dx(DType::fp32, rows * C), zero_dw(DType::fp32, C);
  auto loss = [&] {
    const ShardRun r = run_shards(x, w, g, zero_dx, zero_dw, rows, C, widths, eps);
    double l = 0;
    for (std::int64_t i = 0; i < rows * C; ++i) l += proj[static_cast<std::size_t>(i)] * r.y.get(i);
    return l;
  };
  for (std::int64_t i = 0; i < rows * C; ++i) {
    const double fd = central_difference(static_cast<float*>(x.data()), i, 1e-2, loss);
    EXPECT_NEAR(cut.dx.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dinp " << i;
  }
  for (std::int64_t i = 0; i < C; ++i) {
    const double fdw = central_difference(static_cast<float*>(w.data()), i, 1e-2, loss);
    EXPECT_NEAR(cut.dw.get(i), fdw, kFdTol.atol + kFdTol.rtol * std::abs(fdw)) << "dweight " << i;
  }
}

TEST(RmsnormShard, BadArgumentsNameTheOp) {
  Buf x(DType::fp32, 24), w(DType::fp32, 6), y(DType::fp32, 24);
  std::vector<float> r(4), s(4), bad(3);
  expect_error([&] { rmsnorm_shard_sum_squares(f32(bad, {3}), x.tensor({4, 6})); }, {"rmsnorm_shard_sum_squares", "sums", "[4, 6]"});
  expect_error(
      [&] {
        rmsnorm_shard_forward(y.tensor({4, 6}), f32(r, {4}), x.tensor({4, 6}), w.tensor({6}), f32(s, {4}), 5);
      },
      {"rmsnorm_shard_forward", "n = 5", "6 columns"});
  expect_error(
      [&] {
        rmsnorm_shard_forward(y.tensor({4, 6}), f32(r, {4}), x.tensor({4, 6}), w.tensor({6}), f32(r, {4}), 12);
      },
      {"rmsnorm_shard_forward", "sums"});
  expect_error(
      [&] {
        rmsnorm_shard_backward_dot(f32(bad, {3}), y.tensor({4, 6}), x.tensor({4, 6}), w.tensor({6}), f32(r, {4}));
      },
      {"rmsnorm_shard_backward_dot", "dots"});
  expect_error(
      [&] {
        rmsnorm_shard_backward(x.tensor({4, 6}), w.tensor({6}), y.tensor({4, 6}), x.tensor({4, 6}), w.tensor({6}), f32(r, {4}), f32(s, {4}), 12);
      },
      {"rmsnorm_shard_backward", "alias"});
}
