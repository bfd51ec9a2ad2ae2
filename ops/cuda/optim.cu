// Optimizer CUDA kernels: AdamW / Adam-L2 with the optional 16-bit parameter copy. Built with
// -fmad=false (ops/cuda/CMakeLists.txt), so each multiply and add rounds as on the CPU (the CPU
// library targets baseline x86-64: no FMA); with IEEE division and sqrt the fp32 master, m and v
// are meant to match ops/cpu/adamw.cpp bit for bit, and the 16-bit copy is the RNE of the master.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"
#include "ops/kernels/stochastic_round.h"

namespace dstrain::cuda_detail {
namespace {

struct NoCopy {
  using storage = float;
};

template <typename G, typename L, bool kDecoupled>
__global__ void adamw_kernel(float* __restrict__ p, const typename G::storage* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                             typename L::storage* __restrict__ lowp, std::int64_t n, float lr, float b1, float b2, float eps, float wd, float gs,
                             float bc1, float bc2, StochasticRounding sr) {
  const float decay = 1.0f - lr * wd;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float pi0 = p[i];
    const float gi = kDecoupled ? G::load(g[i]) * gs : G::load(g[i]) * gs + wd * pi0;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float pi = (kDecoupled ? pi0 * decay : pi0) - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (std::is_same_v<L, BF16>) {
      const std::uint32_t bits = __float_as_uint(pi);
      lowp[i] =
          sr.on && fp32_bits_finite(bits) ? bf16_bits_stochastic(bits, sr.key.element_bits(static_cast<std::uint64_t>(sr.offset + i))) : L::store(pi);
    } else if constexpr (!std::is_same_v<L, NoCopy>) {
      lowp[i] = L::store(pi);
    }
  }
}

template <typename G, typename L>
cudaError_t launch_typed(float* p, const void* g, float* m, float* v, void* lowp, std::int64_t n, float lr, float b1, float b2, float eps, float wd,
                         float gs, float bc1, float bc2, bool decoupled, const StochasticRounding& sr, cudaStream_t s) {
  using GP = typename G::storage;
  using LP = typename L::storage;
  const unsigned grid = grid_for(static_cast<std::size_t>(n));
  if (decoupled) {
    adamw_kernel<G, L, true>
        <<<grid, kThreads, 0, s>>>(p, static_cast<const GP*>(g), m, v, static_cast<LP*>(lowp), n, lr, b1, b2, eps, wd, gs, bc1, bc2, sr);
  } else {
    adamw_kernel<G, L, false>
        <<<grid, kThreads, 0, s>>>(p, static_cast<const GP*>(g), m, v, static_cast<LP*>(lowp), n, lr, b1, b2, eps, wd, gs, bc1, bc2, sr);
  }
  return cudaGetLastError();
}

// Grid-stride partial sums with a FIXED grid (kNormBlocks x kThreads, whatever the GPU), each
// block reduced in a fixed tree: the same bits on every run and device. partials[2b], [2b+1] =
// block b's (sum of squares, non-finite count), summed in block order on the host.
template <typename G>
__global__ void grad_norm_kernel(const typename G::storage* __restrict__ g, std::int64_t n, double* __restrict__ partials) {
  double sq = 0.0, nf = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float x = G::load(g[i]);
    const double d = static_cast<double>(x);
    sq += d * d;
    nf += ((__float_as_uint(x) & 0x7f800000u) == 0x7f800000u) ? 1.0 : 0.0;
  }
  sq = block_sum(sq);
  nf = block_sum(nf);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = sq;
    partials[2 * blockIdx.x + 1] = nf;
  }
}

template <typename G>
__global__ void scale_kernel(typename G::storage* g, std::int64_t n, float factor) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) g[i] = G::store(G::load(g[i]) * factor);
}

// torch.optim.SGD, as ops/cpu/sgd.cpp (same operation order; -fmad=false).
template <typename G, typename L, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void sgd_kernel(float* __restrict__ p, const typename G::storage* __restrict__ g, float* __restrict__ buf,
                           typename L::storage* __restrict__ lowp, std::int64_t n, float lr, float mu, float damp, float wd, float gs) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float gi = G::load(g[i]) * gs + wd * p[i];
    if constexpr (kMomentum) {
      const float b = kFirst ? gi : mu * buf[i] + damp * gi;
      buf[i] = b;
      gi = kNesterov ? gi + mu * b : b;
    }
    const float pi = p[i] - lr * gi;
    p[i] = pi;
    if constexpr (!std::is_same_v<L, NoCopy>) lowp[i] = L::store(pi);
  }
}

template <typename G, typename L, bool kMomentum, bool kFirst, bool kNesterov>
cudaError_t launch_sgd_typed(float* p, const void* g, float* buf, void* lowp, std::int64_t n, float lr, float mu, float damp, float wd, float gs,
                             cudaStream_t s) {
  sgd_kernel<G, L, kMomentum, kFirst, kNesterov>
      <<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(p, static_cast<const typename G::storage*>(g), buf,
                                                                  static_cast<typename L::storage*>(lowp), n, lr, mu, damp, wd, gs);
  return cudaGetLastError();
}

template <typename G, typename L>
cudaError_t launch_sgd_modes(float* p, const void* g, float* buf, void* lowp, std::int64_t n, float lr, float mu, float damp, float wd, float gs,
                             bool first, bool nesterov, cudaStream_t s) {
  if (mu == 0.0f) return launch_sgd_typed<G, L, false, false, false>(p, g, buf, lowp, n, lr, mu, damp, wd, gs, s);
  if (nesterov) {
    return first ? launch_sgd_typed<G, L, true, true, true>(p, g, buf, lowp, n, lr, mu, damp, wd, gs, s)
                 : launch_sgd_typed<G, L, true, false, true>(p, g, buf, lowp, n, lr, mu, damp, wd, gs, s);
  }
  return first ? launch_sgd_typed<G, L, true, true, false>(p, g, buf, lowp, n, lr, mu, damp, wd, gs, s)
               : launch_sgd_typed<G, L, true, false, false>(p, g, buf, lowp, n, lr, mu, damp, wd, gs, s);
}

__device__ __forceinline__ float lamb_denom(float v, float eps, bool inside) { return inside ? sqrtf(v + eps) : sqrtf(v) + eps; }

// LAMB pass 1, block (range r, slice y): m, v updated; the range's ||θ||² and ||u||² partials
// (double) of this slice into partials[(r * kLambSlices + y) * 2 + {0, 1}].
template <typename G>
__global__ void lamb_moments_kernel(float* __restrict__ p, const typename G::storage* __restrict__ g, float* __restrict__ m, float* __restrict__ v,
                                    const std::int64_t* __restrict__ ranges, double* __restrict__ partials, float b1, float b2, float eps, float wd,
                                    float gs, bool inside) {
  const std::int64_t r = blockIdx.x, off = ranges[2 * r], len = ranges[2 * r + 1];
  double sw = 0.0, su = 0.0;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.y) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < len; k += stride) {
    const std::int64_t i = off + k;
    const float gi = G::load(g[i]) * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float u = mi / lamb_denom(vi, eps, inside) + wd * p[i];
    sw += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    su += static_cast<double>(u) * static_cast<double>(u);
  }
  sw = block_sum(sw);
  su = block_sum(su);
  if (threadIdx.x == 0) {
    partials[(r * gridDim.y + blockIdx.y) * 2] = sw;
    partials[(r * gridDim.y + blockIdx.y) * 2 + 1] = su;
  }
}

// LAMB pass 2: the trust ratio from the partials (summed in slice order by every block: the same
// value everywhere), then θ -= step_size * coeff * u and the 16-bit copy.
template <typename L>
__global__ void lamb_apply_kernel(float* __restrict__ p, const float* __restrict__ m, const float* __restrict__ v,
                                  typename L::storage* __restrict__ lowp, const std::int64_t* __restrict__ ranges,
                                  const double* __restrict__ partials, float* __restrict__ coeffs, float step_size, float eps, float wd,
                                  float max_coeff, float min_coeff, bool inside) {
  const std::int64_t r = blockIdx.x, off = ranges[2 * r], len = ranges[2 * r + 1];
  double tw = 0.0, tu = 0.0;
  for (unsigned y = 0; y < gridDim.y; ++y) {
    tw += partials[(r * gridDim.y + y) * 2];
    tu += partials[(r * gridDim.y + y) * 2 + 1];
  }
  const float w_norm = static_cast<float>(sqrt(tw)), u_norm = static_cast<float>(sqrt(tu));
  float coeff = 1.0f;
  if (w_norm != 0.0f && u_norm != 0.0f) {
    coeff = w_norm / u_norm;
    if (coeff > max_coeff) coeff = max_coeff;
    if (coeff < min_coeff) coeff = min_coeff;
  }
  if (coeffs && blockIdx.y == 0 && threadIdx.x == 0) coeffs[r] = coeff;
  const float rate = step_size * coeff;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.y) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; k < len; k += stride) {
    const std::int64_t i = off + k;
    const float u = m[i] / lamb_denom(v[i], eps, inside) + wd * p[i];
    const float pi = p[i] - rate * u;
    p[i] = pi;
    if constexpr (!std::is_same_v<L, NoCopy>) lowp[i] = L::store(pi);
  }
}

template <typename L>
cudaError_t launch_lamb_apply(float* p, const float* m, const float* v, void* lowp, const std::int64_t* ranges, const double* partials, float* coeffs,
                              std::int64_t nranges, float step_size, float eps, float wd, float max_coeff, float min_coeff, bool inside,
                              cudaStream_t s) {
  lamb_apply_kernel<L><<<dim3(static_cast<unsigned>(nranges), kLambSlices), kThreads, 0, s>>>(p, m, v, static_cast<typename L::storage*>(lowp),
                                                                                              ranges, partials, coeffs, step_size, eps, wd, max_coeff,
                                                                                              min_coeff, inside);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_lamb(float* p, const void* g, DType gt, float* m, float* v, void* lowp, DType lowp_t, const std::int64_t* ranges,
                        std::int64_t nranges, double* partials, float* coeffs, float step_size, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, float max_coeff, float min_coeff, bool eps_inside_sqrt, cudaStream_t s) {
  if (nranges == 0) return cudaSuccess;
  const cudaError_t e = dispatch_storage(gt, [&]<typename G>(G) {
    lamb_moments_kernel<G><<<dim3(static_cast<unsigned>(nranges), kLambSlices), kThreads, 0, s>>>(p, static_cast<const typename G::storage*>(g), m, v,
                                                                                                  ranges, partials, beta1, beta2, eps, weight_decay,
                                                                                                  grad_scale, eps_inside_sqrt);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  if (lowp == nullptr)
    return launch_lamb_apply<NoCopy>(p, m, v, lowp, ranges, partials, coeffs, nranges, step_size, eps, weight_decay, max_coeff, min_coeff,
                                     eps_inside_sqrt, s);
  if (lowp_t == DType::fp16)
    return launch_lamb_apply<F16>(p, m, v, lowp, ranges, partials, coeffs, nranges, step_size, eps, weight_decay, max_coeff, min_coeff,
                                  eps_inside_sqrt, s);
  if (lowp_t == DType::bf16)
    return launch_lamb_apply<BF16>(p, m, v, lowp, ranges, partials, coeffs, nranges, step_size, eps, weight_decay, max_coeff, min_coeff,
                                   eps_inside_sqrt, s);
  return cudaErrorInvalidValue;
}

cudaError_t launch_grad_norm_partials(const void* g, DType t, std::int64_t n, double* partials, cudaStream_t s) {
  return dispatch_storage(t, [&]<typename G>(G) {
    grad_norm_kernel<G><<<kNormBlocks, kThreads, 0, s>>>(static_cast<const typename G::storage*>(g), n, partials);
    return cudaGetLastError();
  });
}

cudaError_t launch_scale(void* g, DType t, std::int64_t n, float factor, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename G>(G) {
    scale_kernel<G><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<typename G::storage*>(g), n, factor);
    return cudaGetLastError();
  });
}

cudaError_t launch_sgd(float* p, const void* g, DType gt, float* buf, void* lowp, DType lowp_t, std::int64_t n, float lr, float momentum, float damp,
                       float weight_decay, float gs, bool first, bool nesterov, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_storage(gt, [&]<typename G>(G) {
    if (lowp == nullptr) return launch_sgd_modes<G, NoCopy>(p, g, buf, lowp, n, lr, momentum, damp, weight_decay, gs, first, nesterov, s);
    if (lowp_t == DType::fp16) return launch_sgd_modes<G, F16>(p, g, buf, lowp, n, lr, momentum, damp, weight_decay, gs, first, nesterov, s);
    if (lowp_t == DType::bf16) return launch_sgd_modes<G, BF16>(p, g, buf, lowp, n, lr, momentum, damp, weight_decay, gs, first, nesterov, s);
    return cudaErrorInvalidValue;
  });
}

cudaError_t launch_adamw(float* p, const void* g, DType gt, float* m, float* v, void* lowp, DType lowp_t, std::int64_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2, bool decoupled,
                         const StochasticRounding& sr, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return dispatch_storage(gt, [&]<typename G>(G) {
    if (lowp == nullptr)
      return launch_typed<G, NoCopy>(p, g, m, v, lowp, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2, decoupled, sr, s);
    if (lowp_t == DType::fp16)
      return launch_typed<G, F16>(p, g, m, v, lowp, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2, decoupled, sr, s);
    if (lowp_t == DType::bf16)
      return launch_typed<G, BF16>(p, g, m, v, lowp, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2, decoupled, sr, s);
    return cudaErrorInvalidValue;
  });
}

}  // namespace dstrain::cuda_detail
