// RuleStep: one call's scalars of an element-wise optimizer rule (ops/kernels/optimizer_rule.h),
// and the element function each rule specialises. Plain structs and host/device inline math only
// (no Tensor, no fmt), so the CUDA kernels include this file and the rule headers.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/kernels/philox.h"  // DSTRAIN_HOST_DEVICE

namespace dstrain {

enum class OptimizerRule : std::uint8_t { adagrad, lion, rmsprop, adamax, nadam, radam, adadelta, asgd, rprop };

struct RuleStep {
  OptimizerRule rule = OptimizerRule::adagrad;
  int states = 0;      // per-element fp32 states the rule keeps (optimizer_rule_state_count)
  bool first = false;  // t == 1: states that torch initialises to a non-zero value start here
  float lr = 0.0f;
  float grad_scale = 1.0f;    // negative for maximize
  float weight_decay = 0.0f;  // coupled L2 (0: none, or decoupled)
  float decay = 1.0f;         // decoupled: θ *= decay before the update (1: none)
  float beta1 = 0.0f, beta2 = 0.0f, eps = 0.0f;
  // The rule's own scalars, named in its header.
  float k0 = 0.0f, k1 = 0.0f, k2 = 0.0f, k3 = 0.0f;
  bool option0 = false, option1 = false;
};

inline int optimizer_rule_state_count(const RuleStep& s) { return s.states; }

// The fields the Adam-like rules (NAdam, RAdam) fill alike: lr, maximize as the gradient's sign,
// weight decay in torch's decoupled form (θ·(1 − lr·wd) before the update) or its L2 form
// (g + wd·θ), the betas and eps.
inline RuleStep adam_like_step(OptimizerRule rule, double lr, double weight_decay, bool decoupled_weight_decay, bool maximize, float grad_scale,
                               double beta1, double beta2, double eps) {
  RuleStep s;
  s.rule = rule;
  s.states = 2;
  s.lr = static_cast<float>(lr);
  s.grad_scale = maximize ? -grad_scale : grad_scale;
  if (decoupled_weight_decay) {
    s.decay = static_cast<float>(1.0 - lr * weight_decay);
  } else {
    s.weight_decay = static_cast<float>(weight_decay);
  }
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  return s;
}

// The new θ from θ (after the decoupled decay), the prepared gradient g and the element's states
// s[0..states) (read and written). Specialised in each rule's header.
template <OptimizerRule R>
DSTRAIN_HOST_DEVICE float rule_element(const RuleStep& k, float p, float g, float* s);

// fp32 helpers with one rounding each, the same on the host and the device.
DSTRAIN_HOST_DEVICE inline float rule_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
DSTRAIN_HOST_DEVICE inline float rule_abs(float x) { return x < 0.0f ? -x : x; }
// torch.lerp(a, b, w): a + w·(b − a) for w < 0.5, else b − (b − a)·(1 − w).
DSTRAIN_HOST_DEVICE inline float rule_lerp(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

}  // namespace dstrain
