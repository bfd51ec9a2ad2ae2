// Per-head RMSNorm (Qwen3's q/k norm, ops/kernels/head_rmsnorm.h) on CUDA: a warp per (token,
// head) row for the statistic and for dx (fixed shuffle tree: deterministic); dweight one thread
// per channel summing every row in order in double, as the CPU does (no atomics). dweight runs
// before dx because dx overwrites dout in place. Semantics as ops/cpu/head_rmsnorm.cpp.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr int kWarps = 4;  // warps per block

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Element offset of row r (token r / nheads, head head0 + r % nheads) in the (B, T, H, D) tensor.
__device__ __forceinline__ std::int64_t row_offset(std::int64_t r, std::int64_t nheads, std::int64_t H, std::int64_t head0, std::int64_t D) {
  return ((r / nheads) * H + head0 + r % nheads) * D;
}

template <typename S>
__global__ void __launch_bounds__(kWarps * 32)
    head_rmsnorm_forward_kernel(typename S::storage* x, float* rstd, const typename S::storage* w, std::int64_t rows, std::int64_t nheads,
                                std::int64_t H, std::int64_t head0, std::int64_t D, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= rows) return;  // warp-uniform
  typename S::storage* xr = x + row_offset(r, nheads, H, head0, D);
  float ss = 0.0f;
  for (std::int64_t d = lane; d < D; d += 32) {
    const float v = S::load(xr[d]);
    ss += v * v;
  }
  const float rs = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
  for (std::int64_t d = lane; d < D; d += 32) xr[d] = S::store(S::load(xr[d]) * rs * S::load(w[d]));
  if (lane == 0) rstd[r] = rs;
}

template <typename S>
__global__ void head_rmsnorm_dweight_kernel(typename S::storage* dw, const typename S::storage* g, const typename S::storage* x, const float* rstd,
                                            std::int64_t rows, std::int64_t nheads, std::int64_t H, std::int64_t head0, std::int64_t D) {
  const std::int64_t d = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;
  double acc = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t o = row_offset(r, nheads, H, head0, D) + d;
    acc += static_cast<double>(S::load(x[o]) * rstd[r] * S::load(g[o]));
  }
  dw[d] = S::store(static_cast<float>(S::load(dw[d]) + acc));
}

template <typename S>
__global__ void __launch_bounds__(kWarps * 32)
    head_rmsnorm_dx_kernel(typename S::storage* g, const typename S::storage* x, const typename S::storage* w, const float* rstd, std::int64_t rows,
                           std::int64_t nheads, std::int64_t H, std::int64_t head0, std::int64_t D) {
  const int lane = threadIdx.x & 31;
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const std::int64_t o = row_offset(r, nheads, H, head0, D);
  typename S::storage* gr = g + o;
  const typename S::storage* xr = x + o;
  const float rs = rstd[r];
  float sum_dn_n = 0.0f;
  for (std::int64_t d = lane; d < D; d += 32) sum_dn_n += S::load(w[d]) * S::load(gr[d]) * S::load(xr[d]) * rs;
  const float mean_dn_n = warp_sum(sum_dn_n) / static_cast<float>(D);
  for (std::int64_t d = lane; d < D; d += 32) {
    const float n = S::load(xr[d]) * rs;
    const float dn = S::load(w[d]) * S::load(gr[d]);
    gr[d] = S::store((dn - n * mean_dn_n) * rs);
  }
}

}  // namespace

cudaError_t launch_head_rmsnorm_forward(void* x, float* rstd, const void* w, DType t, std::int64_t BT, std::int64_t H, std::int64_t D,
                                        std::int64_t head0, std::int64_t nheads, float eps, cudaStream_t st) {
  const std::int64_t rows = BT * nheads;
  if (rows == 0 || D == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    head_rmsnorm_forward_kernel<S>
        <<<blocks, kWarps * 32, 0, st>>>(static_cast<P*>(x), rstd, static_cast<const P*>(w), rows, nheads, H, head0, D, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_head_rmsnorm_backward(void* dx, void* dweight, const void* inp, const void* w, const float* rstd, DType t, std::int64_t BT,
                                         std::int64_t H, std::int64_t D, std::int64_t head0, std::int64_t nheads, cudaStream_t st) {
  const std::int64_t rows = BT * nheads;
  if (rows == 0 || D == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    head_rmsnorm_dweight_kernel<S><<<grid_for(static_cast<std::size_t>(D)), kThreads, 0, st>>>(static_cast<P*>(dweight), static_cast<const P*>(dx),
                                                                                               static_cast<const P*>(inp), rstd, rows, nheads, H,
                                                                                               head0, D);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    head_rmsnorm_dx_kernel<S>
        <<<blocks, kWarps * 32, 0, st>>>(static_cast<P*>(dx), static_cast<const P*>(inp), static_cast<const P*>(w), rstd, rows, nheads, H, head0, D);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
