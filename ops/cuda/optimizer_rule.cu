// The element-wise optimizer rules (ops/kernels/optimizer_rule.h) on the GPU: one grid-stride
// kernel per rule, running the rule header's rule_element — the function the CPU loops run — with
// -fmad=false (ops/cuda/CMakeLists.txt), so each multiply and add rounds as on the CPU.
#include <cstdint>
#include <type_traits>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"
#include "ops/kernels/adadelta.h"
#include "ops/kernels/adagrad.h"
#include "ops/kernels/adamax.h"
#include "ops/kernels/asgd.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/radam.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"

namespace dstrain::cuda_detail {
namespace {

struct NoCopy {
  using storage = float;
};

constexpr int kMaxStates = 3;

struct StatePointers {
  float* s[kMaxStates];
};

template <OptimizerRule R, int kStates, typename G, typename L>
__global__ void rule_kernel(RuleStep k, float* __restrict__ p, const typename G::storage* __restrict__ g, StatePointers sp,
                            typename L::storage* __restrict__ lowp, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float pi0 = p[i];
    const float gi = G::load(g[i]) * k.grad_scale + k.weight_decay * pi0;
    float st[kMaxStates] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kStates; ++j) st[j] = sp.s[j][i];
    const float pi = rule_element<R>(k, pi0 * k.decay, gi, st);
#pragma unroll
    for (int j = 0; j < kStates; ++j) sp.s[j][i] = st[j];
    p[i] = pi;
    if constexpr (!std::is_same_v<L, NoCopy>) lowp[i] = L::store(pi);
  }
}

template <OptimizerRule R, int kStates>
cudaError_t launch_rule(const RuleStep& k, float* p, const void* g, DType gt, const StatePointers& sp, void* lowp, DType lowp_t, std::int64_t n,
                        cudaStream_t s) {
  const unsigned grid = grid_for(static_cast<std::size_t>(n));
  return dispatch_storage(gt, [&]<typename G>(G) {
    using GP = typename G::storage;
    if (lowp == nullptr) {
      rule_kernel<R, kStates, G, NoCopy><<<grid, kThreads, 0, s>>>(k, p, static_cast<const GP*>(g), sp, static_cast<float*>(lowp), n);
    } else if (lowp_t == DType::fp16) {
      rule_kernel<R, kStates, G, F16><<<grid, kThreads, 0, s>>>(k, p, static_cast<const GP*>(g), sp, static_cast<typename F16::storage*>(lowp), n);
    } else if (lowp_t == DType::bf16) {
      rule_kernel<R, kStates, G, BF16><<<grid, kThreads, 0, s>>>(k, p, static_cast<const GP*>(g), sp, static_cast<typename BF16::storage*>(lowp), n);
    } else {
      return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_optimizer_rule(const RuleStep& k, float* p, const void* g, DType gt, float* const* states, void* lowp, DType lowp_t,
                                  std::int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  StatePointers sp{{nullptr, nullptr, nullptr}};
  for (int j = 0; j < k.states && j < kMaxStates; ++j) sp.s[j] = states[j];
  switch (k.rule) {
    case OptimizerRule::adagrad:
      return launch_rule<OptimizerRule::adagrad, 1>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::lion:
      return launch_rule<OptimizerRule::lion, 1>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::rmsprop:
      if (k.states == 1) return launch_rule<OptimizerRule::rmsprop, 1>(k, p, g, gt, sp, lowp, lowp_t, n, s);
      if (k.states == 2) return launch_rule<OptimizerRule::rmsprop, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
      return launch_rule<OptimizerRule::rmsprop, 3>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::adamax:
      return launch_rule<OptimizerRule::adamax, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::nadam:
      return launch_rule<OptimizerRule::nadam, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::radam:
      return launch_rule<OptimizerRule::radam, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::adadelta:
      return launch_rule<OptimizerRule::adadelta, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::asgd:
      return launch_rule<OptimizerRule::asgd, 1>(k, p, g, gt, sp, lowp, lowp_t, n, s);
    case OptimizerRule::rprop:
      return launch_rule<OptimizerRule::rprop, 2>(k, p, g, gt, sp, lowp, lowp_t, n, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dstrain::cuda_detail
