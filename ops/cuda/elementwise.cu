// Elementwise CUDA kernels: GELU, residual add, dropout (the CPU's Philox stream: identical masks), encoder
// forward/backward. Semantics as ops/cpu/{gelu,dropout,encoder}.cpp; fp32 math, one RNE store.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

template <typename S>
__global__ void gelu_forward_kernel(typename S::storage* out, const typename S::storage* inp, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = S::load(inp[i]);  // out may alias inp: read, then write the same element
    const float cube = kGeluCubic * v * v * v;
    out[i] = S::store(0.5f * v * (1.0f + fast_tanh(kGeluScale * (v + cube))));
  }
}

template <typename S>
__global__ void gelu_backward_kernel(typename S::storage* __restrict__ dinp, const typename S::storage* __restrict__ inp,
                                     const typename S::storage* __restrict__ dout, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = S::load(inp[i]);
    const float cube = kGeluCubic * v * v * v;
    const float e = fast_exp(2.0f * kGeluScale * (v + cube));  // as the CPU: tanh and sech^2 from one exp
    const float inv = 1.0f / (e + 1.0f);
    const float th = 1.0f - 2.0f * inv;
    const float sech2 = 4.0f * (e * inv) * inv;
    const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dinp[i] = S::store(S::load(dinp[i]) + local * S::load(dout[i]));
  }
}

template <typename S>
__global__ void residual_add_kernel(typename S::storage* out, const typename S::storage* a, const typename S::storage* b, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = S::store(S::load(a[i]) + S::load(b[i]));  // out may alias a or b: both read first
  }
}

// One thread per Philox group of 4 elements: the same (key, counter) -> bits as the CPU.
template <typename S, bool kAccumulate>
__global__ void dropout_kernel(typename S::storage* out, const typename S::storage* inp, std::int64_t n, float p, RngKey key) {
  const float scale = 1.0f / (1.0f - p);
  const std::int64_t groups = (n + 3) / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const PhiloxCounter r = key.group_bits(static_cast<std::uint64_t>(g));
    const std::int64_t end = (g * 4 + 4 < n) ? g * 4 + 4 : n;
    for (std::int64_t i = g * 4; i < end; ++i) {
      const float m = dropout_keep(r.v[i - g * 4], p) ? scale : 0.0f;
      const float x = __fmul_rn(S::load(inp[i]), m);  // no FMA contraction with the += below: rounds as the CPU
      if constexpr (kAccumulate) {
        out[i] = S::store(S::load(out[i]) + x);
      } else {
        out[i] = S::store(x);
      }
    }
  }
}

// p == 0 backward: dinp += dout.
template <typename S>
__global__ void add_kernel(typename S::storage* __restrict__ out, const typename S::storage* __restrict__ inp, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = S::store(S::load(out[i]) + S::load(inp[i]));
  }
}

template <typename S>
__global__ void encoder_forward_kernel(typename S::storage* __restrict__ out, const std::int32_t* __restrict__ tokens,
                                       const typename S::storage* __restrict__ wte, const typename S::storage* __restrict__ wpe, std::int64_t BT,
                                       std::int64_t T, std::int64_t C, std::int64_t first, std::int64_t V) {
  const std::int64_t n = BT * C;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t bt = i / C, c = i % C;
    const std::int64_t row = static_cast<std::int64_t>(tokens[bt]) - first;
    const float e = row >= 0 && row < V ? S::load(wte[row * C + c]) : 0.0f;  // another rank's row: zeros
    out[i] = S::store(e + S::load(wpe[(bt % T) * C + c]));
  }
}

// dwte: block (x = sorted position k0, y = channel block). Only the block at the first sorted
// position of a token's bucket works; each thread sums one channel over the bucket in sorted
// (= position) order in fp32, exactly the CPU's order, and rounds once. No atomics.
template <typename S>
__global__ void encoder_backward_wte_kernel(typename S::storage* __restrict__ dwte, const typename S::storage* __restrict__ dout,
                                            const std::int32_t* __restrict__ tokens, const std::int32_t* __restrict__ order,
                                            const std::int32_t* __restrict__ start, std::int64_t C, std::int64_t first) {
  const std::int64_t k0 = blockIdx.x;
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const std::int64_t v = static_cast<std::int64_t>(tokens[order[k0]]) - first;
  if (start[v] != k0 || c >= C) return;
  const std::int32_t lo = start[v], hi = start[v + 1];
  float acc = 0.0f;
  for (std::int32_t k = lo; k < hi; ++k) acc += S::load(dout[static_cast<std::int64_t>(order[k]) * C + c]);
  dwte[v * C + c] = S::store(S::load(dwte[v * C + c]) + acc);
}

// dwpe: one thread per (t, c), summing over b in order.
template <typename S>
__global__ void encoder_backward_wpe_kernel(typename S::storage* __restrict__ dwpe, const typename S::storage* __restrict__ dout, std::int64_t B,
                                            std::int64_t T, std::int64_t C) {
  const std::int64_t n = T * C;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = 0.0f;
    for (std::int64_t b = 0; b < B; ++b) acc += S::load(dout[b * n + i]);
    dwpe[i] = S::store(S::load(dwpe[i]) + acc);
  }
}

}  // namespace

cudaError_t launch_gelu_forward(void* out, const void* inp, DType t, std::int64_t n, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    gelu_forward_kernel<S><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(inp), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_residual_add(void* out, const void* a, const void* b, DType t, std::int64_t n, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    residual_add_kernel<S>
        <<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(a), static_cast<const P*>(b), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_gelu_backward(void* dinp, const void* inp, const void* dout, DType t, std::int64_t n, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    gelu_backward_kernel<S><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(dinp), static_cast<const P*>(inp),
                                                                                       static_cast<const P*>(dout), n);
    return cudaGetLastError();
  });
}

cudaError_t launch_dropout(void* out, const void* inp, DType t, std::int64_t n, float p, const RngKey& key, bool accumulate, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    if (p == 0.0f) {
      if (accumulate) {
        add_kernel<S><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(inp), n);
        return cudaGetLastError();
      }
      if (out == inp) return cudaSuccess;
      return cudaMemcpyAsync(out, inp, static_cast<std::size_t>(n) * sizeof(P), cudaMemcpyDeviceToDevice, s);
    }
    const std::size_t groups = static_cast<std::size_t>((n + 3) / 4);
    if (accumulate) {
      dropout_kernel<S, true><<<grid_for(groups), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(inp), n, p, key);
    } else {
      dropout_kernel<S, false><<<grid_for(groups), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(inp), n, p, key);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_encoder_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe, DType t, std::int64_t BT, std::int64_t T,
                                   std::int64_t C, std::int64_t first, std::int64_t V, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    encoder_forward_kernel<S><<<grid_for(static_cast<std::size_t>(BT * C)), kThreads, 0, s>>>(static_cast<P*>(out), tokens,
                                                                                              static_cast<const P*>(wte), static_cast<const P*>(wpe),
                                                                                              BT, T, C, first, V);
    return cudaGetLastError();
  });
}

cudaError_t launch_encoder_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens, const std::int32_t* order,
                                    const std::int32_t* start, DType t, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t first,
                                    std::int64_t n_in, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    constexpr unsigned kChan = 128;
    if (n_in > 0) {
      const dim3 grid(static_cast<unsigned>(n_in), static_cast<unsigned>((C + kChan - 1) / kChan));
      encoder_backward_wte_kernel<S><<<grid, kChan, 0, s>>>(static_cast<P*>(dwte), static_cast<const P*>(dout), tokens, order, start, C, first);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    encoder_backward_wpe_kernel<S>
        <<<grid_for(static_cast<std::size_t>(T * C)), kThreads, 0, s>>>(static_cast<P*>(dwpe), static_cast<const P*>(dout), B, T, C);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
