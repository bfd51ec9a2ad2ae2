// The mixture-of-experts kernels (ops/kernels/moe.h) against naive references written here from
// the header's definitions: routing (softmax / sigmoid, renormalising, scale, group-limited, the
// tie rule), moe_route_backward against central differences of a double reference, the aux
// statistics, the dispatch plan, the token movement for every storage dtype, and argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "moe_cases.h"
#include "ops/kernels/moe.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

// ---- references -------------------------------------------------------------------------------

std::vector<double> ref_softmax(const double* l, std::int64_t E) {
  double lse = -std::numeric_limits<double>::infinity();
  for (std::int64_t e = 0; e < E; ++e) lse = std::max(lse, l[e]);
  double z = 0;
  for (std::int64_t e = 0; e < E; ++e) z += std::exp(l[e] - lse);
  lse += std::log(z);
  std::vector<double> p(static_cast<std::size_t>(E));
  for (std::int64_t e = 0; e < E; ++e) p[static_cast<std::size_t>(e)] = std::exp(l[e] - lse);
  return p;
}

// The candidates ranked by value, higher first; on a tie the lower index when lower_wins (the
// header's rule), else the higher (a wrong rule, to show that the tests tell them apart).
std::vector<std::int64_t> ranked(const std::vector<double>& v, std::vector<std::int64_t> cand, bool lower_wins) {
  std::sort(cand.begin(), cand.end(), [&](std::int64_t a, std::int64_t b) {
    const double va = v[static_cast<std::size_t>(a)], vb = v[static_cast<std::size_t>(b)];
    if (va != vb) return va > vb;
    return lower_wins ? a < b : a > b;
  });
  return cand;
}

struct RefToken {
  std::vector<double> scores, weight;
  std::vector<std::int64_t> expert;
};

RefToken ref_route(const double* l, std::int64_t E, const MoeRouting& r, bool lower_wins = true) {
  RefToken o;
  if (r.sigmoid) {
    for (std::int64_t e = 0; e < E; ++e) o.scores.push_back(1.0 / (1.0 + std::exp(-l[e])));
  } else {
    o.scores = ref_softmax(l, E);
  }
  std::vector<std::int64_t> cand;
  if (r.n_group > 1) {
    const std::int64_t per = E / r.n_group;
    std::vector<double> gscore;
    std::vector<std::int64_t> groups;
    for (std::int64_t g = 0; g < r.n_group; ++g) {
      std::vector<double> v(o.scores.begin() + g * per, o.scores.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gscore.push_back(r.sigmoid && per >= 2 ? v[0] + v[1] : v[0]);
      groups.push_back(g);
    }
    const auto best = ranked(gscore, groups, lower_wins);
    for (std::int64_t e = 0; e < E; ++e)
      if (std::find(best.begin(), best.begin() + r.topk_group, e / per) != best.begin() + r.topk_group) cand.push_back(e);
  } else {
    for (std::int64_t e = 0; e < E; ++e) cand.push_back(e);
  }
  const auto order = ranked(o.scores, cand, lower_wins);
  o.expert.assign(order.begin(), order.begin() + r.top_k);
  double sum = r.sigmoid ? 1e-20 : 0.0;
  for (std::int64_t e : o.expert) sum += o.scores[static_cast<std::size_t>(e)];
  for (std::int64_t e : o.expert) {
    const double s = o.scores[static_cast<std::size_t>(e)];
    o.weight.push_back((r.renormalize ? s / sum : s) * static_cast<double>(r.scale));
  }
  return o;
}

struct RefPlan {
  std::vector<std::int32_t> slot_assignment, slot_of, counts;
};

RefPlan ref_plan(const std::vector<std::int32_t>& ex, std::int64_t N, std::int64_t k, std::int64_t E, std::int64_t capacity) {
  std::vector<std::vector<std::int32_t>> kept(static_cast<std::size_t>(E));
  for (std::int64_t j = 0; j < k; ++j)  // slot order: every first choice, then every second, ...
    for (std::int64_t t = 0; t < N; ++t) {
      auto& v = kept[static_cast<std::size_t>(ex[static_cast<std::size_t>(t * k + j)])];
      if (capacity < 0 || static_cast<std::int64_t>(v.size()) < capacity) v.push_back(static_cast<std::int32_t>(t * k + j));
    }
  RefPlan p;
  p.slot_of.assign(static_cast<std::size_t>(N * k), -1);
  for (const auto& v : kept) {
    p.counts.push_back(static_cast<std::int32_t>(v.size()));
    for (std::int32_t a : v) {
      p.slot_of[static_cast<std::size_t>(a)] = static_cast<std::int32_t>(p.slot_assignment.size());
      p.slot_assignment.push_back(a);
    }
  }
  p.slot_assignment.resize(static_cast<std::size_t>(N * k), -1);
  return p;
}

// ---- routing ----------------------------------------------------------------------------------

struct Routed {
  Buf scores, expert, weight;
};

Routed route(std::vector<float>& logits, std::int64_t N, std::int64_t E, const MoeRouting& r) {
  Routed o{Buf(DType::fp32, N * E), Buf(DType::int32, N * r.top_k), Buf(DType::fp32, N * r.top_k)};
  moe_route_forward(o.scores.tensor({N, E}), o.expert.tensor({N, r.top_k}), o.weight.tensor({N, r.top_k}),
                    Tensor(logits.data(), DType::fp32, Shape{N, E}), r);
  return o;
}

std::vector<double> as_double(const std::vector<float>& v, std::int64_t from, std::int64_t n) {
  return {v.begin() + from, v.begin() + from + n};
}

TEST(MoeRoute, ForwardMatchesTheReference) {
  std::mt19937_64 rng(61);
  for (const MoeRouteCase& c : kMoeRouteCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t N = c.N, E = c.E, k = c.r.top_k;
    auto logits = moe_logits(rng, N, E);
    Routed got = route(logits, N, E, c.r);
    const auto ex = raw_values<std::int32_t>(got.expert);
    std::vector<double> want_s, want_w;
    for (std::int64_t t = 0; t < N; ++t) {
      const auto l = as_double(logits, t * E, E);
      const RefToken ref = ref_route(l.data(), E, c.r);
      want_s.insert(want_s.end(), ref.scores.begin(), ref.scores.end());
      want_w.insert(want_w.end(), ref.weight.begin(), ref.weight.end());
      for (std::int64_t j = 0; j < k; ++j) ASSERT_EQ(ex[static_cast<std::size_t>(t * k + j)], ref.expert[static_cast<std::size_t>(j)]) << "token " << t << " choice " << j;
    }
    expect_close(got.scores, want_s, kMoeRouteTol, "scores");
    expect_close(got.weight, want_w, kMoeRouteTol, "weight");
  }
}

// Rows whose answer depends on the tie rule, with the experts the header's rule gives.
struct TieRow {
  const char* name;
  std::vector<float> logits;
  MoeRouting r;
  std::vector<std::int32_t> want;
};
std::vector<TieRow> tie_rows() {
  return {
      {"all_equal_softmax", {0, 0, 0, 0, 0, 0, 0, 0}, {.top_k = 3}, {0, 1, 2}},
      {"all_equal_sigmoid", {1, 1, 1, 1, 1, 1, 1, 1}, {.top_k = 3, .sigmoid = true}, {0, 1, 2}},
      {"pair_softmax", {0, 2, 1, 2, 2, 0, 0, 0}, {.top_k = 2}, {1, 3}},
      {"pair_sigmoid_top3", {0, 2, 1, 2, 2, 0, 0, 0}, {.top_k = 3, .sigmoid = true}, {1, 3, 4}},
      {"boundary_softmax", {3, 1, 0, 1, 0, 0, 1, 0}, {.top_k = 2}, {0, 1}},
      // Groups 1 and 3 tie (max 2, or top-2 sum s(2) + s(1)); with one eligible group, group 1 wins.
      {"group_tie_softmax", {0, 0, 1, 2, 0, 0, 2, 1}, {.top_k = 2, .n_group = 4, .topk_group = 1}, {3, 2}},
      {"group_tie_sigmoid", {0, 0, 1, 2, 0, 0, 2, 1}, {.top_k = 2, .sigmoid = true, .n_group = 4, .topk_group = 1}, {3, 2}},
      // Groups 0 and 2 tie for first (both eligible), and so do their best experts 0 and 4.
      {"group_tie_two_groups", {2, -1, 0, 0, 2, -2, 1.5f, 1.9f}, {.top_k = 3, .n_group = 4, .topk_group = 2}, {0, 4, 1}},
  };
}

TEST(MoeRoute, TiesGoToTheLowerExpertAndTheLowerGroup) {
  for (TieRow& row : tie_rows()) {
    SCOPED_TRACE(row.name);
    const std::int64_t E = static_cast<std::int64_t>(row.logits.size());
    Routed got = route(row.logits, 1, E, row.r);
    EXPECT_EQ(raw_values<std::int32_t>(got.expert), row.want);
    // The reference agrees, and the wrong rule (higher index wins) would not: these rows catch it.
    const auto l = as_double(row.logits, 0, E);
    const RefToken good = ref_route(l.data(), E, row.r, true), bad = ref_route(l.data(), E, row.r, false);
    EXPECT_EQ(std::vector<std::int32_t>(good.expert.begin(), good.expert.end()), row.want);
    EXPECT_NE(std::vector<std::int32_t>(bad.expert.begin(), bad.expert.end()), row.want);
  }
}

// d(logits) against central differences of J(l) = Σ_j dweight_j·weight_j(l) + Σ_e aux_e·softmax(l)_e,
// computed by the double reference with the selection held (each perturbation is checked not to
// change it). Tokens with tied logits are skipped (the selection is not differentiable there).
TEST(MoeRoute, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(62);
  const double h = 1e-5;
  for (const MoeRouteCase& c : kMoeRouteCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t N = c.N, E = c.E, k = c.r.top_k;
    auto logits = moe_logits(rng, N, E);
    Routed fwd = route(logits, N, E, c.r);
    const auto dw = random_vec(rng, static_cast<std::size_t>(N * k));
    const auto aux = random_vec(rng, static_cast<std::size_t>(E));
    Buf dweight(DType::fp32, N * k), aux_grad(DType::fp32, E), dlogits(DType::fp32, N * E);
    for (std::int64_t i = 0; i < N * k; ++i) dweight.set(i, dw[static_cast<std::size_t>(i)]);
    for (std::int64_t e = 0; e < E; ++e) aux_grad.set(e, aux[static_cast<std::size_t>(e)]);
    dlogits.fill(123.0);  // written, not accumulated
    moe_route_backward(dlogits.tensor({N, E}), dweight.tensor({N, k}), fwd.scores.tensor({N, E}), fwd.expert.tensor({N, k}),
                       fwd.weight.tensor({N, k}), Tensor(logits.data(), DType::fp32, Shape{N, E}), c.aux ? aux_grad.tensor({E}) : Tensor{}, c.r);
    std::int64_t probed = 0;
    for (std::int64_t t = 0; t < N; ++t) {
      if (t == 1 || t % 3 == 0) continue;
      const auto l0 = as_double(logits, t * E, E);
      const RefToken base = ref_route(l0.data(), E, c.r);
      auto J = [&](const std::vector<double>& l) {
        const RefToken o = ref_route(l.data(), E, c.r);
        EXPECT_EQ(o.expert, base.expert) << "a perturbation changed the selection of token " << t;
        double v = 0;
        for (std::int64_t j = 0; j < k; ++j) v += dweight.get(t * k + j) * o.weight[static_cast<std::size_t>(j)];
        if (c.aux) {
          const auto p = ref_softmax(l.data(), E);
          for (std::int64_t e = 0; e < E; ++e) v += aux_grad.get(e) * p[static_cast<std::size_t>(e)];
        }
        return v;
      };
      for (std::int64_t e = 0; e < E; ++e) {
        auto lp = l0, lm = l0;
        lp[static_cast<std::size_t>(e)] += h;
        lm[static_cast<std::size_t>(e)] -= h;
        const double fd = (J(lp) - J(lm)) / (2 * h);
        const double got = dlogits.get(t * E + e);
        EXPECT_NEAR(got, fd, kMoeRouteGradTol.atol + kMoeRouteGradTol.rtol * std::abs(fd)) << "token " << t << " expert " << e;
        ++probed;
      }
    }
    EXPECT_GT(probed, 0);
  }
}

// d(logits) is written (the same result over zeros and over garbage); an unchosen expert of
// sigmoid routing gets no gradient.
TEST(MoeRoute, BackwardIsWrittenNotAccumulated) {
  std::vector<float> logits{0.3f, -1.0f, 2.0f, 0.5f};
  const MoeRouting r{.top_k = 2, .sigmoid = true};
  Routed fwd = route(logits, 1, 4, r);
  Buf dweight(DType::fp32, 2), dl1(DType::fp32, 4), dl2(DType::fp32, 4);
  dweight.set(0, 0.7);
  dweight.set(1, -0.2);
  dl1.fill(0.0);
  dl2.fill(5.0);
  for (Buf* d : {&dl1, &dl2})
    moe_route_backward(d->tensor({1, 4}), dweight.tensor({1, 2}), fwd.scores.tensor({1, 4}), fwd.expert.tensor({1, 2}), fwd.weight.tensor({1, 2}),
                       Tensor(logits.data(), DType::fp32, Shape{1, 4}), Tensor{}, r);
  EXPECT_EQ(dl1.values(), dl2.values());
  EXPECT_EQ(dl1.get(1), 0.0);  // not chosen, sigmoid scores: no gradient
  EXPECT_NE(dl1.get(2), 0.0);
}

// ---- aux statistics ---------------------------------------------------------------------------

TEST(MoeAuxStats, MatchTheReference) {
  std::mt19937_64 rng(63);
  struct C {
    std::int64_t N, E, k;
  };
  for (const C c : {C{50, 8, 2}, C{7, 16, 3}, C{1, 4, 4}, C{300, 64, 8}, C{0, 5, 1}}) {
    SCOPED_TRACE(std::to_string(c.N) + "x" + std::to_string(c.E) + " top" + std::to_string(c.k));
    auto logits = moe_logits(rng, c.N, c.E);
    float no_tokens = 0;  // N = 0: a tensor with no elements, yet not a missing one
    std::vector<double> assigned(static_cast<std::size_t>(c.E), -1.0), prob_sum(static_cast<std::size_t>(c.E), -1.0);
    moe_aux_stats(Tensor(assigned.data(), DType::fp64, Shape{c.E}), Tensor(prob_sum.data(), DType::fp64, Shape{c.E}),
                  Tensor(c.N > 0 ? logits.data() : &no_tokens, DType::fp32, Shape{c.N, c.E}), c.k);
    std::vector<double> want_a(static_cast<std::size_t>(c.E), 0.0), want_p(static_cast<std::size_t>(c.E), 0.0);
    std::vector<std::int64_t> all;
    for (std::int64_t e = 0; e < c.E; ++e) all.push_back(e);
    for (std::int64_t t = 0; t < c.N; ++t) {
      const auto l = as_double(logits, t * c.E, c.E);
      const auto p = ref_softmax(l.data(), c.E);
      for (std::int64_t e = 0; e < c.E; ++e) want_p[static_cast<std::size_t>(e)] += p[static_cast<std::size_t>(e)];
      const auto order = ranked(p, all, true);
      for (std::int64_t j = 0; j < c.k; ++j) want_a[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] += 1.0;
    }
    EXPECT_EQ(assigned, want_a);
    expect_close(prob_sum, want_p, kMoeProbSumTol, "prob_sum");
  }
}

// ---- dispatch plan ----------------------------------------------------------------------------

TEST(MoeDispatchPlan, MatchesTheReference) {
  std::mt19937_64 rng(64);
  for (const MoePlanCase& c : kMoePlanCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t M = c.N * c.k;
    Buf ex = i32_buf(moe_plan_experts(rng, c.N, c.k, c.E, c.pattern));
    Buf sa = i32_buf(std::vector<std::int32_t>(static_cast<std::size_t>(M), 77)), so = i32_buf(std::vector<std::int32_t>(static_cast<std::size_t>(M), 77)),
        cn = i32_buf(std::vector<std::int32_t>(static_cast<std::size_t>(c.E), 77));
    moe_dispatch_plan(sa.tensor({M}), so.tensor({M}), cn.tensor({c.E}), ex.tensor({c.N, c.k}), c.capacity);
    const RefPlan want = ref_plan(raw_values<std::int32_t>(ex), c.N, c.k, c.E, c.capacity);
    const auto got_sa = raw_values<std::int32_t>(sa), got_so = raw_values<std::int32_t>(so), got_cn = raw_values<std::int32_t>(cn);
    EXPECT_EQ(got_sa, want.slot_assignment);
    EXPECT_EQ(got_so, want.slot_of);
    EXPECT_EQ(got_cn, want.counts);
    // The properties the header states, checked directly as well.
    std::int64_t kept = 0;
    for (std::int64_t a = 0; a < M; ++a)
      if (got_so[static_cast<std::size_t>(a)] >= 0) {
        ++kept;
        EXPECT_EQ(got_sa[static_cast<std::size_t>(got_so[static_cast<std::size_t>(a)])], a);
      }
    std::int64_t total = 0;
    for (std::int32_t n : got_cn) {
      total += n;
      if (c.capacity >= 0) {
        EXPECT_LE(n, c.capacity);
      }
    }
    EXPECT_EQ(kept, total);
    for (std::int64_t s = total; s < M; ++s) EXPECT_EQ(got_sa[static_cast<std::size_t>(s)], -1) << "tail slot " << s;
    std::int64_t s = 0;
    for (std::int64_t e = 0; e < c.E; ++e) {  // within an expert: (choice, token) increasing
      for (std::int64_t i = 1; i < got_cn[static_cast<std::size_t>(e)]; ++i) {
        const std::int32_t a = got_sa[static_cast<std::size_t>(s + i - 1)], b = got_sa[static_cast<std::size_t>(s + i)];
        EXPECT_TRUE(a % c.k < b % c.k || (a % c.k == b % c.k && a / c.k < b / c.k)) << "expert " << e << " slots " << s + i - 1;
      }
      s += got_cn[static_cast<std::size_t>(e)];
    }
    if (c.pattern == MoePlanPattern::gap) {
      EXPECT_EQ(got_cn[2], 0);
    }
    if (c.pattern == MoePlanPattern::one_expert) {
      for (std::int64_t e = 0; e < c.E; ++e)
        EXPECT_EQ(got_cn[static_cast<std::size_t>(e)], e == c.E / 2 ? (c.capacity < 0 ? M : std::min(M, c.capacity)) : 0);
    }
    if (c.capacity >= 0 && c.pattern == MoePlanPattern::skewed) {
      EXPECT_LT(kept, M) << "the case should drop";
    }
  }
}

TEST(MoeDispatchPlan, FirstChoicesFillCapacityBeforeSecondChoices) {
  // Token 0 picks (1, 0), tokens 1..3 pick (0, 1): expert 0 with capacity 3 keeps the first choices of
  // tokens 1..3 and drops token 0's second choice, although token 0 comes first.
  Buf ex = i32_buf({1, 0, 0, 1, 0, 1, 0, 1});
  Buf sa(DType::int32, 8), so(DType::int32, 8), cn(DType::int32, 2);
  moe_dispatch_plan(sa.tensor({8}), so.tensor({8}), cn.tensor({2}), ex.tensor({4, 2}), 3);
  EXPECT_EQ(raw_values<std::int32_t>(cn), (std::vector<std::int32_t>{3, 3}));
  EXPECT_EQ(raw_values<std::int32_t>(sa), (std::vector<std::int32_t>{2, 4, 6, 0, 3, 5, -1, -1}));
  EXPECT_EQ(raw_values<std::int32_t>(so), (std::vector<std::int32_t>{3, -1, 0, 4, 1, 5, 2, -1}));
}

// ---- token movement ---------------------------------------------------------------------------

class MoeMoveTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoeMoveTest, GatherCombineGatedAddMatchTheReference) {
  const DType dt = GetParam();
  const Tol tol = kMoeMoveTols.of(dt), dot_tol = kMoeDotTols.of(dt);
  std::mt19937_64 rng(65);
  for (const MoeMoveCase& c : kMoeMoveCases) {
    SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
    const std::int64_t N = c.N, C = c.C, k = c.k, M = N * k;
    const auto ex = moe_plan_experts(rng, N, k, c.E, MoePlanPattern::random);
    const RefPlan plan = ref_plan(ex, N, k, c.E, c.capacity);
    std::int64_t slots = 0;
    for (std::int32_t n : plan.counts) slots += n;
    Buf sa = i32_buf(plan.slot_assignment), so = i32_buf(plan.slot_of);
    const std::int64_t R = slots + 2;  // two rows past the slots: never touched
    Buf x(dt, N * C), rows(dt, R * C), out(dt, N * C), out_plain(dt, N * C), weight(DType::fp32, M), dout(dt, N * C), drows(dt, R * C),
        dweight(DType::fp32, M);
    x.fill_uniform(rng, -1, 1);
    rows.fill(7.0);
    out.fill_uniform(rng, -1, 1);
    out_plain.fill_uniform(rng, -1, 1);
    weight.fill_uniform(rng, 0, 1);
    dout.fill_uniform(rng, -1, 1);
    drows.fill(7.0);
    dweight.fill(9.0);
    const auto out0 = out.values(), plain0 = out_plain.values();

    moe_gather_rows(rows.tensor({R, C}), x.tensor({N, C}), sa.tensor({M}), k, slots);
    for (std::int64_t s = 0; s < R; ++s) {
      const std::int64_t t = s < slots ? plan.slot_assignment[static_cast<std::size_t>(s)] / k : -1;
      for (std::int64_t i = 0; i < C; ++i) ASSERT_EQ(rows.get(s * C + i), t >= 0 ? x.get(t * C + i) : 7.0) << "row " << s << " col " << i;
    }
    // Make the slot rows differ from x (so a combine reading x instead of rows is caught).
    for (std::int64_t i = 0; i < slots * C; ++i) rows.set(i, rows.get(i) * 0.5 + 0.25);

    moe_combine(out.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}), weight.tensor({N, k}), k);
    moe_combine(out_plain.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}), Tensor{}, k);
    std::vector<double> want(out0), want_plain(plain0), want_dw(static_cast<std::size_t>(M), 0.0);
    auto want_drows = drows.values();
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t s = plan.slot_of[static_cast<std::size_t>(t * k + j)];
        if (s < 0) continue;
        const double w = weight.get(t * k + j);
        for (std::int64_t i = 0; i < C; ++i) {
          const auto o = static_cast<std::size_t>(t * C + i);
          want[o] += w * rows.get(s * C + i);
          want_plain[o] += rows.get(s * C + i);
          want_drows[static_cast<std::size_t>(s * C + i)] = w * dout.get(t * C + i);
          want_dw[static_cast<std::size_t>(t * k + j)] += dout.get(t * C + i) * rows.get(s * C + i);
        }
      }
    expect_close(out, want, tol, "combine");
    expect_close(out_plain, want_plain, tol, "combine without weights");

    moe_combine_backward(drows.tensor({R, C}), dweight.tensor({N, k}), dout.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}), weight.tensor({N, k}), k);
    expect_close(drows, want_drows, tol, "combine_backward drows");
    expect_close(dweight, want_dw, kMoeDotTols.fp32, "combine_backward dweight");

    // Gated shared expert: out += sigmoid(g)·y, and its backward.
    Buf y(dt, N * C), logit(dt, N), dy(dt, N * C), dlogit(dt, N);
    y.fill_uniform(rng, -1, 1);
    logit.fill_uniform(rng, -4, 4);
    dy.fill(5.0);
    dlogit.fill(5.0);
    const auto base = out.values();
    moe_gated_add_forward(out.tensor({N, C}), y.tensor({N, C}), logit.tensor({N}));
    moe_gated_add_backward(dy.tensor({N, C}), dlogit.tensor({N}), dout.tensor({N, C}), y.tensor({N, C}), logit.tensor({N}));
    std::vector<double> want_out(base), want_dy(static_cast<std::size_t>(N * C)), want_dl(static_cast<std::size_t>(N));
    for (std::int64_t t = 0; t < N; ++t) {
      const double s = 1.0 / (1.0 + std::exp(-logit.get(t)));
      double dot = 0;
      for (std::int64_t i = 0; i < C; ++i) {
        const auto o = static_cast<std::size_t>(t * C + i);
        want_out[o] += s * y.get(t * C + i);
        want_dy[o] = s * dout.get(t * C + i);
        dot += dout.get(t * C + i) * y.get(t * C + i);
      }
      want_dl[static_cast<std::size_t>(t)] = s * (1 - s) * dot;
    }
    expect_close(out, want_out, tol, "gated_add out");
    expect_close(dy, want_dy, tol, "gated_add dy");
    expect_close(dlogit, want_dl, dot_tol, "gated_add dlogit");
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, MoeMoveTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// ---- errors -----------------------------------------------------------------------------------

TEST(MoeErrors, BadArgumentsNameTheOp) {
  Buf l32(DType::fp32, 16), l16(DType::bf16, 16), sc(DType::fp32, 16), ex(DType::int32, 4), w(DType::fp32, 4), exf(DType::fp32, 4);
  const MoeRouting r2{.top_k = 2};
  // Routing: dtype, shape, top_k > E, groups.
  expect_error([&] { moe_route_forward(sc.tensor({2, 8}), ex.tensor({2, 2}), w.tensor({2, 2}), l16.tensor({2, 8}), r2); },
               {"moe_route_forward", "logits", "fp32"});
  expect_error([&] { moe_route_forward(sc.tensor({2, 8}), exf.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), r2); },
               {"moe_route_forward", "expert", "int32"});
  expect_error([&] { moe_route_forward(sc.tensor({2, 8}), ex.tensor({4, 1}), w.tensor({2, 2}), l32.tensor({2, 8}), r2); },
               {"moe_route_forward", "expert", "[4, 1]"});
  expect_error([&] { moe_route_forward(sc.tensor({2, 8}), ex.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), MoeRouting{.top_k = 9}); },
               {"moe_route_forward", "top_k = 9"});
  expect_error([&] { moe_route_forward(sc.tensor({2, 8}), ex.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), MoeRouting{.top_k = 2, .n_group = 3}); },
               {"moe_route_forward", "n_group"});
  // moe_route_backward: an expert id outside [0, E) is an Error, not a write out of bounds.
  {
    Buf bad = i32_buf({0, 8, 1, 2}), dl(DType::fp32, 16);
    expect_error([&] { moe_route_backward(dl.tensor({2, 8}), w.tensor({2, 2}), sc.tensor({2, 8}), bad.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), Tensor{}, r2); },
                 {"moe_route_backward", "expert 8"});
    Buf neg = i32_buf({0, 1, -1, 2});
    expect_error([&] { moe_route_backward(dl.tensor({2, 8}), w.tensor({2, 2}), sc.tensor({2, 8}), neg.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), Tensor{}, r2); },
                 {"moe_route_backward", "expert -1"});
    expect_error([&] { moe_route_backward(dl.tensor({2, 8}), w.tensor({2, 2}), sc.tensor({2, 8}), ex.tensor({2, 2}), w.tensor({2, 2}), l32.tensor({2, 8}), w.tensor({4}), r2); },
                 {"moe_route_backward", "aux_grad", "[4]"});
  }
  // Aux statistics.
  {
    std::vector<double> a(8), p(8);
    std::vector<float> pf(8);
    expect_error([&] { moe_aux_stats(Tensor(a.data(), DType::fp64, Shape{8}), Tensor(p.data(), DType::fp64, Shape{8}), l32.tensor({2, 8}), 9); },
                 {"moe_aux_stats", "top_k"});
    expect_error([&] { moe_aux_stats(Tensor(a.data(), DType::fp64, Shape{8}), Tensor(pf.data(), DType::fp32, Shape{8}), l32.tensor({2, 8}), 2); },
                 {"moe_aux_stats", "prob_sum", "fp64"});
  }
  // The plan: ids out of range, shapes.
  {
    Buf sa(DType::int32, 4), so(DType::int32, 4), cn(DType::int32, 3);
    Buf high = i32_buf({0, 1, 2, 3}), low = i32_buf({0, -1, 2, 1});
    expect_error([&] { moe_dispatch_plan(sa.tensor({4}), so.tensor({4}), cn.tensor({3}), high.tensor({2, 2}), -1); },
                 {"moe_dispatch_plan", "token 1 choice 1", "expert 3"});
    expect_error([&] { moe_dispatch_plan(sa.tensor({4}), so.tensor({4}), cn.tensor({3}), low.tensor({2, 2}), 2); }, {"moe_dispatch_plan", "expert -1"});
    expect_error([&] { moe_dispatch_plan(sa.tensor({4}), so.tensor({2, 2}), cn.tensor({3}), low.tensor({2, 2}), 2); }, {"moe_dispatch_plan", "slot_of"});
    expect_error([&] { moe_dispatch_plan(sa.tensor({4}), so.tensor({4}), cn.tensor({3}), exf.tensor({2, 2}), 2); }, {"moe_dispatch_plan", "expert", "int32"});
  }
  // Movement: slot indices out of range, shapes, dtypes.
  {
    Buf x(DType::fp32, 6), rows(DType::fp32, 6), rows16(DType::fp16, 6), wt(DType::fp32, 4);
    Buf bad_sa = i32_buf({0, 7, -1, -1}), bad_so = i32_buf({0, 3, 1, -1});
    expect_error([&] { moe_gather_rows(rows.tensor({3, 2}), x.tensor({3, 2}), bad_sa.tensor({4}), 2, 2); }, {"moe_gather_rows", "slot 1"});
    expect_error([&] { moe_gather_rows(rows.tensor({3, 2}), x.tensor({3, 2}), bad_sa.tensor({4}), 2, 5); }, {"moe_gather_rows", "5 slots"});
    expect_error([&] { moe_combine(wt.tensor({2, 2}), rows.tensor({3, 2}), bad_so.tensor({4}), Tensor{}, 2); },
                 {"moe_combine", "slot 3"});
    expect_error([&] { moe_combine(x.tensor({3, 2}), rows16.tensor({3, 2}), bad_so.tensor({4}), Tensor{}, 2); }, {"moe_combine", "fp16"});
    expect_error([&] { moe_combine(wt.tensor({2, 2}), rows.tensor({3, 2}), bad_so.tensor({4}), w.tensor({4}), 2); }, {"moe_combine", "weight"});
    Buf ok_so = i32_buf({0, 1, 2, -1}), dr(DType::fp32, 6), dw(DType::fp32, 4);
    expect_error([&] { moe_combine_backward(dr.tensor({3, 2}), dw.tensor({2, 2}), wt.tensor({2, 2}), rows.tensor({3, 2}), ok_so.tensor({4}), Tensor{}, 2); },
                 {"moe_combine_backward", "weight"});
    expect_error([&] { moe_gated_add_forward(x.tensor({3, 2}), rows.tensor({3, 2}), wt.tensor({4})); }, {"moe_gated_add_forward", "logit"});
    Buf g16(DType::bf16, 3), dg(DType::fp32, 3);
    expect_error([&] { moe_gated_add_backward(dr.tensor({3, 2}), dg.tensor({3}), x.tensor({3, 2}), rows.tensor({3, 2}), g16.tensor({3})); },
                 {"moe_gated_add_backward", "bf16"});
  }
}

}  // namespace
