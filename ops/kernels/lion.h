// Lion: DeepSpeed's "Lion" is FusedLion (deepspeed/ops/lion/fused_lion.py, csrc/lion/
// multi_tensor_lion.cu). State: exp_avg.
//   θ = θ·(1 − lr·weight_decay)             (decoupled; the factor in fp32 as DeepSpeed's kernel)
//   c = β1·m + (1 − β1)·g
//   θ = θ − lr if c > 0, else θ + lr        (DeepSpeed's kernel: c == 0 also steps by +lr)
//   m = β2·m + (1 − β2)·g
// Defaults (FusedLion): lr 1e-3, betas (0.9, 0.999), weight_decay 0. No bias correction, no eps.
#pragma once

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct LionConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
};

inline RuleStep lion_step(const LionConfig& c, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::lion;
  s.states = 1;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = grad_scale;
  s.decay = 1.0f - static_cast<float>(c.lr) * static_cast<float>(c.weight_decay);
  s.beta1 = static_cast<float>(c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::lion>(const RuleStep& k, float p, float g, float* s) {
  const float m = s[0];
  const float c = k.beta1 * m + (1.0f - k.beta1) * g;
  s[0] = k.beta2 * m + (1.0f - k.beta2) * g;
  return p + (c > 0.0f ? -k.lr : k.lr);
}

}  // namespace dstrain
