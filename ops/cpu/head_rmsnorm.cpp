// Per-head RMSNorm (Qwen3 q/k norm), CPU: rows are (token, head) pairs of the range; forward and
// dx are parallel over rows; dweight (computed first, from dout, since dx overwrites dout) is
// parallel over channels, each summing all rows in order: independent of the thread count.
#include "ops/kernels/head_rmsnorm.h"

#include <cmath>
#include <cstdint>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct HeadShape {
  std::int64_t BT, H, D;
};

HeadShape check_heads(const char* op, const char* xname, const Tensor& x, const Tensor& weight, const Tensor& rstd, std::int64_t head0,
                      std::int64_t nheads) {
  require_rank(op, {xname, x}, 4, "(B, T, H, D)");
  HeadShape s{x.shape[0] * x.shape[1], x.shape[2], x.shape[3]};
  if (head0 < 0 || nheads < 0 || head0 + nheads > s.H) {
    fail("{}: heads [{}, {}) are outside the {} heads of '{}' {}", op, head0, head0 + nheads, s.H, xname, x.shape.str());
  }
  require_shape(op, {"weight", weight}, Shape{s.D}, "(D), the head size");
  require_shape(op, {"rstd", rstd}, Shape{x.shape[0], x.shape[1], nheads}, "(B, T, nheads)");
  require_dtype(op, {"rstd", rstd}, DType::fp32);
  return s;
}

}  // namespace

void head_rmsnorm_forward(Tensor x, Tensor rstd, Tensor weight, std::int64_t head0, std::int64_t nheads, float eps) {
  const char* op = "head_rmsnorm_forward";
  const bool gpu = cpu::on_cuda(op, {{"x", x}, {"rstd", rstd}, {"weight", weight}});
  const HeadShape s = check_heads(op, "x", x, weight, rstd, head0, nheads);
  require_same_dtype(op, {{"x", x}, {"weight", weight}});
  DSTRAIN_RETURN_ON_CUDA(gpu, head_rmsnorm_forward(x, rstd, weight, head0, nheads, eps));
  cpu::dispatch_float(op, x.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* px = static_cast<T*>(x.data);
    const T* w = static_cast<const T*>(weight.data);
    float* rp = static_cast<float*>(rstd.data);
    const std::int64_t D = s.D, rows = s.BT * nheads;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * D))
    for (std::int64_t r = 0; r < rows; ++r) {
      T* __restrict xr = px + ((r / nheads) * s.H + head0 + r % nheads) * D;
      float ss = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) {
        const float v = cpu::load(xr[d]);
        ss += v * v;
      }
      const float rs = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (std::int64_t d = 0; d < D; ++d) xr[d] = cpu::store<T>(cpu::load(xr[d]) * rs * cpu::load(w[d]));
      rp[r] = rs;
    }
  });
}

void head_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor inp, Tensor weight, Tensor rstd, std::int64_t head0, std::int64_t nheads) {
  const char* op = "head_rmsnorm_backward";
  const bool gpu = cpu::on_cuda(op, {{"dx", dx}, {"dweight", dweight}, {"inp", inp}, {"weight", weight}, {"rstd", rstd}});
  const HeadShape s = check_heads(op, "inp", inp, weight, rstd, head0, nheads);
  require_shape(op, {"dx", dx}, inp.shape, "(the shape of inp)");
  require_shape(op, {"dweight", dweight}, Shape{s.D}, "(D)");
  require_same_dtype(op, {{"inp", inp}, {"dx", dx}, {"weight", weight}, {"dweight", dweight}});
  if (dx.data == inp.data) fail("{}: dx must not alias inp", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, head_rmsnorm_backward(dx, dweight, inp, weight, rstd, head0, nheads));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* g = static_cast<T*>(dx.data);
    T* dw = static_cast<T*>(dweight.data);
    const T* x = static_cast<const T*>(inp.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* rp = static_cast<const float*>(rstd.data);
    const std::int64_t D = s.D, rows = s.BT * nheads;
    auto offset = [&](std::int64_t r) { return ((r / nheads) * s.H + head0 + r % nheads) * D; };
    // dweight first: dx is overwritten below.
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * D))
    for (std::int64_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t o = offset(r);
        acc += static_cast<double>(cpu::load(x[o + d]) * rp[r] * cpu::load(g[o + d]));
      }
      dw[d] = cpu::store<T>(static_cast<float>(cpu::load(dw[d]) + acc));
    }
    // dx, per row: rs (dn - n mean(dn n)) with n = x rs, dn = w dout (see rmsnorm_backward).
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * D))
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t o = offset(r);
      T* __restrict gr = g + o;
      const T* __restrict xr = x + o;
      const float rs = rp[r];
      float sum_dn_n = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) sum_dn_n += cpu::load(w[d]) * cpu::load(gr[d]) * cpu::load(xr[d]) * rs;
      const float mean_dn_n = sum_dn_n / static_cast<float>(D);
      for (std::int64_t d = 0; d < D; ++d) {
        const float n = cpu::load(xr[d]) * rs;
        const float dn = cpu::load(w[d]) * cpu::load(gr[d]);
        gr[d] = cpu::store<T>((dn - n * mean_dn_n) * rs);
      }
    }
  });
}

}  // namespace dstrain
