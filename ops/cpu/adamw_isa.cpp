// AdamW's element loop, compiled once per ISA (ops/cpu/isa_target.h): the per-element math is
// fp32 in the order ops/cuda/optim.cu uses, so every ISA and the GPU round alike.
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/adamw_isa.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/stochastic_round.h"
#include "ops/cpu/isa_target.h"

DSTRAIN_ISA_BEGIN
namespace dstrain::cpu::DSTRAIN_ISA_NS {
namespace {

// kStochastic is a template parameter, not a run-time test in the loop: the stochastic branch calls
// Philox, and its mere presence kept the compiler from vectorising the round-to-nearest loop
// (bf16 copy: 3.1 GB/s against 18 for fp32 on 2 cores; bench/bench_cpu_optimizer.cpp).
template <bool kDecoupled, bool kStochastic, typename G, typename L>
void adamw_loop(float* __restrict p, const G* __restrict g, float* __restrict m, float* __restrict v, L* __restrict lowp, std::int64_t begin,
                std::int64_t end, const AdamWArgs& a) {
  const AdamWConfig& c = a.c;
  const float decay = 1.0f - c.lr * c.weight_decay;
  const float b1 = c.beta1, b2 = c.beta2, lr = c.lr, eps = c.eps, gs = c.grad_scale, wd = c.weight_decay, bc1 = a.bc1, bc2 = a.bc2;
  for (std::int64_t i = begin; i < end; ++i) {
    // AdamW decays θ itself; Adam with L2 adds wd·θ to the gradient before the moments.
    const float gi = kDecoupled ? load(g[i]) * gs : load(g[i]) * gs + wd * p[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float pi = (kDecoupled ? p[i] * decay : p[i]) - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (std::is_same_v<L, bf16_t>) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(pi);
      if constexpr (kStochastic) {
        lowp[i] = fp32_bits_finite(bits)
                      ? bf16_t::from_bits(bf16_bits_stochastic(bits, c.rounding_key.element_bits(static_cast<std::uint64_t>(c.rounding_offset + i))))
                      : store<L>(pi);
      } else {
        lowp[i] = store<L>(pi);
      }
    } else if constexpr (!std::is_same_v<L, float>) {
      lowp[i] = store<L>(pi);
    }
  }
}

template <typename G, typename L>
void adamw_typed(const AdamWArgs& a, std::int64_t begin, std::int64_t end) {
  const auto* g = static_cast<const G*>(a.g);
  auto* lowp = static_cast<L*>(a.lowp);
  // Stochastic rounding applies to a bf16 copy only (ops/kernels/adamw.h).
  const bool sr = std::is_same_v<L, bf16_t> && a.c.stochastic_rounding;
  if (a.c.decoupled_weight_decay) {
    sr ? adamw_loop<true, true, G, L>(a.p, g, a.m, a.v, lowp, begin, end, a) : adamw_loop<true, false, G, L>(a.p, g, a.m, a.v, lowp, begin, end, a);
  } else {
    sr ? adamw_loop<false, true, G, L>(a.p, g, a.m, a.v, lowp, begin, end, a) : adamw_loop<false, false, G, L>(a.p, g, a.m, a.v, lowp, begin, end, a);
  }
}

template <typename G>
void adamw_lowp(const AdamWArgs& a, std::int64_t begin, std::int64_t end) {
  if (a.lowp == nullptr) return adamw_typed<G, float>(a, begin, end);
  if (a.lowp_dtype == DType::fp16) return adamw_typed<G, fp16_t>(a, begin, end);
  return adamw_typed<G, bf16_t>(a, begin, end);
}

}  // namespace

void adamw_range(const AdamWArgs& a, std::int64_t begin, std::int64_t end) {
  switch (a.g_dtype) {
    case DType::fp16:
      return adamw_lowp<fp16_t>(a, begin, end);
    case DType::bf16:
      return adamw_lowp<bf16_t>(a, begin, end);
    default:
      return adamw_lowp<float>(a, begin, end);
  }
}

}  // namespace dstrain::cpu::DSTRAIN_ISA_NS
DSTRAIN_ISA_END
