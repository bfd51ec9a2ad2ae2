// RMSNorm CUDA kernels: forward, fused residual + RMSNorm, backward, and the two phases of a row
// cut across tensor-parallel ranks (rmsnorm_shard_*). One block per row for the row statistic
// (fixed reduction tree: deterministic); dweight as LayerNorm's column sums in rows.cu: fixed
// partitions of rows summed in double, then the partitions in order (no atomics).
// Semantics as ops/cpu/rmsnorm.cpp.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

template <typename S>
__device__ void rms_normalize_row(const typename S::storage* x, typename S::storage* o, const typename S::storage* w, std::int64_t C, float eps,
                                  float* rstd_out) {
  float ss = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = S::load(x[c]);
    ss += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(C) + eps);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = S::store(S::load(x[c]) * r * S::load(w[c]));
  if (threadIdx.x == 0) *rstd_out = r;
}

template <typename S>
__global__ void rmsnorm_forward_kernel(typename S::storage* out, float* rstd, const typename S::storage* inp, const typename S::storage* w,
                                       std::int64_t C, float eps) {
  const std::int64_t r = blockIdx.x;
  rms_normalize_row<S>(inp + r * C, out + r * C, w, C, eps, rstd + r);
}

// residual may alias a or b: each thread reads its elements before writing them, and the
// normalisation reads back only elements the same thread wrote (same c stride).
template <typename S>
__global__ void fused_residual_rmsnorm_kernel(typename S::storage* residual, typename S::storage* out, float* rstd, const typename S::storage* a,
                                              const typename S::storage* b, const typename S::storage* w, std::int64_t C, float eps) {
  const std::int64_t r = blockIdx.x;
  typename S::storage* res = residual + r * C;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) res[c] = S::store(S::load(a[r * C + c]) + S::load(b[r * C + c]));
  rms_normalize_row<S>(res, out + r * C, w, C, eps, rstd + r);
}

// Σ_c dn·n of one row (dn = w·dout, n = x·rstd), the block's sum.
template <typename S>
__device__ float rms_row_dn_n(const typename S::storage* g, const typename S::storage* x, const typename S::storage* w, float rs, std::int64_t C) {
  float sum_dn_n = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) sum_dn_n += S::load(w[c]) * S::load(g[c]) * S::load(x[c]) * rs;
  return block_sum(sum_dn_n);
}

// dinp += rstd·(dn - n·mean_dn_n) on one row.
template <typename S>
__device__ void rms_row_dinp(typename S::storage* d, const typename S::storage* g, const typename S::storage* x, const typename S::storage* w,
                             float rs, float mean_dn_n, std::int64_t C) {
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = S::load(x[c]) * rs;
    const float dn = S::load(w[c]) * S::load(g[c]);
    d[c] = S::store(S::load(d[c]) + (dn - n * mean_dn_n) * rs);
  }
}

template <typename S>
__global__ void rmsnorm_backward_dinp_kernel(typename S::storage* __restrict__ dinp, const typename S::storage* __restrict__ dout,
                                             const typename S::storage* __restrict__ inp, const typename S::storage* __restrict__ w,
                                             const float* __restrict__ rstd, std::int64_t C) {
  const std::int64_t r = blockIdx.x;
  const float rs = rstd[r];
  const float mean_dn_n = rms_row_dn_n<S>(dout + r * C, inp + r * C, w, rs, C) / static_cast<float>(C);
  rms_row_dinp<S>(dinp + r * C, dout + r * C, inp + r * C, w, rs, mean_dn_n, C);
}

// ---- A row cut across ranks: each phase one block per row ----
template <typename S>
__global__ void rmsnorm_shard_sum_squares_kernel(float* __restrict__ sums, const typename S::storage* __restrict__ inp, std::int64_t C) {
  const std::int64_t r = blockIdx.x;
  const typename S::storage* x = inp + r * C;
  float ss = 0.0f;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = S::load(x[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  if (threadIdx.x == 0) sums[r] = ss;
}

template <typename S>
__global__ void rmsnorm_shard_forward_kernel(typename S::storage* __restrict__ out, float* __restrict__ rstd,
                                             const typename S::storage* __restrict__ inp, const typename S::storage* __restrict__ w,
                                             const float* __restrict__ sums, std::int64_t C, std::int64_t n, float eps) {
  const std::int64_t r = blockIdx.x;
  const float rs = 1.0f / sqrtf(sums[r] / static_cast<float>(n) + eps);
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) out[r * C + c] = S::store(S::load(inp[r * C + c]) * rs * S::load(w[c]));
  if (threadIdx.x == 0) rstd[r] = rs;
}

template <typename S>
__global__ void rmsnorm_shard_dot_kernel(float* __restrict__ dots, const typename S::storage* __restrict__ dout,
                                         const typename S::storage* __restrict__ inp, const typename S::storage* __restrict__ w,
                                         const float* __restrict__ rstd, std::int64_t C) {
  const std::int64_t r = blockIdx.x;
  const float dot = rms_row_dn_n<S>(dout + r * C, inp + r * C, w, rstd[r], C);
  if (threadIdx.x == 0) dots[r] = dot;
}

template <typename S>
__global__ void rmsnorm_shard_dinp_kernel(typename S::storage* __restrict__ dinp, const typename S::storage* __restrict__ dout,
                                          const typename S::storage* __restrict__ inp, const typename S::storage* __restrict__ w,
                                          const float* __restrict__ rstd, const float* __restrict__ dots, std::int64_t C, std::int64_t n) {
  const std::int64_t r = blockIdx.x;
  rms_row_dinp<S>(dinp + r * C, dout + r * C, inp + r * C, w, rstd[r], dots[r] / static_cast<float>(n), C);
}

// dweight pass 1: block (x: 32 columns, y: kLanes row lanes) sums x·rstd·dout over one partition
// of kColumnRowsPerPart rows; the lanes are added in order through shared memory.
constexpr unsigned kLanes = 8;

template <typename S>
__global__ void __launch_bounds__(32 * kLanes)
    rmsnorm_dweight_partials_kernel(double* __restrict__ partials, const typename S::storage* __restrict__ dout,
                                    const typename S::storage* __restrict__ inp, const float* __restrict__ rstd, std::int64_t rows, std::int64_t C) {
  __shared__ double sw[kLanes][32];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t part = blockIdx.y;
  const std::int64_t r0 = part * kColumnRowsPerPart;
  const std::int64_t r1 = r0 + kColumnRowsPerPart < rows ? r0 + kColumnRowsPerPart : rows;
  double aw = 0.0;
  if (c < C) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kLanes)
      aw += static_cast<double>(S::load(inp[r * C + c]) * rstd[r] * S::load(dout[r * C + c]));
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  double tw = 0.0;
  for (unsigned y = 0; y < kLanes; ++y) tw += sw[y][threadIdx.x];
  partials[part * C + c] = tw;
}

// Pass 2: one thread per column adds the partitions in order; one rounding into dweight.
template <typename S>
__global__ void rmsnorm_dweight_finish_kernel(typename S::storage* __restrict__ dweight, const double* __restrict__ partials, std::int64_t parts,
                                              std::int64_t C) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double tw = 0.0;
  for (std::int64_t p = 0; p < parts; ++p) tw += partials[p * C + c];
  dweight[c] = S::store(static_cast<float>(S::load(dweight[c]) + tw));
}

// Threads per row-block: a multiple of 32, no more than the row needs.
unsigned rms_row_threads(std::int64_t C) {
  unsigned t = 32;
  while (t < 512 && static_cast<std::int64_t>(t) < C) t *= 2;
  return t;
}

}  // namespace

cudaError_t launch_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, DType t, std::int64_t rows, std::int64_t C, float eps,
                                   cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_forward_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(static_cast<P*>(out), rstd, static_cast<const P*>(inp),
                                                                                         static_cast<const P*>(w), C, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_fused_residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* w, DType t,
                                                  std::int64_t rows, std::int64_t C, float eps, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    fused_residual_rmsnorm_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(static_cast<P*>(residual), static_cast<P*>(out), rstd,
                                                                                                static_cast<const P*>(a), static_cast<const P*>(b),
                                                                                                static_cast<const P*>(w), C, eps);
    return cudaGetLastError();
  });
}

namespace {

// dweight += Σ over rows of x·rstd·dout: the partitions' sums, then the partitions in order.
template <typename S>
cudaError_t launch_rms_dweight(typename S::storage* dweight, const typename S::storage* dout, const typename S::storage* inp, const float* rstd,
                               std::int64_t rows, std::int64_t C, double* partials, cudaStream_t s) {
  const std::int64_t parts = (rows + kColumnRowsPerPart - 1) / kColumnRowsPerPart;
  if (parts > 65535) return cudaErrorInvalidValue;  // grid y; 16.7M rows
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(parts));
  rmsnorm_dweight_partials_kernel<S><<<grid, dim3(32, kLanes), 0, s>>>(partials, dout, inp, rstd, rows, C);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  constexpr unsigned kChan = 128;
  rmsnorm_dweight_finish_kernel<S><<<static_cast<unsigned>((C + kChan - 1) / kChan), kChan, 0, s>>>(dweight, partials, parts, C);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* w, const float* rstd, DType t,
                                    std::int64_t rows, std::int64_t C, double* partials, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_backward_dinp_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(static_cast<P*>(dinp), static_cast<const P*>(dout),
                                                                                               static_cast<const P*>(inp), static_cast<const P*>(w),
                                                                                               rstd, C);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return launch_rms_dweight<S>(static_cast<P*>(dweight), static_cast<const P*>(dout), static_cast<const P*>(inp), rstd, rows, C, partials, s);
  });
}

cudaError_t launch_rmsnorm_shard_sum_squares(float* sums, const void* inp, DType t, std::int64_t rows, std::int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_shard_sum_squares_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(sums, static_cast<const P*>(inp), C);
    return cudaGetLastError();
  });
}

cudaError_t launch_rmsnorm_shard_forward(void* out, float* rstd, const void* inp, const void* w, const float* sums, DType t, std::int64_t rows,
                                         std::int64_t C, std::int64_t n, float eps, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_shard_forward_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(static_cast<P*>(out), rstd, static_cast<const P*>(inp),
                                                                                               static_cast<const P*>(w), sums, C, n, eps);
    return cudaGetLastError();
  });
}

cudaError_t launch_rmsnorm_shard_backward_dot(float* dots, const void* dout, const void* inp, const void* w, const float* rstd, DType t,
                                              std::int64_t rows, std::int64_t C, cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_shard_dot_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(dots, static_cast<const P*>(dout),
                                                                                           static_cast<const P*>(inp), static_cast<const P*>(w), rstd,
                                                                                           C);
    return cudaGetLastError();
  });
}

cudaError_t launch_rmsnorm_shard_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* w, const float* rstd,
                                          const float* dots, DType t, std::int64_t rows, std::int64_t C, std::int64_t n, double* partials,
                                          cudaStream_t s) {
  if (rows == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rmsnorm_shard_dinp_kernel<S><<<static_cast<unsigned>(rows), rms_row_threads(C), 0, s>>>(static_cast<P*>(dinp), static_cast<const P*>(dout),
                                                                                            static_cast<const P*>(inp), static_cast<const P*>(w),
                                                                                            rstd, dots, C, n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return launch_rms_dweight<S>(static_cast<P*>(dweight), static_cast<const P*>(dout), static_cast<const P*>(inp), rstd, rows, C, partials, s);
  });
}

}  // namespace dstrain::cuda_detail
