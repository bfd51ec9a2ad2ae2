// The element loop of the element-wise optimizer rules, compiled once per ISA
// (ops/cpu/isa_target.h). The per-element math is the rule header's rule_element, which the CUDA
// kernel (ops/cuda/optimizer_rule.cu) runs too, so every ISA and the GPU round alike.
#include <cstdint>
#include <type_traits>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/optimizer_rule_isa.h"
#include "ops/kernels/adadelta.h"
#include "ops/kernels/adagrad.h"
#include "ops/kernels/adamax.h"
#include "ops/kernels/asgd.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/radam.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"
#include "ops/cpu/isa_target.h"

DSTRAIN_ISA_BEGIN
namespace dstrain::cpu::DSTRAIN_ISA_NS {
namespace {

template <OptimizerRule R, int kStates, typename G, typename L>
void rule_loop(const RuleArgs& a, std::int64_t begin, std::int64_t end) {
  const RuleStep k = a.k;
  float* __restrict p = a.p;
  const G* __restrict g = static_cast<const G*>(a.g);
  L* __restrict lowp = static_cast<L*>(a.lowp);
  float* s[kMaxRuleStates] = {a.s[0], a.s[1], a.s[2]};
  for (std::int64_t i = begin; i < end; ++i) {
    const float pi0 = p[i];
    const float gi = load(g[i]) * k.grad_scale + k.weight_decay * pi0;  // weight_decay 0 when decoupled
    float st[kMaxRuleStates] = {0.0f, 0.0f, 0.0f};                      // the rule may name states its options leave out
    for (int j = 0; j < kStates; ++j) st[j] = s[j][i];
    const float pi = rule_element<R>(k, pi0 * k.decay, gi, st);
    for (int j = 0; j < kStates; ++j) s[j][i] = st[j];
    p[i] = pi;
    if constexpr (!std::is_same_v<L, float>) lowp[i] = store<L>(pi);
  }
}

template <OptimizerRule R, int kStates, typename G>
void rule_lowp(const RuleArgs& a, std::int64_t begin, std::int64_t end) {
  if (a.lowp == nullptr) return rule_loop<R, kStates, G, float>(a, begin, end);
  if (a.lowp_dtype == DType::fp16) return rule_loop<R, kStates, G, fp16_t>(a, begin, end);
  return rule_loop<R, kStates, G, bf16_t>(a, begin, end);
}

template <OptimizerRule R, int kStates>
void rule_typed(const RuleArgs& a, std::int64_t begin, std::int64_t end) {
  switch (a.g_dtype) {
    case DType::fp16:
      return rule_lowp<R, kStates, fp16_t>(a, begin, end);
    case DType::bf16:
      return rule_lowp<R, kStates, bf16_t>(a, begin, end);
    default:
      return rule_lowp<R, kStates, float>(a, begin, end);
  }
}

}  // namespace

void optimizer_rule_range(const RuleArgs& a, std::int64_t begin, std::int64_t end) {
  switch (a.k.rule) {
    case OptimizerRule::adagrad:
      return rule_typed<OptimizerRule::adagrad, 1>(a, begin, end);
    case OptimizerRule::lion:
      return rule_typed<OptimizerRule::lion, 1>(a, begin, end);
    case OptimizerRule::rmsprop:
      // 1 to 3 states (momentum_buffer, grad_avg optional): the loop copies the most it may touch.
      if (a.k.states == 1) return rule_typed<OptimizerRule::rmsprop, 1>(a, begin, end);
      if (a.k.states == 2) return rule_typed<OptimizerRule::rmsprop, 2>(a, begin, end);
      return rule_typed<OptimizerRule::rmsprop, 3>(a, begin, end);
    case OptimizerRule::adamax:
      return rule_typed<OptimizerRule::adamax, 2>(a, begin, end);
    case OptimizerRule::nadam:
      return rule_typed<OptimizerRule::nadam, 2>(a, begin, end);
    case OptimizerRule::radam:
      return rule_typed<OptimizerRule::radam, 2>(a, begin, end);
    case OptimizerRule::adadelta:
      return rule_typed<OptimizerRule::adadelta, 2>(a, begin, end);
    case OptimizerRule::asgd:
      return rule_typed<OptimizerRule::asgd, 1>(a, begin, end);
    case OptimizerRule::rprop:
      return rule_typed<OptimizerRule::rprop, 2>(a, begin, end);
  }
}

}  // namespace dstrain::cpu::DSTRAIN_ISA_NS
DSTRAIN_ISA_END
