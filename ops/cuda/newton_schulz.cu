// Newton–Schulz (ops/kernels/newton_schulz.h), CUDA: the element-wise parts of the iteration. The
// GEMMs are cuBLASLt calls in kernels.cpp; the Frobenius norm is one block's fixed-order sum in
// double, so the result does not depend on scheduling.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

// X (n x m, row-major) from G (rows x cols): a copy, or G's transpose when G is tall.
__global__ void ns_load_kernel(const float* __restrict__ g, float* __restrict__ x, std::int64_t n, std::int64_t m, bool tall) {
  const std::int64_t total = n * m, stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const std::int64_t i = k / m, j = k % m;
    x[k] = tall ? g[j * n + i] : g[k];
  }
}

__global__ void ns_store_kernel(float* __restrict__ g, const float* __restrict__ x, std::int64_t n, std::int64_t m, bool tall) {
  const std::int64_t total = n * m, stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const std::int64_t i = k / m, j = k % m;
    if (tall) {
      g[j * n + i] = x[k];
    } else {
      g[k] = x[k];
    }
  }
}

// One block: X ← X / (‖X‖_F + eps), the sum of squares in double.
__global__ void ns_normalise_kernel(float* __restrict__ x, std::int64_t total, float eps) {
  double sq = 0.0;
  for (std::int64_t k = threadIdx.x; k < total; k += blockDim.x) sq += static_cast<double>(x[k]) * static_cast<double>(x[k]);
  sq = block_sum(sq);
  const float denom = static_cast<float>(sqrt(sq)) + eps;
  for (std::int64_t k = threadIdx.x; k < total; k += blockDim.x) x[k] = x[k] / denom;
}

__global__ void ns_scale_kernel(float* dst, const float* src, std::int64_t total, float f) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) dst[k] = f * src[k];
}

}  // namespace

cudaError_t launch_ns_load(const float* g, float* x, std::int64_t n, std::int64_t m, bool tall, cudaStream_t s) {
  ns_load_kernel<<<grid_for(static_cast<std::size_t>(n * m)), kThreads, 0, s>>>(g, x, n, m, tall);
  return cudaGetLastError();
}

cudaError_t launch_ns_store(float* g, const float* x, std::int64_t n, std::int64_t m, bool tall, cudaStream_t s) {
  ns_store_kernel<<<grid_for(static_cast<std::size_t>(n * m)), kThreads, 0, s>>>(g, x, n, m, tall);
  return cudaGetLastError();
}

cudaError_t launch_ns_normalise(float* x, std::int64_t total, float eps, cudaStream_t s) {
  ns_normalise_kernel<<<1, 1024, 0, s>>>(x, total, eps);
  return cudaGetLastError();
}

cudaError_t launch_ns_scale(float* dst, const float* src, std::int64_t total, float f, cudaStream_t s) {
  ns_scale_kernel<<<grid_for(static_cast<std::size_t>(total)), kThreads, 0, s>>>(dst, src, total, f);
  return cudaGetLastError();
}

}  // namespace dstrain::cuda_detail
