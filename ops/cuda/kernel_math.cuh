// Device-side helpers shared by the CUDA kernels (.cu files only): storage types with fp32
// load and round-to-nearest-even store (the same bits as the CPU's cpu::store / ops/dtype.h for
// every non-NaN value), the CPU's branch-free exp/tanh (so GPU and CPU see the same
// approximation, not libdevice's), block reductions and launch sizes.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "ops/dtype.h"

namespace dstrain::cuda_detail {

struct F32 {
  using storage = float;
  __device__ static float load(float x) { return x; }
  __device__ static float store(float f) { return f; }
};
struct F16 {
  using storage = std::uint16_t;
  __device__ static float load(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }
  __device__ static std::uint16_t store(float f) { return __half_as_ushort(__float2half_rn(f)); }
};
struct BF16 {
  using storage = std::uint16_t;
  __device__ static float load(std::uint16_t b) { return __uint_as_float(static_cast<std::uint32_t>(b) << 16); }
  __device__ static std::uint16_t store(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};

// Calls f(S{}) with S the storage struct for a floating dtype; cudaErrorInvalidValue otherwise.
template <typename F>
cudaError_t dispatch_storage(DType t, F&& f) {
  switch (t) {
    case DType::fp32:
      return f(F32{});
    case DType::fp16:
      return f(F16{});
    case DType::bf16:
      return f(BF16{});
    default:
      return cudaErrorInvalidValue;
  }
}

// ops/cpu/cpu_common.h's fast_exp (Cephes expf), term for term.
__device__ __forceinline__ float fast_exp(float x) {
  x = fminf(fmaxf(x, -87.3f), 88.37f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return er * __uint_as_float(bits);
}
__device__ __forceinline__ float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

// Sum / max over a block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. The combination order is fixed by the thread layout: deterministic.
template <typename V>
__device__ V block_sum(V v) {
  __shared__ V partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  V total = partial[0];
  for (int w = 1; w < nwarps; ++w) total += partial[w];
  return total;
}
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float m = partial[0];
  for (int w = 1; w < nwarps; ++w) m = fmaxf(m, partial[w]);
  return m;
}

inline constexpr unsigned kThreads = 256;
// Blocks for a grid-stride loop over n items (the loop covers what the grid does not).
inline unsigned grid_for(std::size_t n, unsigned threads = kThreads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace dstrain::cuda_detail
