// rmsnorm_forward / fused_residual_rmsnorm_forward / rmsnorm_backward on the GPU against the CPU
// kernels on the CPU tests' case table (tests/unit/kernels/rmsnorm_cases.h) and tolerances: the
// residual is one add and one rounding on both (bit-exact); the rest differs by reduction order.
// The row cut across ranks (rmsnorm_shard_*) too, phase by phase, on a rank's columns of a wider row.
#include <random>
#include <vector>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/head_rmsnorm.h"
#include "ops/kernels/rmsnorm.h"
#include "tests/unit/kernels/head_rmsnorm_cases.h"
#include "tests/unit/kernels/rmsnorm_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Buf f32_values(const std::vector<float>& v) {
  Buf b(DType::fp32, static_cast<std::int64_t>(v.size()));
  for (std::size_t i = 0; i < v.size(); ++i) b.set(static_cast<std::int64_t>(i), v[i]);
  return b;
}

TEST(RmsnormGpu, MatchesCpuOnTheCaseTable) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kRmsnormTols.of(dt);
    std::mt19937_64 rng(7);
    for (const RmsnormCase& c : kRmsnormCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t rows = c.B * c.T, C = c.C, n = rows * C;
      const Shape xs{c.B, c.T, C}, ws{C}, rs{c.B, c.T};
      const auto eps = static_cast<float>(c.eps);
      Buf a(dt, n), b(dt, n), w(dt, C), res(dt, n), out(dt, n), dout(dt, n), dinp(dt, n), dw(dt, C);
      for (Buf* p : {&a, &b, &dout, &dinp, &dw}) p->fill_uniform(rng, -1, 1);
      w.fill_uniform(rng, 0.5, 1.5);
      DeviceTensors g;
      const Tensor d_a = g.put(a, xs), d_b = g.put(b, xs), d_w = g.put(w, ws), d_dout = g.put(dout, xs), d_dinp = g.put(dinp, xs),
                   d_dw = g.put(dw, ws);
      const Tensor d_res = g.zeros(dt, xs), d_out = g.zeros(dt, xs), d_rstd = g.zeros(DType::fp32, rs);
      std::vector<float> rstd(static_cast<std::size_t>(rows));
      const Tensor h_rstd(rstd.data(), DType::fp32, rs);

      fused_residual_rmsnorm_forward(res.tensor(xs), out.tensor(xs), h_rstd, a.tensor(xs), b.tensor(xs), w.tensor(ws), eps);
      rmsnorm_backward(dinp.tensor(xs), dw.tensor(ws), dout.tensor(xs), res.tensor(xs), w.tensor(ws), h_rstd);
      fused_residual_rmsnorm_forward(d_res, d_out, d_rstd, d_a, d_b, d_w, eps);
      rmsnorm_backward(d_dinp, d_dw, d_dout, d_res, d_w, d_rstd);

      const Buf g_res = DeviceTensors::get(d_res);
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(g_res.get(i), res.get(i)) << "residual " << i << " (one add, one rounding)";
      expect_close(DeviceTensors::get(d_out), out.values(), tol, "fused rmsnorm out");
      expect_close(DeviceTensors::get(d_rstd), f32_values(rstd).values(), kRmsnormTols.fp32, "rstd");
      expect_close(DeviceTensors::get(d_dinp), dinp.values(), Tol{tol.atol * 4, tol.rtol * 2}, "dinp");
      expect_close(DeviceTensors::get(d_dw), dw.values(), Tol{tol.atol * static_cast<double>(rows), tol.rtol}, "dweight");

      // Plain RMSNorm of a.
      Buf out2(dt, n);
      const Tensor d_out2 = g.zeros(dt, xs);
      rmsnorm_forward(out2.tensor(xs), h_rstd, a.tensor(xs), w.tensor(ws), eps);
      rmsnorm_forward(d_out2, d_rstd, d_a, d_w, eps);
      expect_close(DeviceTensors::get(d_out2), out2.values(), tol, "rmsnorm out");
    }
  }
}

// The four phases of a row cut across tensor-parallel ranks (OLMoE's q/k norm): each on the GPU
// against the CPU, the later phases fed the CPU's (the group's) sums so that each is checked alone;
// the rank holds C columns of a row of n = 3C (the other ranks' share folded into the sums).
TEST(RmsnormShardGpu, MatchesCpuPhaseByPhase) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kRmsnormTols.of(dt);
    std::mt19937_64 rng(9);
    for (const RmsnormCase& c : kRmsnormCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t rows = c.B * c.T, C = c.C, n = rows * C, whole = 3 * C;
      const Shape xs{rows, C}, ws{C}, rs{rows};
      const auto eps = static_cast<float>(c.eps);
      Buf x(dt, n), w(dt, C), g(dt, n), dinp(dt, n), dw(dt, C), out(dt, n);
      for (Buf* p : {&x, &g, &dinp, &dw}) p->fill_uniform(rng, -1, 1);
      w.fill_uniform(rng, 0.5, 1.5);
      DeviceTensors d;
      const Tensor d_x = d.put(x, xs), d_w = d.put(w, ws), d_g = d.put(g, xs), d_dinp = d.put(dinp, xs), d_dw = d.put(dw, ws);
      std::vector<float> sums(static_cast<std::size_t>(rows)), rstd(sums.size()), dots(sums.size());
      rmsnorm_shard_sum_squares(Tensor(sums.data(), DType::fp32, rs), x.tensor(xs));
      const Tensor d_sums = d.zeros(DType::fp32, rs);
      rmsnorm_shard_sum_squares(d_sums, d_x);
      expect_close(DeviceTensors::get(d_sums), f32_values(sums).values(), kRmsnormTols.fp32, "sums");
      for (float& v : sums) v *= 3.0f;  // the group's: two more ranks' columns like these
      Buf group_sums = f32_values(sums);
      const Tensor d_group = d.put(group_sums, rs), d_rstd = d.zeros(DType::fp32, rs), d_out = d.zeros(dt, xs);
      rmsnorm_shard_forward(out.tensor(xs), Tensor(rstd.data(), DType::fp32, rs), x.tensor(xs), w.tensor(ws), Tensor(sums.data(), DType::fp32, rs),
                            whole, eps);
      rmsnorm_shard_forward(d_out, d_rstd, d_x, d_w, d_group, whole, eps);
      expect_close(DeviceTensors::get(d_out), out.values(), tol, "out");
      expect_close(DeviceTensors::get(d_rstd), f32_values(rstd).values(), kRmsnormTols.fp32, "rstd");
      Buf cpu_rstd = f32_values(rstd);
      const Tensor h_rstd(rstd.data(), DType::fp32, rs), d_rstd_cpu = d.put(cpu_rstd, rs), d_dots = d.zeros(DType::fp32, rs);
      rmsnorm_shard_backward_dot(Tensor(dots.data(), DType::fp32, rs), g.tensor(xs), x.tensor(xs), w.tensor(ws), h_rstd);
      rmsnorm_shard_backward_dot(d_dots, d_g, d_x, d_w, d_rstd_cpu);
      expect_close(DeviceTensors::get(d_dots), f32_values(dots).values(), Tol{kRmsnormTols.fp32.atol * 4, kRmsnormTols.fp32.rtol * 4}, "dots");
      for (float& v : dots) v *= 2.0f;
      Buf group_dots = f32_values(dots);
      const Tensor d_group_dots = d.put(group_dots, rs);
      rmsnorm_shard_backward(dinp.tensor(xs), dw.tensor(ws), g.tensor(xs), x.tensor(xs), w.tensor(ws), h_rstd, Tensor(dots.data(), DType::fp32, rs),
                             whole);
      rmsnorm_shard_backward(d_dinp, d_dw, d_g, d_x, d_w, d_rstd_cpu, d_group_dots, whole);
      expect_close(DeviceTensors::get(d_dinp), dinp.values(), Tol{tol.atol * 4, tol.rtol * 2}, "dinp");
      expect_close(DeviceTensors::get(d_dw), dw.values(), Tol{tol.atol * static_cast<double>(rows), tol.rtol}, "dweight");
    }
  }
}

// Per-head RMSNorm (Qwen3's q/k norm) on the GPU against the CPU, in place, on its case table;
// heads outside the range must come back untouched (bit for bit).
TEST(HeadRmsnormGpu, MatchesCpuOnTheCaseTable) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kFloatDTypes) {
    const Tol tol = kHeadRmsnormTols.of(dt);
    std::mt19937_64 rng(8);
    for (const HeadRmsnormCase& c : kHeadRmsnormCases) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_label(dt));
      const std::int64_t n = c.B * c.T * c.H * c.D;
      const Shape xs{c.B, c.T, c.H, c.D}, ws{c.D}, rs{c.B, c.T, c.nheads};
      Buf x(dt, n), w(dt, c.D), dx(dt, n), dw(dt, c.D);
      for (Buf* p : {&x, &dx, &dw}) p->fill_uniform(rng, -1, 1);
      w.fill_uniform(rng, 0.5, 1.5);
      Buf raw = x;
      DeviceTensors g;
      const Tensor d_x = g.put(x, xs), d_raw = g.put(raw, xs), d_w = g.put(w, ws), d_dx = g.put(dx, xs), d_dw = g.put(dw, ws);
      const Tensor d_rstd = g.zeros(DType::fp32, rs);
      std::vector<float> rstd(static_cast<std::size_t>(c.B * c.T * c.nheads));
      const Tensor h_rstd(rstd.data(), DType::fp32, rs);
      Buf h_raw = raw;
      head_rmsnorm_forward(x.tensor(xs), h_rstd, w.tensor(ws), c.head0, c.nheads, 1e-6f);
      head_rmsnorm_backward(dx.tensor(xs), dw.tensor(ws), h_raw.tensor(xs), w.tensor(ws), h_rstd, c.head0, c.nheads);
      head_rmsnorm_forward(d_x, d_rstd, d_w, c.head0, c.nheads, 1e-6f);
      head_rmsnorm_backward(d_dx, d_dw, d_raw, d_w, d_rstd, c.head0, c.nheads);
      expect_close(DeviceTensors::get(d_x), x.values(), tol, "head_rmsnorm out");
      expect_close(DeviceTensors::get(d_rstd), f32_values(rstd).values(), kHeadRmsnormTols.fp32, "rstd");
      expect_close(DeviceTensors::get(d_dx), dx.values(), Tol{tol.atol * 4, tol.rtol * 2}, "dx");
      expect_close(DeviceTensors::get(d_dw), dw.values(), Tol{tol.atol * static_cast<double>(c.B * c.T * c.nheads), tol.rtol}, "dweight");
    }
  }
}

}  // namespace
