// SwiGLU CUDA kernels: out = silu(gate)·up and its backward, elementwise in grid-stride loops.
// Semantics as ops/cpu/swiglu.cpp (sigmoid through the same fast_exp / fast_tanh); fp32 math, one RNE store.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

template <typename S>
__global__ void swiglu_forward_kernel(typename S::storage* out, const typename S::storage* gate, const typename S::storage* up, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = S::load(gate[i]);                                             // out may alias gate or up: read, then write the same element
    out[i] = S::store(x * S::load(up[i]) * (0.5f + 0.5f * fast_tanh(0.5f * x)));  // the CPU's formula
  }
}

template <typename S>
__global__ void swiglu_backward_kernel(typename S::storage* __restrict__ dgate, typename S::storage* __restrict__ dup,
                                       const typename S::storage* __restrict__ dout, const typename S::storage* __restrict__ gate,
                                       const typename S::storage* __restrict__ up, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = S::load(gate[i]), dy = S::load(dout[i]);
    const float s = sigmoid(x);
    dgate[i] = S::store(S::load(dgate[i]) + dy * S::load(up[i]) * s * (1.0f + x * (1.0f - s)));
    dup[i] = S::store(S::load(dup[i]) + dy * x * s);
  }
}

}  // namespace

cudaError_t launch_swiglu_forward(void* out, const void* gate, const void* up, DType t, std::int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    swiglu_forward_kernel<S>
        <<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(gate), static_cast<const P*>(up), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, std::int64_t n,
                                   cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    swiglu_backward_kernel<S><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(dgate), static_cast<P*>(dup),
                                                                                         static_cast<const P*>(dout), static_cast<const P*>(gate),
                                                                                         static_cast<const P*>(up), n);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
