// Row-wise CUDA kernels: LayerNorm forward/backward, the fused residual + LayerNorm, and the
// fused softmax cross-entropy. One block per row for the row statistics (fixed reduction tree:
// deterministic); column sums (LayerNorm's dweight/dbias, matmul's dbias) in two passes over fixed
// partitions of rows, in double (kernel_launch.h): the whole GPU works on them, and the order of
// every sum depends only on the shape (no atomics). Semantics as ops/cpu/{layernorm,softmax_cross_entropy}.cpp.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

// Two passes over the row (mean, then the variance of the deviations) as the CPU; the row is
// re-read from global memory (L1/L2 resident for GPT-2 widths).
template <typename S>
__device__ void normalize_row(const typename S::storage* x, typename S::storage* o, const typename S::storage* w, const typename S::storage* b,
                              std::int64_t C, float eps, float* mean_out, float* rstd_out) {
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += S::load(x[c]);
  const float m = block_sum(sum) / static_cast<float>(C);
  float var = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = S::load(x[c]) - m;
    var += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(var) / static_cast<float>(C) + eps);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = S::store((S::load(x[c]) - m) * r * S::load(w[c]) + S::load(b[c]));
  if (threadIdx.x == 0) {
    *mean_out = m;
    *rstd_out = r;
  }
}

template <typename S>
__global__ void layernorm_forward_kernel(typename S::storage* out, float* mean, float* rstd, const typename S::storage* inp,
                                         const typename S::storage* w, const typename S::storage* b, std::int64_t C, float eps) {
  const std::int64_t r = blockIdx.x;
  normalize_row<S>(inp + r * C, out + r * C, w, b, C, eps, mean + r, rstd + r);
}

// residual may alias a or b: each thread reads its elements before writing them, and the
// normalisation reads back only elements the same thread wrote (same c stride).
template <typename S>
__global__ void fused_residual_layernorm_kernel(typename S::storage* residual, typename S::storage* out, float* mean, float* rstd,
                                                const typename S::storage* a, const typename S::storage* b, const typename S::storage* w,
                                                const typename S::storage* bias, std::int64_t C, float eps) {
  const std::int64_t r = blockIdx.x;
  typename S::storage* res = residual + r * C;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) res[c] = S::store(S::load(a[r * C + c]) + S::load(b[r * C + c]));
  normalize_row<S>(res, out + r * C, w, bias, C, eps, mean + r, rstd + r);
}

template <typename S>
__global__ void layernorm_backward_dinp_kernel(typename S::storage* __restrict__ dinp, const typename S::storage* __restrict__ dout,
                                               const typename S::storage* __restrict__ inp, const typename S::storage* __restrict__ w,
                                               const float* __restrict__ mean, const float* __restrict__ rstd, std::int64_t C) {
  const std::int64_t r = blockIdx.x;
  const typename S::storage* g = dout + r * C;
  const typename S::storage* x = inp + r * C;
  typename S::storage* d = dinp + r * C;
  const float m = mean[r], rs = rstd[r];
  float sum_dn = 0.0f, sum_dn_n = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float dn = S::load(w[c]) * S::load(g[c]);
    sum_dn += dn;
    sum_dn_n += dn * (S::load(x[c]) - m) * rs;
  }
  const float mean_dn = block_sum(sum_dn) / static_cast<float>(C);
  const float mean_dn_n = block_sum(sum_dn_n) / static_cast<float>(C);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (S::load(x[c]) - m) * rs;
    const float dn = S::load(w[c]) * S::load(g[c]);
    d[c] = S::store(S::load(d[c]) + (dn - mean_dn - n * mean_dn_n) * rs);
  }
}

// Column sums, pass 1: block (x: 32 columns, y: kColumnLanes row lanes) sums its columns over one
// partition of kColumnRowsPerPart rows, lane y taking rows y, y + kColumnLanes, ...; the lanes are
// added in order through shared memory. kLayerNorm: also sum (x - mean)·rstd·dout (dweight), the
// product rounded in fp32 as the CPU rounds it. partials: [part][column] for dbias, then the same
// for dweight.
constexpr unsigned kColumnLanes = 8;

template <typename S, bool kLayerNorm>
__global__ void __launch_bounds__(32 * kColumnLanes)
    column_partials_kernel(double* __restrict__ partials, const typename S::storage* __restrict__ dout, const typename S::storage* __restrict__ inp,
                           const float* __restrict__ mean, const float* __restrict__ rstd, std::int64_t rows, std::int64_t C, std::int64_t parts) {
  __shared__ double sb[kColumnLanes][32], sw[kColumnLanes][32];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t part = blockIdx.y;
  const std::int64_t r0 = part * kColumnRowsPerPart;
  const std::int64_t r1 = r0 + kColumnRowsPerPart < rows ? r0 + kColumnRowsPerPart : rows;
  double ab = 0.0, aw = 0.0;
  if (c < C) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColumnLanes) {
      const float g = S::load(dout[r * C + c]);
      ab += static_cast<double>(g);
      if constexpr (kLayerNorm) aw += static_cast<double>((S::load(inp[r * C + c]) - mean[r]) * rstd[r] * g);
    }
  }
  sb[threadIdx.y][threadIdx.x] = ab;
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  double tb = 0.0, tw = 0.0;
  for (unsigned y = 0; y < kColumnLanes; ++y) {
    tb += sb[y][threadIdx.x];
    tw += sw[y][threadIdx.x];
  }
  partials[part * C + c] = tb;
  if constexpr (kLayerNorm) partials[(parts + part) * C + c] = tw;
}

// Pass 2: one thread per column adds the partitions in order and accumulates into the gradient
// (one rounding to the storage dtype).
template <typename S, bool kLayerNorm>
__global__ void column_finish_kernel(typename S::storage* __restrict__ dbias, typename S::storage* __restrict__ dweight,
                                     const double* __restrict__ partials, std::int64_t parts, std::int64_t C) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double tb = 0.0, tw = 0.0;
  for (std::int64_t p = 0; p < parts; ++p) {
    tb += partials[p * C + c];
    if constexpr (kLayerNorm) tw += partials[(parts + p) * C + c];
  }
  dbias[c] = S::store(static_cast<float>(S::load(dbias[c]) + tb));
  if constexpr (kLayerNorm) dweight[c] = S::store(static_cast<float>(S::load(dweight[c]) + tw));
}

template <typename S, bool kLayerNorm>
cudaError_t launch_column_sums(typename S::storage* dbias, typename S::storage* dweight, const typename S::storage* dout,
                               const typename S::storage* inp, const float* mean, const float* rstd, std::int64_t rows, std::int64_t C,
                               double* partials, cudaStream_t s) {
  const std::int64_t parts = (rows + kColumnRowsPerPart - 1) / kColumnRowsPerPart;
  if (parts > 65535) return cudaErrorInvalidValue;  // grid y; 16.7M rows
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(parts));
  column_partials_kernel<S, kLayerNorm><<<grid, dim3(32, kColumnLanes), 0, s>>>(partials, dout, inp, mean, rstd, rows, C, parts);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  constexpr unsigned kChan = 128;
  column_finish_kernel<S, kLayerNorm><<<static_cast<unsigned>((C + kChan - 1) / kChan), kChan, 0, s>>>(dbias, dweight, partials, parts, C);
  return cudaGetLastError();
}

// log sum_v<V exp(x[v]) of one row, by the whole block: each thread's online (max, sum) over its
// columns in one read of the row, then a fixed-tree block reduction (deterministic). Every thread
// returns the row's value (the reductions synchronise the block).
template <typename S>
__device__ float row_lse(const typename S::storage* x, std::int64_t V) {
  float m = -INFINITY, s = 0.0f;
  for (std::int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = S::load(x[v]);
    if (xv > m) {
      s = (s > 0.0f ? s * fast_exp(m - xv) : 0.0f) + 1.0f;
      m = xv;
    } else {
      s += fast_exp(xv - m);
    }
  }
  const float mall = block_max(m);
  const double total = block_sum(static_cast<double>(s > 0.0f ? s * fast_exp(m - mall) : 0.0f));
  return mall + static_cast<float>(log(total));
}

// dlogits of one row from its lse: (softmax - onehot(t))·dloss over the real vocabulary, 0 in the
// padding columns and for an ignored row (t < 0). Each element is read and written by one thread,
// so d may be x (in place).
template <typename S>
__device__ void write_row_grad(typename S::storage* d, const typename S::storage* x, float l, std::int32_t t, std::int64_t V, std::int64_t Vp,
                               float dloss) {
  for (std::int64_t v = threadIdx.x; v < Vp; v += blockDim.x) {
    float g = 0.0f;
    if (t >= 0 && v < V) g = (fast_exp(S::load(x[v]) - l) - (v == t ? 1.0f : 0.0f)) * dloss;
    d[v] = S::store(g);
  }
}

template <typename S>
__global__ void softmax_ce_forward_kernel(float* __restrict__ losses, float* __restrict__ lse, const typename S::storage* __restrict__ logits,
                                          const std::int32_t* __restrict__ targets, std::int64_t V, std::int64_t Vp) {
  const std::int64_t i = blockIdx.x;
  const typename S::storage* x = logits + i * Vp;
  const float l = row_lse<S>(x, V);
  if (threadIdx.x == 0) {
    lse[i] = l;
    const std::int32_t t = targets[i];
    losses[i] = t < 0 ? 0.0f : l - S::load(x[t]);
  }
}

// Forward and backward of one row in one block: the forward's lse (one read of the row), then the
// gradient written over the logits in a second sweep that finds the row in cache. The target's
// logit is read before any thread writes (row_lse's reductions synchronise the block in between).
template <typename S>
__global__ void softmax_ce_fused_kernel(float* __restrict__ losses, float* __restrict__ lse, typename S::storage* logits,
                                        const std::int32_t* __restrict__ targets, std::int64_t V, std::int64_t Vp, float dloss) {
  const std::int64_t i = blockIdx.x;
  typename S::storage* x = logits + i * Vp;
  const std::int32_t t = targets[i];
  const float xt = t >= 0 ? S::load(x[t]) : 0.0f;
  const float l = row_lse<S>(x, V);
  if (threadIdx.x == 0) {
    lse[i] = l;
    losses[i] = t < 0 ? 0.0f : l - xt;
  }
  write_row_grad<S>(x, x, l, t, V, Vp, dloss);
}

// In place allowed (dlogits == logits).
template <typename S>
__global__ void softmax_ce_backward_kernel(typename S::storage* dlogits, const typename S::storage* logits, const float* __restrict__ lse,
                                           const std::int32_t* __restrict__ targets, std::int64_t V, std::int64_t Vp, float dloss) {
  const std::int64_t i = blockIdx.x;
  write_row_grad<S>(dlogits + i * Vp, logits + i * Vp, lse[i], targets[i], V, Vp, dloss);
}

template <typename S>
__global__ void add_bias_kernel(typename S::storage* __restrict__ out, const typename S::storage* __restrict__ bias, std::int64_t n,
                                std::int64_t OC) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = S::store(S::load(out[i]) + S::load(bias[i % OC]));
  }
}

// Threads per row-block: a multiple of 32, no more than the row needs.
unsigned row_threads(std::int64_t C, unsigned max_threads) {
  unsigned t = 32;
  while (t < max_threads && static_cast<std::int64_t>(t) < C) t *= 2;
  return t;
}

}  // namespace

cudaError_t launch_matmul_dbias(void* dbias, const void* dout, DType t, std::int64_t rows, std::int64_t OC, double* partials, cudaStream_t s) {
  if (OC == 0 || rows == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    return launch_column_sums<S, false>(static_cast<P*>(dbias), nullptr, static_cast<const P*>(dout), nullptr, nullptr, nullptr, rows, OC, partials,
                                        s);
  });
}

cudaError_t launch_add_bias(void* out, const void* bias, DType t, std::int64_t rows, std::int64_t OC, cudaStream_t s) {
  if (rows * OC == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    add_bias_kernel<S>
        <<<grid_for(static_cast<std::size_t>(rows * OC)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(bias), rows * OC, OC);
    return cudaGetLastError();
  });
}

cudaError_t launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, DType t, std::int64_t rows,
                                     std::int64_t C, float eps, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    layernorm_forward_kernel<S><<<static_cast<unsigned>(rows), row_threads(C, 512), 0, s>>>(static_cast<P*>(out), mean, rstd,
                                                                                            static_cast<const P*>(inp), static_cast<const P*>(w),
                                                                                            static_cast<const P*>(b), C, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_fused_residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w,
                                                    const void* bias, DType t, std::int64_t rows, std::int64_t C, float eps, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    fused_residual_layernorm_kernel<S><<<static_cast<unsigned>(rows), row_threads(C, 512), 0, s>>>(static_cast<P*>(residual), static_cast<P*>(out),
                                                                                                   mean, rstd, static_cast<const P*>(a),
                                                                                                   static_cast<const P*>(b), static_cast<const P*>(w),
                                                                                                   static_cast<const P*>(bias), C, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* w, const float* mean,
                                      const float* rstd, DType t, std::int64_t rows, std::int64_t C, double* partials, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    layernorm_backward_dinp_kernel<S><<<static_cast<unsigned>(rows), row_threads(C, 512), 0, s>>>(static_cast<P*>(dinp), static_cast<const P*>(dout),
                                                                                                  static_cast<const P*>(inp),
                                                                                                  static_cast<const P*>(w), mean, rstd, C);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return launch_column_sums<S, true>(static_cast<P*>(dbias), static_cast<P*>(dweight), static_cast<const P*>(dout), static_cast<const P*>(inp),
                                       mean, rstd, rows, C, partials, s);
  });
}

cudaError_t launch_softmax_ce_forward(float* losses, float* lse, const void* logits, const std::int32_t* targets, DType t, std::int64_t BT,
                                      std::int64_t V, std::int64_t Vp, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    softmax_ce_forward_kernel<S>
        <<<static_cast<unsigned>(BT), row_threads(V, 1024), 0, s>>>(losses, lse, static_cast<const P*>(logits), targets, V, Vp);
    return cudaGetLastError();
  });
}

cudaError_t launch_softmax_ce_fused(float* losses, float* lse, void* logits, const std::int32_t* targets, DType t, std::int64_t BT, std::int64_t V,
                                    std::int64_t Vp, float dloss, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    softmax_ce_fused_kernel<S>
        <<<static_cast<unsigned>(BT), row_threads(V, 1024), 0, s>>>(losses, lse, static_cast<P*>(logits), targets, V, Vp, dloss);
    return cudaGetLastError();
  });
}

cudaError_t launch_softmax_ce_backward(void* dlogits, const void* logits, const float* lse, const std::int32_t* targets, DType t, std::int64_t BT,
                                       std::int64_t V, std::int64_t Vp, float dloss, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    softmax_ce_backward_kernel<S><<<static_cast<unsigned>(BT), row_threads(Vp, 1024), 0, s>>>(static_cast<P*>(dlogits), static_cast<const P*>(logits),
                                                                                              lse, targets, V, Vp, dloss);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
