// Causal self-attention, CPU, flash-style and tiled: forward runs an online softmax over key
// blocks for a block of queries (parallel over (b, h, query block), longest blocks first);
// backward recomputes the probabilities from lse, with key blocks outer so dk/dv of a block
// accumulate in a stack tile, and dq accumulates in fp32 scratch (parallel over (b, h)).
// No T×T buffer exists anywhere.
#include "ops/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/cpu/attention_bf16.h"
#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

constexpr std::int64_t kMaxHS = kAttentionMaxHeadSize;

using cpu::AttShape;  // ops/cpu/attention_bf16.h

AttShape check_att(const char* op, const Tensor& qkv, const Tensor& lse, AttentionHeads heads, std::int64_t window) {
  require_rank(op, {"qkv", qkv}, 3, "(B, T, (NH + 2*NKV)*HS)");
  const std::int64_t NH = heads.q, NKV = heads.kv, W = qkv.shape[2];
  AttShape s{};
  s.B = qkv.shape[0];
  s.T = qkv.shape[1];
  s.NH = NH;
  s.NKV = NKV;
  s.W = W;
  if (NKV == NH) {  // GPT-2's multi-head attention: the messages speak of (B, T, 3C)
    if (W % 3 != 0) fail("{}: tensor 'qkv' has shape {} but (B, T, 3C) is expected: the last dimension is not a multiple of 3", op, qkv.shape.str());
    if (NH <= 0 || (W / 3) % NH != 0) fail("{}: NH = {} must be positive and divide C = {} (qkv {})", op, NH, W / 3, qkv.shape.str());
  } else {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0) {
      fail("{}: the KV head count NKV = {} must be positive and divide the query head count NH = {} (grouped-query attention)", op, NKV, NH);
    }
    if (W % (NH + 2 * NKV) != 0) {
      fail("{}: tensor 'qkv' has shape {} but (B, T, (NH + 2*NKV)*HS) is expected with NH = {}, NKV = {}: {} is not a multiple of {}", op,
           qkv.shape.str(), NH, NKV, W, NH + 2 * NKV);
    }
  }
  s.HS = W / (NH + 2 * NKV);
  s.C = NH * s.HS;
  s.G = NH / NKV;
  s.koff = s.C;
  s.voff = s.C + NKV * s.HS;
  if (s.HS > kMaxHS)
    fail("{}: head size HS = {} exceeds the supported maximum {} (qkv {}, NH = {}, NKV = {})", op, s.HS, kMaxHS, qkv.shape.str(), NH, NKV);
  require_shape(op, {"lse", lse}, Shape{s.B, NH, s.T}, "(B, NH, T)");
  require_dtype(op, {"lse", lse}, DType::fp32);
  if (window < 0) fail("{}: sliding window = {} must be >= 0 (0: none)", op, window);
  s.win = window > 0 && window < s.T ? window : s.T;
  return s;
}

void check_dropout(const char* op, const DropoutParams& p, const AttShape& s) {
  if (p.p > 0.0f && static_cast<std::uint64_t>(s.B * s.NH) * static_cast<std::uint64_t>(s.T * s.T) > RngKey::kMaxElements) {
    fail("{}: B*NH*T*T = {}*{}*{}*{} dropout elements exceed the Philox stream's 2^50", op, s.B, s.NH, s.T, s.T);
  }
  if (!(p.p >= 0.0f && p.p < 1.0f)) fail("{}: attention dropout probability p = {} is outside [0, 1)", op, p.p);
  if (!p.rng.valid()) {
    fail("{}: RngKey layer = {}, micro_batch = {}, site = {} must each be < 65536", op, p.rng.layer, p.rng.micro_batch, p.rng.site);
  }
}

// The CUDA kernels compute plain causal attention: a window that masks a key (win < T) is refused.
void check_no_window_on_cuda(const char* op, const AttShape& s) {
  if (s.win < s.T) {
    fail(
        "{}: a sliding window of {} keys shorter than the sequence (T = {}) runs on the CPU only; the CUDA kernels compute full causal "
        "attention, which equals it while T <= window",
        op, s.win, s.T);
  }
}

// out[k] = dropout scale (0 or 1/(1-p)) of elements e0 .. e0+n-1: one Philox call per group of 4.
constexpr auto dropout_scales = cpu::attention_dropout_scales;

constexpr std::int64_t kQB = 16;  // queries per block
constexpr std::int64_t kKB = 32;  // keys per block

// Blocked like a flash-attention tile: a block of kQB queries against a block of kKB keys. K and
// V of the key block are widened to fp32 once per tile (transposed where the inner loop runs over
// keys), so every inner loop is a contiguous axpy over keys or over the head dimension, with no
// horizontal reductions and no per-element 16-bit conversion. Tiles live on the stack: about
// 50 KiB per thread in forward and 100 KiB in backward at the maximum HS = 128.
template <typename T>
void forward_impl(T* out, float* lse, const T* qkv, const AttShape& s, const DropoutParams& dp) {
  const std::int64_t B = s.B, T_ = s.T, C = s.C, NH = s.NH, HS = s.HS, C3 = s.W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool drop = dp.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - dp.p) : 1.0f;
  const std::int64_t nqb = (T_ + kQB - 1) / kQB;
#pragma omp parallel for schedule(dynamic, 1) if (cpu::parallel_worth(B * NH * T_ * T_ * HS / 2))
  for (std::int64_t task = 0; task < B * NH * nqb; ++task) {
    const std::int64_t bh = task / nqb, qb = nqb - 1 - task % nqb;  // long (late) query blocks first
    const std::int64_t b = bh / NH, h = bh % NH;
    const std::int64_t i0 = qb * kQB, qn = std::min(kQB, T_ - i0);
    const T* base = qkv + b * T_ * C3;
    alignas(64) float q[kQB][kMaxHS], acc[kQB][kMaxHS], kt[kMaxHS][kKB], vs[kKB][kMaxHS], sc[kKB];
    float m[kQB], l[kQB];
    for (std::int64_t ii = 0; ii < qn; ++ii) {
      const T* qi = base + (i0 + ii) * C3 + h * HS;
      for (std::int64_t d = 0; d < HS; ++d) {
        q[ii][d] = cpu::load(qi[d]) * scale;  // fold the scale into q once
        acc[ii][d] = 0.0f;
      }
      m[ii] = -std::numeric_limits<float>::infinity();
      l[ii] = 0.0f;
    }
    // Key blocks from the one holding the block's first visible key (i0 - win + 1) to the diagonal.
    for (std::int64_t j0 = std::max<std::int64_t>(0, i0 - s.win + 1) / kKB * kKB; j0 < i0 + qn; j0 += kKB) {
      const std::int64_t jn = std::min(kKB, i0 + qn - j0);
      for (std::int64_t jj = 0; jj < jn; ++jj) {
        const T* kj = base + (j0 + jj) * C3 + s.koff + (h / s.G) * HS;
        const T* vj = base + (j0 + jj) * C3 + s.voff + (h / s.G) * HS;
        for (std::int64_t d = 0; d < HS; ++d) {
          kt[d][jj] = cpu::load(kj[d]);
          vs[jj][d] = cpu::load(vj[d]);
        }
      }
      for (std::int64_t ii = 0; ii < qn; ++ii) {
        const std::int64_t i = i0 + ii;
        const std::int64_t jmax = std::min(jn, i - j0 + 1);                      // causal: keys j <= i
        const std::int64_t jlo = std::max<std::int64_t>(0, i - s.win + 1 - j0);  // window: keys j > i - win
        if (jmax <= jlo) continue;
        for (std::int64_t jj = jlo; jj < jmax; ++jj) sc[jj] = 0.0f;
        for (std::int64_t d = 0; d < HS; ++d) {
          const float qd = q[ii][d];
          const float* __restrict kd = kt[d];
          for (std::int64_t jj = jlo; jj < jmax; ++jj) sc[jj] += qd * kd[jj];
        }
        float cm = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : cm)
        for (std::int64_t jj = jlo; jj < jmax; ++jj) cm = std::max(cm, sc[jj]);
        const float mn = std::max(m[ii], cm);
        const float corr = std::exp(m[ii] - mn);  // exp(-inf) = 0 on the first block
        float psum = 0.0f;
#pragma omp simd reduction(+ : psum)
        for (std::int64_t jj = jlo; jj < jmax; ++jj) {
          const float p = cpu::fast_exp(sc[jj] - mn);
          sc[jj] = p;
          psum += p;
        }
        l[ii] = l[ii] * corr + psum;
        m[ii] = mn;
        if (drop) {
          float md[kKB];
          dropout_scales(dp.rng, static_cast<std::uint64_t>((bh * T_ + i) * T_ + j0 + jlo), jmax - jlo, dp.p, keep_scale, md + jlo);
          for (std::int64_t jj = jlo; jj < jmax; ++jj) sc[jj] *= md[jj];
        }
        float* __restrict a = acc[ii];
        for (std::int64_t d = 0; d < HS; ++d) a[d] *= corr;
        for (std::int64_t jj = jlo; jj < jmax; ++jj) {
          const float pj = sc[jj];
          const float* __restrict vj = vs[jj];
          for (std::int64_t d = 0; d < HS; ++d) a[d] += pj * vj[d];
        }
      }
    }
    for (std::int64_t ii = 0; ii < qn; ++ii) {
      const float inv = 1.0f / l[ii];
      T* __restrict oi = out + (b * T_ + i0 + ii) * C + h * HS;
      for (std::int64_t d = 0; d < HS; ++d) oi[d] = cpu::store<T>(acc[ii][d] * inv);
      lse[bh * T_ + i0 + ii] = m[ii] + std::log(l[ii]);
    }
  }
}

template <typename T>
void backward_impl(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* scratch, const AttShape& s, const DropoutParams& dp) {
  const std::int64_t B = s.B, T_ = s.T, C = s.C, NH = s.NH, HS = s.HS, C3 = s.W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool drop = dp.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - dp.p) : 1.0f;
  float* dq = scratch;                 // (B, T, C): dq of head h at columns h*HS.., fp32
  float* Dsum = scratch + B * T_ * C;  // (B, NH, T): D_i = dout_i · out_i = sum_j P̃_ij dP̃_ij
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(B * T_ * C))
  for (std::int64_t bti = 0; bti < B * T_; ++bti) {
    const std::int64_t b = bti / T_, i = bti % T_;
    for (std::int64_t h = 0; h < NH; ++h) {
      const T* __restrict go = dout + bti * C + h * HS;
      const T* __restrict oo = out + bti * C + h * HS;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (std::int64_t d = 0; d < HS; ++d) acc += cpu::load(go[d]) * cpu::load(oo[d]);
      Dsum[(b * NH + h) * T_ + i] = acc;
    }
  }
  // One task per (b, KV head g): it owns the columns of g's k and v in dqkv, and those of its G
  // query heads in dqkv and in the dq scratch. Key blocks outer: the K/V tile of a block is loaded
  // once and serves every query head of the group, whose dk/dv add into one stack tile in head order.
  const std::int64_t NKV = s.NKV, G = s.G;
#pragma omp parallel for schedule(dynamic, 1) if (cpu::parallel_worth(B * NH * T_ * T_ * HS))
  for (std::int64_t bg = 0; bg < B * NKV; ++bg) {
    const std::int64_t b = bg / NKV, g = bg % NKV;
    const T* base = qkv + b * T_ * C3;
    const T* gbase = dout + b * T_ * C;
    float* dqg = dq + b * T_ * C + g * G * HS;  // the group's G heads are adjacent columns
    for (std::int64_t i = 0; i < T_; ++i)
      for (std::int64_t d = 0; d < G * HS; ++d) dqg[i * C + d] = 0.0f;
    alignas(64) float kt[kMaxHS][kKB], vt[kMaxHS][kKB], ks[kKB][kMaxHS], dk[kKB][kMaxHS], dv[kKB][kMaxHS];
    alignas(64) float qs[kQB][kMaxHS], gs[kQB][kMaxHS], sp[kKB], sd[kKB];
    for (std::int64_t j0 = 0; j0 < T_; j0 += kKB) {
      const std::int64_t jn = std::min(kKB, T_ - j0);
      for (std::int64_t jj = 0; jj < jn; ++jj) {
        const T* kj = base + (j0 + jj) * C3 + s.koff + g * HS;
        const T* vj = base + (j0 + jj) * C3 + s.voff + g * HS;
        for (std::int64_t d = 0; d < HS; ++d) {
          const float kv = cpu::load(kj[d]);
          kt[d][jj] = kv;
          ks[jj][d] = kv;
          vt[d][jj] = cpu::load(vj[d]);
          dk[jj][d] = 0.0f;
          dv[jj][d] = 0.0f;
        }
      }
      for (std::int64_t h = g * G; h < (g + 1) * G; ++h) {
        const std::int64_t bh = b * NH + h;
        const float* lse_bh = lse + bh * T_;
        const float* D_bh = Dsum + bh * T_;
        float* dqb = dq + b * T_ * C + h * HS;
        // Causal: only queries i >= j0; window: only queries i < j0 + jn - 1 + win (the block's last key is visible to them).
        const std::int64_t iend = std::min(T_, j0 + jn - 1 + s.win);
        for (std::int64_t i0 = j0; i0 < iend; i0 += kQB) {
          const std::int64_t qn = std::min(kQB, T_ - i0);
          for (std::int64_t ii = 0; ii < qn; ++ii) {
            const T* qi = base + (i0 + ii) * C3 + h * HS;
            const T* gi = gbase + (i0 + ii) * C + h * HS;
            for (std::int64_t d = 0; d < HS; ++d) {
              qs[ii][d] = cpu::load(qi[d]);
              gs[ii][d] = cpu::load(gi[d]);
            }
          }
          for (std::int64_t ii = 0; ii < qn; ++ii) {
            const std::int64_t i = i0 + ii;
            const std::int64_t jmax = std::min(jn, i - j0 + 1);                      // keys j <= i
            const std::int64_t jlo = std::max<std::int64_t>(0, i - s.win + 1 - j0);  // keys j > i - win
            if (jmax <= jlo) continue;
            for (std::int64_t jj = jlo; jj < jmax; ++jj) {
              sp[jj] = 0.0f;
              sd[jj] = 0.0f;
            }
            for (std::int64_t d = 0; d < HS; ++d) {  // scores and dP̃ = dout_i · v_j for the key block
              const float qd = qs[ii][d], gd = gs[ii][d];
              const float* __restrict kd = kt[d];
              const float* __restrict vd = vt[d];
              for (std::int64_t jj = jlo; jj < jmax; ++jj) {
                sp[jj] += qd * kd[jj];
                sd[jj] += gd * vd[jj];
              }
            }
            // sp <- P̃ = P * mask (for dv);  sd <- dS * scale = P (dP̃ * mask - D_i) * scale
            const float li = lse_bh[i], Di = D_bh[i];
            if (!drop) {
              for (std::int64_t jj = jlo; jj < jmax; ++jj) {
                const float p = cpu::fast_exp(sp[jj] * scale - li);
                sp[jj] = p;
                sd[jj] = p * (sd[jj] - Di) * scale;
              }
            } else {
              float md[kKB];
              dropout_scales(dp.rng, static_cast<std::uint64_t>((bh * T_ + i) * T_ + j0 + jlo), jmax - jlo, dp.p, keep_scale, md + jlo);
              for (std::int64_t jj = jlo; jj < jmax; ++jj) {
                const float p = cpu::fast_exp(sp[jj] * scale - li);
                sp[jj] = p * md[jj];
                sd[jj] = p * (sd[jj] * md[jj] - Di) * scale;
              }
            }
            const float* __restrict gi = gs[ii];
            const float* __restrict qi = qs[ii];
            for (std::int64_t jj = jlo; jj < jmax; ++jj) {
              const float pj = sp[jj], dsj = sd[jj];
              float* __restrict dvj = dv[jj];
              float* __restrict dkj = dk[jj];
              for (std::int64_t d = 0; d < HS; ++d) {
                dvj[d] += pj * gi[d];
                dkj[d] += dsj * qi[d];
              }
            }
            float* __restrict dqi = dqb + i * C;
            for (std::int64_t jj = jlo; jj < jmax; ++jj) {
              const float dsj = sd[jj];
              const float* __restrict kj = ks[jj];
              for (std::int64_t d = 0; d < HS; ++d) dqi[d] += dsj * kj[d];
            }
          }
        }
      }
      for (std::int64_t jj = 0; jj < jn; ++jj) {
        T* __restrict dkj = dqkv + (b * T_ + j0 + jj) * C3 + s.koff + g * HS;
        T* __restrict dvj = dqkv + (b * T_ + j0 + jj) * C3 + s.voff + g * HS;
        for (std::int64_t d = 0; d < HS; ++d) {
          dkj[d] = cpu::store<T>(cpu::load(dkj[d]) + dk[jj][d]);
          dvj[d] = cpu::store<T>(cpu::load(dvj[d]) + dv[jj][d]);
        }
      }
    }
    for (std::int64_t i = 0; i < T_; ++i) {
      T* __restrict dqi = dqkv + (b * T_ + i) * C3 + g * G * HS;
      const float* __restrict acc = dqg + i * C;
      for (std::int64_t d = 0; d < G * HS; ++d) dqi[d] = cpu::store<T>(cpu::load(dqi[d]) + acc[d]);
    }
  }
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor qkv, AttentionHeads heads, const DropoutParams& dropout, std::int64_t window) {
  const char* op = "attention_forward";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"lse", lse}, {"qkv", qkv}});
  const AttShape s = check_att(op, qkv, lse, heads, window);
  if (gpu) check_no_window_on_cuda(op, s);
  require_shape(op, {"out", out}, Shape{s.B, s.T, s.C}, "(B, T, C) with C = NH*HS");
  require_same_dtype(op, {{"qkv", qkv}, {"out", out}});
  check_dropout(op, dropout, s);
  DSTRAIN_RETURN_ON_CUDA(gpu, attention_forward(out, lse, qkv, heads.q, heads.kv, dropout));
  cpu::dispatch_float(op, qkv.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (cpu::cpu_bf16_attention_enabled()) {  // vdpbf16ps tile products (ops/cpu/attention_bf16.cpp)
        cpu::avx512bf16::attention_forward(static_cast<T*>(out.data), static_cast<float*>(lse.data), static_cast<const T*>(qkv.data), s, dropout);
        return;
      }
    }
    forward_impl<T>(static_cast<T*>(out.data), static_cast<float*>(lse.data), static_cast<const T*>(qkv.data), s, dropout);
  });
}

std::size_t attention_backward_scratch_elems(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  return static_cast<std::size_t>(B * T * C + B * NH * T);
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, AttentionHeads heads, Tensor scratch,
                        const DropoutParams& dropout, std::int64_t window) {
  const char* op = "attention_backward";
  const bool gpu = cpu::on_cuda(op, {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}, {"lse", lse}, {"scratch", scratch}});
  const AttShape s = check_att(op, qkv, lse, heads, window);
  if (gpu) check_no_window_on_cuda(op, s);
  const std::int64_t NH = heads.q;
  require_shape(op, {"dqkv", dqkv}, qkv.shape, "(the shape of qkv)");
  require_shape(op, {"dout", dout}, Shape{s.B, s.T, s.C}, "(B, T, C) with C = NH*HS");
  require_shape(op, {"out", out}, Shape{s.B, s.T, s.C}, "(B, T, C) with C = NH*HS");
  require_same_dtype(op, {{"qkv", qkv}, {"dqkv", dqkv}, {"dout", dout}, {"out", out}});
  check_dropout(op, dropout, s);
  const std::size_t need = attention_backward_scratch_elems(s.B, s.T, s.C, NH);
  if (scratch.empty() || scratch.dtype != DType::fp32 || static_cast<std::size_t>(scratch.numel()) < need) {
    fail("{}: needs an fp32 scratch of at least B*T*C + B*NH*T = {} elements (B={}, T={}, C={}, NH={}), got {}", op, need, s.B, s.T, s.C, NH,
         scratch.empty() ? std::string("none") : scratch.str());
  }
  if (dqkv.data == qkv.data) fail("{}: dqkv must not alias qkv (dqkv accumulates)", op);
  DSTRAIN_RETURN_ON_CUDA(gpu, attention_backward(dqkv, dout, qkv, out, lse, NH, heads.kv, scratch, dropout));
  cpu::dispatch_float(op, qkv.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (cpu::cpu_bf16_attention_enabled()) {
        cpu::avx512bf16::attention_backward(static_cast<T*>(dqkv.data), static_cast<const T*>(dout.data), static_cast<const T*>(qkv.data),
                                            static_cast<const T*>(out.data), static_cast<const float*>(lse.data), static_cast<float*>(scratch.data), s,
                                            dropout);
        return;
      }
    }
    backward_impl<T>(static_cast<T*>(dqkv.data), static_cast<const T*>(dout.data), static_cast<const T*>(qkv.data), static_cast<const T*>(out.data),
                     static_cast<const float*>(lse.data), static_cast<float*>(scratch.data), s, dropout);
  });
}

std::string cpu_attention_path(DType storage) {
  if (storage == DType::bf16 && cpu::cpu_bf16_attention_enabled()) return "AVX512-BF16 dot products (vdpbf16ps)";
  return "fp32 tiles";
}

}  // namespace dstrain
