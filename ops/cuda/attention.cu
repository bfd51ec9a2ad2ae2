// Causal self-attention, CUDA, flash-style (only lse is saved; no T×T buffer anywhere):
// correctness first, a warp per query (forward, dq) or per key (dk, dv), keys/queries in chunks
// of 32 with one lane per key/query and the head dimension spread over the lanes (HS <= 128:
// 4 dims per lane), no tensor cores. It serves fp32 storage (which must match the CPU to fp32
// rounding) and head sizes outside {32, 64, 128}; fp16/bf16 at those sizes run on the
// tensor-core kernels of attention_tc.cu (kernels.cpp chooses). Deterministic: every output
// element is summed by one warp in a fixed order, no atomics. Semantics as ops/cpu/attention.cpp:
// the scale is folded into q in forward, online softmax over 32-key blocks (the CPU's kKB),
// fast_exp for the probabilities, dropout on the probabilities from Philox element
// ((b*NH + h)*T + i)*T + j. Grouped KV heads (NKV < NH): qkv rows are [q (NH·HS) | k (NKV·HS) |
// v (NKV·HS)] and query head h reads KV head h / G (G = NH / NKV); dk/dv take a warp per (b, KV
// head, key) that sums over the G query heads in order, so they stay deterministic without atomics.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr int kMaxHS = 128;  // kAttentionMaxHeadSize
constexpr int kDims = kMaxHS / 32;
constexpr int kWarps = 4;  // warps per block

// C = NH·HS (the output width); W = (NH + 2·NKV)·HS the qkv row; k of KV head g at koff + g·HS,
// v at voff + g·HS.
struct AttDims {
  std::int64_t B, T, C, NH, HS, NKV, G, W, koff, voff;
};

AttDims att_dims(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  const std::int64_t HS = C / NH;
  return AttDims{B, T, C, NH, HS, NKV, NH / NKV, (NH + 2 * NKV) * HS, C, C + NKV * HS};
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float drop_scale(const RngKey& key, std::uint64_t e, float p, float keep_scale) {
  return dropout_keep(key.element_bits(e), p) ? keep_scale : 0.0f;
}

template <typename S>
__device__ __forceinline__ float dot_row(const float* a, const typename S::storage* b, std::int64_t HS) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < HS; ++d) s += a[d] * S::load(b[d]);
  return s;
}
template <typename S>
__device__ __forceinline__ float dot_rows(const typename S::storage* a, const typename S::storage* b, std::int64_t HS) {
  float s = 0.0f;
  for (std::int64_t d = 0; d < HS; ++d) s += S::load(a[d]) * S::load(b[d]);
  return s;
}

template <typename S>
__global__ void __launch_bounds__(kWarps * 32) attention_forward_kernel(typename S::storage* __restrict__ out, float* __restrict__ lse,
                                                                        const typename S::storage* __restrict__ qkv, AttDims s, float p, RngKey key) {
  using P = typename S::storage;
  __shared__ float qsh[kWarps][kMaxHS];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + wib;  // (b, h, i)
  if (row >= s.B * s.NH * s.T) return;                                            // warp-uniform
  const std::int64_t i = row % s.T, bh = row / s.T, b = bh / s.NH, h = bh % s.NH;
  const std::int64_t C = s.C, C3 = s.W, HS = s.HS, T = s.T;
  const std::int64_t koff = s.koff + (h / s.G) * HS, voff = s.voff + (h / s.G) * HS;
  const P* base = qkv + b * T * C3;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const bool drop = p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - p) : 1.0f;
  float* q = qsh[wib];
  for (std::int64_t d = lane; d < HS; d += 32) q[d] = S::load(base[i * C3 + h * HS + d]) * scale;
  __syncwarp();
  float acc[kDims] = {};
  float m = -INFINITY, l = 0.0f;
  for (std::int64_t j0 = 0; j0 <= i; j0 += 32) {
    const std::int64_t j = j0 + lane;
    const bool valid = j <= i;
    const float sc = valid ? dot_row<S>(q, base + j * C3 + koff, HS) : -INFINITY;
    const float mn = fmaxf(m, warp_max(sc));
    const float corr = expf(m - mn);  // 0 on the first block (m = -inf)
    float pj = valid ? fast_exp(sc - mn) : 0.0f;
    l = l * corr + warp_sum(pj);
    m = mn;
    if (drop && valid) pj *= drop_scale(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale);
    const std::int64_t jn = (i - j0 + 1 < 32) ? i - j0 + 1 : 32;
#pragma unroll
    for (int r = 0; r < kDims; ++r) acc[r] *= corr;
    for (std::int64_t jj = 0; jj < jn; ++jj) {
      const float pjj = __shfl_sync(0xffffffffu, pj, static_cast<int>(jj));
      const P* v = base + (j0 + jj) * C3 + voff;
#pragma unroll
      for (int r = 0; r < kDims; ++r) {
        const std::int64_t d = lane + 32 * r;
        if (d < HS) acc[r] += pjj * S::load(v[d]);
      }
    }
  }
  const float inv = 1.0f / l;
  P* o = out + (b * T + i) * C + h * HS;
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const std::int64_t d = lane + 32 * r;
    if (d < HS) o[d] = S::store(acc[r] * inv);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

// Dsum[(b, h, i)] = dout_i · out_i over head h's dims (fp32, the CPU's D_i).
template <typename S>
__global__ void attention_dsum_kernel(float* __restrict__ Dsum, const typename S::storage* __restrict__ dout,
                                      const typename S::storage* __restrict__ out, AttDims s) {
  const std::int64_t n = s.B * s.NH * s.T;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < n; row += stride) {
    const std::int64_t i = row % s.T, bh = row / s.T, b = bh / s.NH, h = bh % s.NH;
    const std::int64_t off = (b * s.T + i) * s.C + h * s.HS;
    Dsum[row] = dot_rows<S>(dout + off, out + off, s.HS);
  }
}

// dq: a warp per query i; lanes = keys of a 32-key chunk. dq_i = sum_j dS_ij * scale * k_j.
template <typename S>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dq_kernel(typename S::storage* __restrict__ dqkv, const typename S::storage* __restrict__ dout,
                        const typename S::storage* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ Dsum, AttDims s,
                        float p, RngKey key) {
  using P = typename S::storage;
  __shared__ float qsh[kWarps][kMaxHS], gsh[kWarps][kMaxHS];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + wib;
  if (row >= s.B * s.NH * s.T) return;
  const std::int64_t i = row % s.T, bh = row / s.T, b = bh / s.NH, h = bh % s.NH;
  const std::int64_t C = s.C, C3 = s.W, HS = s.HS, T = s.T;
  const std::int64_t koff = s.koff + (h / s.G) * HS, voff = s.voff + (h / s.G) * HS;
  const P* base = qkv + b * T * C3;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const bool drop = p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - p) : 1.0f;
  float* q = qsh[wib];
  float* g = gsh[wib];
  for (std::int64_t d = lane; d < HS; d += 32) {
    q[d] = S::load(base[i * C3 + h * HS + d]);
    g[d] = S::load(dout[(b * T + i) * C + h * HS + d]);
  }
  __syncwarp();
  const float li = lse[row], Di = Dsum[row];
  float dq[kDims] = {};
  for (std::int64_t j0 = 0; j0 <= i; j0 += 32) {
    const std::int64_t j = j0 + lane;
    float ds = 0.0f;
    if (j <= i) {
      const float pij = fast_exp(dot_row<S>(q, base + j * C3 + koff, HS) * scale - li);
      float dp = dot_row<S>(g, base + j * C3 + voff, HS);
      if (drop) dp *= drop_scale(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale);
      ds = pij * (dp - Di) * scale;
    }
    const std::int64_t jn = (i - j0 + 1 < 32) ? i - j0 + 1 : 32;
    for (std::int64_t jj = 0; jj < jn; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, static_cast<int>(jj));
      const P* k = base + (j0 + jj) * C3 + koff;
#pragma unroll
      for (int r = 0; r < kDims; ++r) {
        const std::int64_t d = lane + 32 * r;
        if (d < HS) dq[r] += dsj * S::load(k[d]);
      }
    }
  }
  P* dqi = dqkv + (b * T + i) * C3 + h * HS;
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const std::int64_t d = lane + 32 * r;
    if (d < HS) dqi[d] = S::store(S::load(dqi[d]) + dq[r]);
  }
}

// dk, dv: a warp per (b, KV head g, key j); for each query head h of the group in order, lanes =
// queries i >= j of a 32-query chunk.  dv_j = sum_{h, i} P̃_ij dout_i,  dk_j = sum_{h, i} dS_ij * scale * q_i.
template <typename S>
__global__ void __launch_bounds__(kWarps * 32)
    attention_dkv_kernel(typename S::storage* __restrict__ dqkv, const typename S::storage* __restrict__ dout,
                         const typename S::storage* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ Dsum, AttDims s,
                         float p, RngKey key) {
  using P = typename S::storage;
  __shared__ float ksh[kWarps][kMaxHS], vsh[kWarps][kMaxHS];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + wib;
  if (row >= s.B * s.NKV * s.T) return;
  const std::int64_t j = row % s.T, bg = row / s.T, b = bg / s.NKV, g = bg % s.NKV;
  const std::int64_t C = s.C, C3 = s.W, HS = s.HS, T = s.T;
  const P* base = qkv + b * T * C3;
  const P* gbase = dout + b * T * C;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const bool drop = p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - p) : 1.0f;
  float* k = ksh[wib];
  float* v = vsh[wib];
  for (std::int64_t d = lane; d < HS; d += 32) {
    k[d] = S::load(base[j * C3 + s.koff + g * HS + d]);
    v[d] = S::load(base[j * C3 + s.voff + g * HS + d]);
  }
  __syncwarp();
  float dk[kDims] = {}, dv[kDims] = {};
  for (std::int64_t h = g * s.G; h < (g + 1) * s.G; ++h) {
    const std::int64_t bh = b * s.NH + h;
    for (std::int64_t i0 = j; i0 < T; i0 += 32) {
      const std::int64_t i = i0 + lane;
      float pt = 0.0f, ds = 0.0f;
      if (i < T) {
        const float pij = fast_exp(dot_row<S>(k, base + i * C3 + h * HS, HS) * scale - lse[bh * T + i]);
        float dp = dot_row<S>(v, gbase + i * C + h * HS, HS);
        const float md = drop ? drop_scale(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale) : 1.0f;
        pt = pij * md;
        dp *= md;
        ds = pij * (dp - Dsum[bh * T + i]) * scale;
      }
      const std::int64_t in = (T - i0 < 32) ? T - i0 : 32;
      for (std::int64_t ii = 0; ii < in; ++ii) {
        const float pti = __shfl_sync(0xffffffffu, pt, static_cast<int>(ii));
        const float dsi = __shfl_sync(0xffffffffu, ds, static_cast<int>(ii));
        const P* qi = base + (i0 + ii) * C3 + h * HS;
        const P* gi = gbase + (i0 + ii) * C + h * HS;
#pragma unroll
        for (int r = 0; r < kDims; ++r) {
          const std::int64_t d = lane + 32 * r;
          if (d < HS) {
            dv[r] += pti * S::load(gi[d]);
            dk[r] += dsi * S::load(qi[d]);
          }
        }
      }
    }
  }
  P* dkj = dqkv + (b * T + j) * C3 + s.koff + g * HS;
  P* dvj = dqkv + (b * T + j) * C3 + s.voff + g * HS;
#pragma unroll
  for (int r = 0; r < kDims; ++r) {
    const std::int64_t d = lane + 32 * r;
    if (d < HS) {
      dkj[d] = S::store(S::load(dkj[d]) + dk[r]);
      dvj[d] = S::store(S::load(dvj[d]) + dv[r]);
    }
  }
}

}  // namespace

cudaError_t launch_attention_forward(void* out, float* lse, const void* qkv, DType t, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                     std::int64_t NKV, float p, const RngKey& key, cudaStream_t st) {
  const AttDims s = att_dims(B, T, C, NH, NKV);
  const std::int64_t rows = B * NH * T;
  if (rows == 0 || C == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    attention_forward_kernel<S><<<blocks, kWarps * 32, 0, st>>>(static_cast<P*>(out), lse, static_cast<const P*>(qkv), s, p, key);
    return cudaGetLastError();
  });
}

cudaError_t launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, float* Dsum, DType t,
                                      std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV, float p, const RngKey& key,
                                      cudaStream_t st) {
  const AttDims s = att_dims(B, T, C, NH, NKV);
  const std::int64_t rows = B * NH * T, kv_rows = B * NKV * T;
  if (rows == 0 || C == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const auto kv_blocks = static_cast<unsigned>((kv_rows + kWarps - 1) / kWarps);
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    attention_dsum_kernel<S>
        <<<grid_for(static_cast<std::size_t>(rows)), kThreads, 0, st>>>(Dsum, static_cast<const P*>(dout), static_cast<const P*>(out), s);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    attention_dq_kernel<S>
        <<<blocks, kWarps * 32, 0, st>>>(static_cast<P*>(dqkv), static_cast<const P*>(dout), static_cast<const P*>(qkv), lse, Dsum, s, p, key);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    attention_dkv_kernel<S>
        <<<kv_blocks, kWarps * 32, 0, st>>>(static_cast<P*>(dqkv), static_cast<const P*>(dout), static_cast<const P*>(qkv), lse, Dsum, s, p, key);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
