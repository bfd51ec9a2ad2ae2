// RMSNorm, CPU. Forward and dinp are parallel over rows (independent); dweight is parallel over
// blocks of channels, each block summing all rows in order, so the result does not depend on the
// number of threads (the layout of ops/cpu/layernorm.cpp).
#include "ops/kernels/rmsnorm.h"

#include <cmath>
#include <cstdint>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct RmsShape {
  std::int64_t rows, C;
};

// The (rows, C) view of x (..., C), which must be present.
RmsShape rms_shape(const char* op, const char* xname, const Tensor& x) {
  require_present(op, {xname, x});
  if (x.shape.rank < 1) fail("{}: tensor '{}' has shape {} but (..., C) with at least one dimension is expected", op, xname, x.shape.str());
  RmsShape s;
  s.C = x.shape[x.shape.rank - 1];
  s.rows = s.C == 0 ? 0 : x.numel() / s.C;
  return s;
}

RmsShape check_rms(const char* op, const char* xname, const Tensor& x, const Tensor& weight, const char* wname, const Tensor& rstd) {
  const RmsShape s = rms_shape(op, xname, x);
  Shape lead = x.shape;
  lead.rank -= 1;
  if (lead.rank == 0) lead = Shape{1};
  require_shape(op, {wname, weight}, Shape{s.C}, "(C) with C the last dimension of " + std::string(xname));
  if (rstd.shape.numel() != s.rows || rstd.empty()) {
    fail("{}: rstd {} must hold one fp32 per row of {} {}, i.e. shape {}", op, rstd.shape.str(), xname, x.shape.str(), lead.str());
  }
  require_dtype(op, {"rstd", rstd}, DType::fp32);
  return s;
}

// Σ v² of one row read through `get` (fp32 values): the same float operations whichever kernel
// forms it, so the sharded forward on one rank equals the plain one.
template <typename Get>
inline float row_sum_squares(Get&& get, std::int64_t C) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (std::int64_t c = 0; c < C; ++c) {
    const float v = get(c);
    ss += v * v;
  }
  return ss;
}

inline float rstd_of(float ss, std::int64_t n, float eps) { return 1.0f / std::sqrt(ss / static_cast<float>(n) + eps); }

// Normalises one row read through `get` (fp32 values), writing o and *rstd_out. The same float
// operations whichever source the row comes from, so the fused kernel equals the plain one.
template <typename T, typename Get>
inline void normalize_row(Get&& get, T* __restrict o, const T* __restrict w, std::int64_t C, float eps, float* rstd_out) {
  const float r = rstd_of(row_sum_squares(get, C), C, eps);
  for (std::int64_t c = 0; c < C; ++c) o[c] = cpu::store<T>(get(c) * r * cpu::load(w[c]));
  *rstd_out = r;
}

// Σ_c dn·n of one row, dn = w·dout, n = x·rstd: rmsnorm_backward's row sum.
template <typename T>
inline float row_dn_n(const T* __restrict gr, const T* __restrict xr, const T* __restrict w, float rs, std::int64_t C) {
  float sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn_n)
  for (std::int64_t c = 0; c < C; ++c) sum_dn_n += cpu::load(w[c]) * cpu::load(gr[c]) * cpu::load(xr[c]) * rs;
  return sum_dn_n;
}

// dinp += rstd·(dn - n·Σ(dn·n)/count) over the rows, Σ(dn·n) from `dot(r)` (the row's own, or the
// group's), count the whole row's elements.
template <typename T, typename Dot>
void rms_dinp(T* di, const T* g, const T* x, const T* w, const float* rp, std::int64_t rows, std::int64_t C, std::int64_t count, Dot&& dot) {
  // dinp, per row: d(x_k rs)/dx_j = rs (delta_jk - n_j n_k / C) gives rs (dn - n mean(dn n)).
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * C))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict gr = g + r * C;
    const T* __restrict xr = x + r * C;
    T* __restrict dr = di + r * C;
    const float rs = rp[r];
    const float mean_dn_n = dot(r, gr, xr, rs) / static_cast<float>(count);
    for (std::int64_t c = 0; c < C; ++c) {
      const float n = cpu::load(xr[c]) * rs;
      const float dn = cpu::load(w[c]) * cpu::load(gr[c]);
      dr[c] = cpu::store<T>(cpu::load(dr[c]) + (dn - n * mean_dn_n) * rs);
    }
  }
}

// dweight += Σ over rows of x·rstd·dout: channel blocks in parallel, rows in order, double
// accumulators, one rounding.
template <typename T>
void rms_dweight(T* dw, const T* g, const T* x, const float* rp, std::int64_t rows, std::int64_t C) {
  constexpr std::int64_t kBlock = 64;
  const std::int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * C))
  for (std::int64_t blk = 0; blk < nblocks; ++blk) {
    const std::int64_t c0 = blk * kBlock, cn = (C - c0 < kBlock) ? C - c0 : kBlock;
    double accw[kBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* __restrict gr = g + r * C + c0;
      const T* __restrict xr = x + r * C + c0;
      const float rs = rp[r];
      for (std::int64_t c = 0; c < cn; ++c) accw[c] += static_cast<double>(cpu::load(xr[c]) * rs * cpu::load(gr[c]));
    }
    for (std::int64_t c = 0; c < cn; ++c) dw[c0 + c] = cpu::store<T>(static_cast<float>(cpu::load(dw[c0 + c]) + accw[c]));
  }
}

// One fp32 per row of x: (...) for x (..., C).
void require_row_stats(const char* op, const char* name, const Tensor& t, const RmsShape& s, const Tensor& x) {
  Shape lead = x.shape;
  lead.rank -= 1;
  if (lead.rank == 0) lead = Shape{1};
  if (t.empty() || t.shape.numel() != s.rows)
    fail("{}: {} {} must hold one fp32 per row of inp {}, i.e. shape {}", op, name, t.shape.str(), x.shape.str(), lead.str());
  require_dtype(op, {name, t}, DType::fp32);
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  const char* op = "rmsnorm_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"rstd", rstd}, {"inp", inp}, {"weight", weight}});
  const RmsShape s = check_rms(op, "inp", inp, weight, "weight", rstd);
  require_shape(op, {"out", out}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"out", out}, {"weight", weight}});
  if (out.data == inp.data && s.rows > 0) fail("{}: out must not alias inp (the row is read twice)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_forward(out, rstd, inp, weight, eps));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(inp.data);
    T* o = static_cast<T*>(out.data);
    const T* w = static_cast<const T*>(weight.data);
    auto* rp = static_cast<float*>(rstd.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const T* __restrict xr = x + r * C;
      normalize_row<T>([xr](std::int64_t c) { return cpu::load(xr[c]); }, o + r * C, w, C, eps, rp + r);
    }
  });
}

void fused_residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, float eps) {
  const char* op = "fused_residual_rmsnorm_forward";
  const bool gpu = cpu::on_cuda(op, {{"residual", residual}, {"out", out}, {"rstd", rstd}, {"a", a}, {"b", b}, {"weight", weight}});
  const RmsShape s = check_rms(op, "a", a, weight, "weight", rstd);
  require_shape(op, {"b", b}, a.shape, "(the shape of a)");
  require_shape(op, {"residual", residual}, a.shape, "(the shape of a)");
  require_shape(op, {"out", out}, a.shape, "(the shape of a)");
  require_same_dtype(op, {{"a", a}, {"b", b}, {"residual", residual}, {"out", out}, {"weight", weight}});
  if (s.rows > 0 && (out.data == residual.data || out.data == a.data || out.data == b.data)) {
    fail("{}: out must not alias residual, a or b", op);
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, fused_residual_rmsnorm_forward(residual, out, rstd, a, b, weight, eps));
  cpu::dispatch_float(op, a.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    T* res = static_cast<T*>(residual.data);
    T* o = static_cast<T*>(out.data);
    const T* w = static_cast<const T*>(weight.data);
    auto* rp = static_cast<float*>(rstd.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const T* ra = pa + r * C;  // may alias rr: each element is read before it is written
      const T* rb = pb + r * C;
      T* rr = res + r * C;
      for (std::int64_t c = 0; c < C; ++c) rr[c] = cpu::store<T>(cpu::load(ra[c]) + cpu::load(rb[c]));
      // Normalise the stored (rounded) residual, as rmsnorm_forward would.
      const T* rc = rr;
      normalize_row<T>([rc](std::int64_t c) { return cpu::load(rc[c]); }, o + r * C, w, C, eps, rp + r);
    }
  });
}

void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  const char* op = "rmsnorm_backward";
  const bool gpu = cpu::on_cuda(op, {{"dinp", dinp}, {"dweight", dweight}, {"dout", dout}, {"inp", inp}, {"weight", weight}, {"rstd", rstd}});
  const RmsShape s = check_rms(op, "inp", inp, weight, "weight", rstd);
  require_shape(op, {"dweight", dweight}, Shape{s.C}, "(C)");
  require_shape(op, {"dout", dout}, inp.shape, "(the shape of inp)");
  require_shape(op, {"dinp", dinp}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"dinp", dinp}, {"dout", dout}, {"weight", weight}, {"dweight", dweight}});
  if (dinp.data == dout.data || dinp.data == inp.data) fail("{}: dinp must not alias dout or inp (dinp accumulates)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* di = static_cast<T*>(dinp.data);
    const T* g = static_cast<const T*>(dout.data);
    const T* x = static_cast<const T*>(inp.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* rp = static_cast<const float*>(rstd.data);
    rms_dinp(di, g, x, w, rp, s.rows, s.C, s.C, [&](std::int64_t, const T* gr, const T* xr, float rs) { return row_dn_n(gr, xr, w, rs, s.C); });
    rms_dweight(static_cast<T*>(dweight.data), g, x, rp, s.rows, s.C);
  });
}

void rmsnorm_shard_sum_squares(Tensor sums, Tensor inp) {
  const char* op = "rmsnorm_shard_sum_squares";
  const bool gpu = cpu::on_cuda(op, {{"sums", sums}, {"inp", inp}});
  const RmsShape s = rms_shape(op, "inp", inp);
  require_row_stats(op, "sums", sums, s, inp);
  require_floating(op, {"inp", inp});
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_shard_sum_squares(sums, inp));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(inp.data);
    auto* sp = static_cast<float*>(sums.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const T* __restrict xr = x + r * C;
      sp[r] = row_sum_squares([xr](std::int64_t c) { return cpu::load(xr[c]); }, C);
    }
  });
}

void rmsnorm_shard_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, Tensor sums, std::int64_t n, float eps) {
  const char* op = "rmsnorm_shard_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"rstd", rstd}, {"inp", inp}, {"weight", weight}, {"sums", sums}});
  const RmsShape s = check_rms(op, "inp", inp, weight, "weight", rstd);
  require_row_stats(op, "sums", sums, s, inp);
  require_shape(op, {"out", out}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"out", out}, {"weight", weight}});
  if (out.data == inp.data && s.rows > 0) fail("{}: out must not alias inp (the row is read twice)", op);
  if (sums.data == rstd.data) fail("{}: rstd must not be the memory of sums", op);
  if (n < s.C || n < 1)
    fail("{}: the whole row has n = {} elements, fewer than this rank's {} columns (or none); pass the row's width over the group", op, n, s.C);
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_shard_forward(out, rstd, inp, weight, sums, n, eps));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(inp.data);
    T* o = static_cast<T*>(out.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* sp = static_cast<const float*>(sums.data);
    auto* rp = static_cast<float*>(rstd.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const T* __restrict xr = x + r * C;
      T* __restrict orow = o + r * C;
      const float rs = rstd_of(sp[r], n, eps);
      for (std::int64_t c = 0; c < C; ++c) orow[c] = cpu::store<T>(cpu::load(xr[c]) * rs * cpu::load(w[c]));
      rp[r] = rs;
    }
  });
}

void rmsnorm_shard_backward_dot(Tensor dots, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) {
  const char* op = "rmsnorm_shard_backward_dot";
  const bool gpu = cpu::on_cuda(op, {{"dots", dots}, {"dout", dout}, {"inp", inp}, {"weight", weight}, {"rstd", rstd}});
  const RmsShape s = check_rms(op, "inp", inp, weight, "weight", rstd);
  require_row_stats(op, "dots", dots, s, inp);
  require_shape(op, {"dout", dout}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"dout", dout}, {"weight", weight}});
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_shard_backward_dot(dots, dout, inp, weight, rstd));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* g = static_cast<const T*>(dout.data);
    const T* x = static_cast<const T*>(inp.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* rp = static_cast<const float*>(rstd.data);
    auto* dp = static_cast<float*>(dots.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) dp[r] = row_dn_n(g + r * C, x + r * C, w, rp[r], C);
  });
}

void rmsnorm_shard_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, Tensor dots, std::int64_t n) {
  const char* op = "rmsnorm_shard_backward";
  const bool gpu =
      cpu::on_cuda(op, {{"dinp", dinp}, {"dweight", dweight}, {"dout", dout}, {"inp", inp}, {"weight", weight}, {"rstd", rstd}, {"dots", dots}});
  const RmsShape s = check_rms(op, "inp", inp, weight, "weight", rstd);
  require_row_stats(op, "dots", dots, s, inp);
  require_shape(op, {"dweight", dweight}, Shape{s.C}, "(C)");
  require_shape(op, {"dout", dout}, inp.shape, "(the shape of inp)");
  require_shape(op, {"dinp", dinp}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"dinp", dinp}, {"dout", dout}, {"weight", weight}, {"dweight", dweight}});
  if (dinp.data == dout.data || dinp.data == inp.data) fail("{}: dinp must not alias dout or inp (dinp accumulates)", op);
  if (n < s.C || n < 1)
    fail("{}: the whole row has n = {} elements, fewer than this rank's {} columns (or none); pass the row's width over the group", op, n, s.C);
  DSTRAIN_RETURN_ON_CUDA(gpu, rmsnorm_shard_backward(dinp, dweight, dout, inp, weight, rstd, dots, n));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* di = static_cast<T*>(dinp.data);
    const T* g = static_cast<const T*>(dout.data);
    const T* x = static_cast<const T*>(inp.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* rp = static_cast<const float*>(rstd.data);
    const float* dp = static_cast<const float*>(dots.data);
    rms_dinp(di, g, x, w, rp, s.rows, s.C, n, [&](std::int64_t r, const T*, const T*, float) { return dp[r]; });
    rms_dweight(static_cast<T*>(dweight.data), g, x, rp, s.rows, s.C);
  });
}

}  // namespace dstrain
