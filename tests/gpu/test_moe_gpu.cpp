// The mixture-of-experts kernels on the GPU against the CPU backend on the same inputs (the case
// tables of tests/unit/kernels/moe_cases.h): routing ids, aux counts and the dispatch plan bit for
// bit; float outputs within the CPU tests' tolerances (the device's double exp may differ from
// glibc's in the last ulp, and the dot products of the backward kernels sum in a block's tree).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/moe.h"
#include "tests/unit/kernels/moe_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

std::vector<std::int32_t> ids(const Tensor& d) {
  Buf b = DeviceTensors::get(d);
  return raw_values<std::int32_t>(b);
}

TEST(MoeGpu, RoutingMatchesTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(71);
  for (const MoeRouteCase& c : kMoeRouteCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t N = c.N, E = c.E, k = c.r.top_k;
    Buf logits = f32_buf(moe_logits(rng, N, E));
    Buf sc(DType::fp32, N * E), ex(DType::int32, N * k), w(DType::fp32, N * k), dweight(DType::fp32, N * k), aux(DType::fp32, E),
        dl(DType::fp32, N * E);
    dweight.fill_uniform(rng, -1, 1);
    aux.fill_uniform(rng, -1, 1);
    moe_route_forward(sc.tensor({N, E}), ex.tensor({N, k}), w.tensor({N, k}), logits.tensor({N, E}), c.r);
    moe_route_backward(dl.tensor({N, E}), dweight.tensor({N, k}), sc.tensor({N, E}), ex.tensor({N, k}), w.tensor({N, k}), logits.tensor({N, E}),
                       c.aux ? aux.tensor({E}) : Tensor{}, c.r);

    DeviceTensors g;
    const Tensor d_logits = g.put(logits, {N, E}), d_dweight = g.put(dweight, {N, k}), d_aux = g.put(aux, {E});
    const Tensor d_sc = g.zeros(DType::fp32, {N, E}), d_ex = g.zeros(DType::int32, {N, k}), d_w = g.zeros(DType::fp32, {N, k}),
                 d_dl = g.zeros(DType::fp32, {N, E});
    moe_route_forward(d_sc, d_ex, d_w, d_logits, c.r);
    moe_route_backward(d_dl, d_dweight, d_sc, d_ex, d_w, d_logits, c.aux ? d_aux : Tensor{}, c.r);
    EXPECT_EQ(ids(d_ex), raw_values<std::int32_t>(ex));
    expect_close(DeviceTensors::get(d_sc), sc.values(), kMoeRouteTol, "scores");
    expect_close(DeviceTensors::get(d_w), w.values(), kMoeRouteTol, "weight");
    expect_close(DeviceTensors::get(d_dl), dl.values(), kMoeRouteTol, "dlogits");
  }
}

TEST(MoeGpu, AuxStatsMatchTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(72);
  struct C {
    std::int64_t N, E, k;
  };
  for (const C c : {C{50, 8, 2}, C{7, 16, 3}, C{1, 4, 4}, C{3000, 64, 8}}) {
    SCOPED_TRACE(std::to_string(c.N) + "x" + std::to_string(c.E));
    Buf logits = f32_buf(moe_logits(rng, c.N, c.E));
    Buf assigned(DType::fp64, c.E), prob_sum(DType::fp64, c.E);
    moe_aux_stats(assigned.tensor({c.E}), prob_sum.tensor({c.E}), logits.tensor({c.N, c.E}), c.k);
    DeviceTensors g;
    const Tensor d_logits = g.put(logits, {c.N, c.E}), d_a = g.zeros(DType::fp64, {c.E}), d_p = g.zeros(DType::fp64, {c.E});
    moe_aux_stats(d_a, d_p, d_logits, c.k);
    Buf got_a = DeviceTensors::get(d_a), got_p = DeviceTensors::get(d_p);
    EXPECT_EQ(raw_values<double>(got_a), raw_values<double>(assigned));
    expect_close(raw_values<double>(got_p), raw_values<double>(prob_sum), kMoeProbSumTol, "prob_sum");
  }
}

TEST(MoeGpu, DispatchPlanMatchesTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(73);
  for (const MoePlanCase& c : kMoePlanCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t M = c.N * c.k;
    Buf ex = i32_buf(moe_plan_experts(rng, c.N, c.k, c.E, c.pattern));
    Buf sa(DType::int32, M), so(DType::int32, M), cn(DType::int32, c.E);
    moe_dispatch_plan(sa.tensor({M}), so.tensor({M}), cn.tensor({c.E}), ex.tensor({c.N, c.k}), c.capacity);
    DeviceTensors g;
    const Tensor d_ex = g.put(ex, {c.N, c.k});
    Buf junk = i32_buf(std::vector<std::int32_t>(static_cast<std::size_t>(M), 77)), junk_e = i32_buf(std::vector<std::int32_t>(static_cast<std::size_t>(c.E), 77));
    const Tensor d_sa = g.put(junk, {M}), d_so = g.put(junk, {M}), d_cn = g.put(junk_e, {c.E});
    moe_dispatch_plan(d_sa, d_so, d_cn, d_ex, c.capacity);
    EXPECT_EQ(ids(d_sa), raw_values<std::int32_t>(sa));
    EXPECT_EQ(ids(d_so), raw_values<std::int32_t>(so));
    EXPECT_EQ(ids(d_cn), raw_values<std::int32_t>(cn));
  }
  // Ids outside [0, E) are the CPU's Error on the device too.
  Buf bad = i32_buf({0, 1, 2, 3});
  DeviceTensors g;
  const Tensor d_bad = g.put(bad, {2, 2}), d_sa = g.zeros(DType::int32, {4}), d_so = g.zeros(DType::int32, {4}), d_cn = g.zeros(DType::int32, {3});
  expect_error([&] { moe_dispatch_plan(d_sa, d_so, d_cn, d_bad, -1); }, {"moe_dispatch_plan", "token 1 choice 1", "expert 3"});
}

TEST(MoeGpu, TokenMovementMatchesTheCpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kMoeMoveTols.of(dt), dot_tol = kMoeDotTols.of(dt);
    std::mt19937_64 rng(74);
    for (const MoeMoveCase& c : kMoeMoveCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t N = c.N, C = c.C, k = c.k, M = N * k, R = M + 1;
      Buf ex = i32_buf(moe_plan_experts(rng, N, k, c.E, MoePlanPattern::random));
      Buf sa(DType::int32, M), so(DType::int32, M), cn(DType::int32, c.E);
      moe_dispatch_plan(sa.tensor({M}), so.tensor({M}), cn.tensor({c.E}), ex.tensor({N, k}), c.capacity);
      std::int64_t slots = 0;
      for (std::int32_t n : raw_values<std::int32_t>(cn)) slots += n;
      Buf x(dt, N * C), rows(dt, R * C), out(dt, N * C), out_plain(dt, N * C), weight(DType::fp32, M), dout(dt, N * C), drows(dt, R * C),
          dweight(DType::fp32, M), y(dt, N * C), logit(dt, N), dy(dt, N * C), dlogit(dt, N);
      for (Buf* b : {&x, &out, &out_plain, &dout, &y}) b->fill_uniform(rng, -1, 1);
      weight.fill_uniform(rng, 0, 1);
      logit.fill_uniform(rng, -4, 4);
      rows.fill(7.0);
      drows.fill(7.0);
      dweight.fill(9.0);
      DeviceTensors g;
      const Tensor d_x = g.put(x, {N, C}), d_rows = g.put(rows, {R, C}), d_out = g.put(out, {N, C}), d_plain = g.put(out_plain, {N, C}),
                   d_w = g.put(weight, {N, k}), d_dout = g.put(dout, {N, C}), d_drows = g.put(drows, {R, C}), d_dw = g.put(dweight, {N, k}),
                   d_y = g.put(y, {N, C}), d_logit = g.put(logit, {N}), d_dy = g.put(dy, {N, C}), d_dlogit = g.put(dlogit, {N}),
                   d_sa = g.put(sa, {M}), d_so = g.put(so, {M});
      // CPU, then the device, the same sequence.
      moe_gather_rows(rows.tensor({R, C}), x.tensor({N, C}), sa.tensor({M}), k, slots);
      moe_combine(out.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}), weight.tensor({N, k}), k);
      moe_combine(out_plain.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}), Tensor{}, k);
      moe_combine_backward(drows.tensor({R, C}), dweight.tensor({N, k}), dout.tensor({N, C}), rows.tensor({R, C}), so.tensor({M}),
                           weight.tensor({N, k}), k);
      moe_gated_add_forward(out.tensor({N, C}), y.tensor({N, C}), logit.tensor({N}));
      moe_gated_add_backward(dy.tensor({N, C}), dlogit.tensor({N}), dout.tensor({N, C}), y.tensor({N, C}), logit.tensor({N}));

      moe_gather_rows(d_rows, d_x, d_sa, k, slots);
      moe_combine(d_out, d_rows, d_so, d_w, k);
      moe_combine(d_plain, d_rows, d_so, Tensor{}, k);
      moe_combine_backward(d_drows, d_dw, d_dout, d_rows, d_so, d_w, k);
      moe_gated_add_forward(d_out, d_y, d_logit);
      moe_gated_add_backward(d_dy, d_dlogit, d_dout, d_y, d_logit);

      expect_close(DeviceTensors::get(d_rows), rows.values(), Tol{0, 0}, "gathered rows (copies)");
      expect_close(DeviceTensors::get(d_out), out.values(), tol, "combine + gated add");
      expect_close(DeviceTensors::get(d_plain), out_plain.values(), tol, "combine without weights");
      expect_close(DeviceTensors::get(d_drows), drows.values(), tol, "drows");
      expect_close(DeviceTensors::get(d_dw), dweight.values(), kMoeDotTols.fp32, "dweight");
      expect_close(DeviceTensors::get(d_dy), dy.values(), tol, "gated dy");
      expect_close(DeviceTensors::get(d_dlogit), dlogit.values(), dot_tol, "gated dlogit");
    }
  }
}

}  // namespace
