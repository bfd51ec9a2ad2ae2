// LayerNorm, CPU. Forward and dinp are parallel over rows (independent); dweight/dbias are
// parallel over blocks of channels, each block summing all rows in order, so the result does
// not depend on the number of threads and no thread writes another's channels.
#include "ops/kernels/layernorm.h"

#include <cmath>
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct LnShape {
  std::int64_t rows, C;
  Shape lead;  // leading dims of inp: the shape of mean / rstd
};

LnShape check_ln(const char* op, const char* xname, const Tensor& x, const Tensor& weight, const char* wname, const Tensor& bias, const char* bname,
                 const Tensor& mean, const Tensor& rstd) {
  require_present(op, {xname, x});
  if (x.shape.rank < 1) fail("{}: tensor '{}' has shape {} but (..., C) with at least one dimension is expected", op, xname, x.shape.str());
  LnShape s;
  s.C = x.shape[x.shape.rank - 1];
  s.rows = s.C == 0 ? 0 : x.numel() / s.C;
  s.lead = x.shape;
  s.lead.rank -= 1;
  if (s.lead.rank == 0) s.lead = Shape{1};
  require_shape(op, {wname, weight}, Shape{s.C}, "(C) with C the last dimension of " + std::string(xname));
  require_shape(op, {bname, bias}, Shape{s.C}, "(C) with C the last dimension of " + std::string(xname));
  if (mean.shape.numel() != s.rows || rstd.shape.numel() != s.rows || mean.empty() || rstd.empty()) {
    fail("{}: mean {} and rstd {} must hold one fp32 per row of {} {}, i.e. shape {}", op, mean.shape.str(), rstd.shape.str(), xname, x.shape.str(),
         s.lead.str());
  }
  require_dtype(op, {"mean", mean}, DType::fp32);
  require_dtype(op, {"rstd", rstd}, DType::fp32);
  return s;
}

// Normalises one row already in fp32 (xs), writing out, mean, rstd. Two passes over xs (mean,
// then the variance of the deviations) avoid the cancellation of E[x^2] - E[x]^2.
template <typename T>
inline void normalize_row(const float* __restrict xs, T* __restrict o, const T* __restrict w, const T* __restrict b, std::int64_t C, float eps,
                          float* mean_out, float* rstd_out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c < C; ++c) sum += xs[c];
  const float m = sum / static_cast<float>(C);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (std::int64_t c = 0; c < C; ++c) {
    const float d = xs[c] - m;
    var += d * d;
  }
  const float r = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  for (std::int64_t c = 0; c < C; ++c) o[c] = cpu::store<T>((xs[c] - m) * r * cpu::load(w[c]) + cpu::load(b[c]));
  *mean_out = m;
  *rstd_out = r;
}

// The same row normalisation reading the row from its storage type directly: the path for rows
// longer than the stack buffer below (slower: three passes over T instead of one widening).
template <typename T>
inline void normalize_row_from_storage(const T* __restrict x, T* __restrict o, const T* __restrict w, const T* __restrict b, std::int64_t C,
                                       float eps, float* mean_out, float* rstd_out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c < C; ++c) sum += cpu::load(x[c]);
  const float m = sum / static_cast<float>(C);
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (std::int64_t c = 0; c < C; ++c) {
    const float d = cpu::load(x[c]) - m;
    var += d * d;
  }
  const float r = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
  for (std::int64_t c = 0; c < C; ++c) o[c] = cpu::store<T>((cpu::load(x[c]) - m) * r * cpu::load(w[c]) + cpu::load(b[c]));
  *mean_out = m;
  *rstd_out = r;
}

// Rows are normalised from an fp32 copy held in a fixed stack buffer (no allocation); rows
// longer than the buffer take normalize_row_from_storage. Both give the same float ops.
constexpr std::int64_t kRowBuf = 8192;

template <typename T>
void ln_forward_impl(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b, std::int64_t rows, std::int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * C))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict x = inp + r * C;
    if (C <= kRowBuf) {
      float xs[kRowBuf];
      for (std::int64_t c = 0; c < C; ++c) xs[c] = cpu::load(x[c]);
      normalize_row(xs, out + r * C, w, b, C, eps, mean + r, rstd + r);
    } else {
      normalize_row_from_storage(x, out + r * C, w, b, C, eps, mean + r, rstd + r);
    }
  }
}

}  // namespace

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps) {
  const char* op = "layernorm_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"mean", mean}, {"rstd", rstd}, {"inp", inp}, {"weight", weight}, {"bias", bias}});
  const LnShape s = check_ln(op, "inp", inp, weight, "weight", bias, "bias", mean, rstd);
  require_shape(op, {"out", out}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"out", out}, {"weight", weight}, {"bias", bias}});
  DSTRAIN_RETURN_ON_CUDA(gpu, layernorm_forward(out, mean, rstd, inp, weight, bias, eps));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    ln_forward_impl<T>(static_cast<T*>(out.data), static_cast<float*>(mean.data), static_cast<float*>(rstd.data), static_cast<const T*>(inp.data),
                       static_cast<const T*>(weight.data), static_cast<const T*>(bias.data), s.rows, s.C, eps);
  });
}

void fused_residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor weight, Tensor bias,
                                      float eps) {
  const char* op = "fused_residual_layernorm_forward";
  const bool gpu =
      cpu::on_cuda(op,
                   {{"residual", residual}, {"out", out}, {"mean", mean}, {"rstd", rstd}, {"a", a}, {"b", b}, {"weight", weight}, {"bias", bias}});
  const LnShape s = check_ln(op, "a", a, weight, "weight", bias, "bias", mean, rstd);
  require_shape(op, {"b", b}, a.shape, "(the shape of a)");
  require_shape(op, {"residual", residual}, a.shape, "(the shape of a)");
  require_shape(op, {"out", out}, a.shape, "(the shape of a)");
  require_same_dtype(op, {{"a", a}, {"b", b}, {"residual", residual}, {"out", out}, {"weight", weight}, {"bias", bias}});
  DSTRAIN_RETURN_ON_CUDA(gpu, fused_residual_layernorm_forward(residual, out, mean, rstd, a, b, weight, bias, eps));
  cpu::dispatch_float(op, a.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* pa = static_cast<const T*>(a.data);
    const T* pb = static_cast<const T*>(b.data);
    T* res = static_cast<T*>(residual.data);
    T* o = static_cast<T*>(out.data);
    const T* w = static_cast<const T*>(weight.data);
    const T* bi = static_cast<const T*>(bias.data);
    auto* mp = static_cast<float*>(mean.data);
    auto* rp = static_cast<float*>(rstd.data);
    const std::int64_t C = s.C;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.rows * C))
    for (std::int64_t r = 0; r < s.rows; ++r) {
      const T* ra = pa + r * C;  // may alias res: each element is read before it is written
      const T* rb = pb + r * C;
      T* rr = res + r * C;
      if (C <= kRowBuf) {
        float xs[kRowBuf];
        for (std::int64_t c = 0; c < C; ++c) {
          const T v = cpu::store<T>(cpu::load(ra[c]) + cpu::load(rb[c]));
          rr[c] = v;
          xs[c] = cpu::load(v);  // normalise the stored (rounded) residual, as layernorm_forward would
        }
        normalize_row(xs, o + r * C, w, bi, C, eps, mp + r, rp + r);
      } else {
        for (std::int64_t c = 0; c < C; ++c) rr[c] = cpu::store<T>(cpu::load(ra[c]) + cpu::load(rb[c]));
        normalize_row_from_storage(rr, o + r * C, w, bi, C, eps, mp + r, rp + r);
      }
    }
  });
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor mean, Tensor rstd) {
  const char* op = "layernorm_backward";
  const bool gpu = cpu::on_cuda(op, {{"dinp", dinp},
                                     {"dweight", dweight},
                                     {"dbias", dbias},
                                     {"dout", dout},
                                     {"inp", inp},
                                     {"weight", weight},
                                     {"mean", mean},
                                     {"rstd", rstd}});
  const LnShape s = check_ln(op, "inp", inp, weight, "weight", dweight, "dweight", mean, rstd);
  require_shape(op, {"dbias", dbias}, Shape{s.C}, "(C)");
  require_shape(op, {"dout", dout}, inp.shape, "(the shape of inp)");
  require_shape(op, {"dinp", dinp}, inp.shape, "(the shape of inp)");
  require_same_dtype(op, {{"inp", inp}, {"dinp", dinp}, {"dout", dout}, {"weight", weight}, {"dweight", dweight}, {"dbias", dbias}});
  if (dinp.data == dout.data || dinp.data == inp.data) fail("{}: dinp must not alias dout or inp (dinp accumulates)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd));
  cpu::dispatch_float(op, inp.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* di = static_cast<T*>(dinp.data);
    T* dw = static_cast<T*>(dweight.data);
    T* db = static_cast<T*>(dbias.data);
    const T* g = static_cast<const T*>(dout.data);
    const T* x = static_cast<const T*>(inp.data);
    const T* w = static_cast<const T*>(weight.data);
    const float* mp = static_cast<const float*>(mean.data);
    const float* rp = static_cast<const float*>(rstd.data);
    const std::int64_t C = s.C, rows = s.rows;
    // dinp, per row: dnorm = w * dout; dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * C))
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* __restrict gr = g + r * C;
      const T* __restrict xr = x + r * C;
      T* __restrict dr = di + r * C;
      const float m = mp[r], rs = rp[r];
      float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
      for (std::int64_t c = 0; c < C; ++c) {
        const float dn = cpu::load(w[c]) * cpu::load(gr[c]);
        sum_dn += dn;
        sum_dn_n += dn * (cpu::load(xr[c]) - m) * rs;
      }
      const float mean_dn = sum_dn / static_cast<float>(C), mean_dn_n = sum_dn_n / static_cast<float>(C);
      for (std::int64_t c = 0; c < C; ++c) {
        const float n = (cpu::load(xr[c]) - m) * rs;
        const float dn = cpu::load(w[c]) * cpu::load(gr[c]);
        dr[c] = cpu::store<T>(cpu::load(dr[c]) + (dn - mean_dn - n * mean_dn_n) * rs);
      }
    }
    // dweight, dbias: channel blocks in parallel, rows in order, double accumulators.
    constexpr std::int64_t kBlock = 64;
    const std::int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(rows * C))
    for (std::int64_t blk = 0; blk < nblocks; ++blk) {
      const std::int64_t c0 = blk * kBlock, cn = (C - c0 < kBlock) ? C - c0 : kBlock;
      double accw[kBlock] = {}, accb[kBlock] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* __restrict gr = g + r * C + c0;
        const T* __restrict xr = x + r * C + c0;
        const float m = mp[r], rs = rp[r];
        for (std::int64_t c = 0; c < cn; ++c) {
          const float gv = cpu::load(gr[c]);
          accw[c] += static_cast<double>((cpu::load(xr[c]) - m) * rs * gv);
          accb[c] += static_cast<double>(gv);
        }
      }
      for (std::int64_t c = 0; c < cn; ++c) {
        dw[c0 + c] = cpu::store<T>(static_cast<float>(cpu::load(dw[c0 + c]) + accw[c]));
        db[c0 + c] = cpu::store<T>(static_cast<float>(cpu::load(db[c0 + c]) + accb[c]));
      }
    }
  });
}

}  // namespace dstrain
