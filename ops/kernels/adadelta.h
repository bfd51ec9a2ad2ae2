// Adadelta: torch.optim.Adadelta (torch/optim/adadelta.py, _single_tensor_adadelta). States:
// square_avg, acc_delta.
//   g     = grad·scale (+ weight_decay·θ)
//   sq    = ρ·sq + (1 − ρ)·g²
//   delta = sqrt(acc + eps) / sqrt(sq + eps) · g
//   acc   = ρ·acc + (1 − ρ)·delta²
//   θ     = θ − lr·delta
// Defaults (torch): lr 1.0, rho 0.9, eps 1e-6, weight_decay 0.
#pragma once

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct AdadeltaConfig {
  double lr = 1.0, rho = 0.9, eps = 1e-6, weight_decay = 0.0;
  bool maximize = false;
};

// k0 = rho.
inline RuleStep adadelta_step(const AdadeltaConfig& c, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::adadelta;
  s.states = 2;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.eps = static_cast<float>(c.eps);
  s.k0 = static_cast<float>(c.rho);
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::adadelta>(const RuleStep& k, float p, float g, float* s) {
  const float sq = k.k0 * s[0] + (1.0f - k.k0) * (g * g);
  const float delta = rule_sqrt(s[1] + k.eps) / rule_sqrt(sq + k.eps) * g;
  s[0] = sq;
  s[1] = k.k0 * s[1] + (1.0f - k.k0) * (delta * delta);
  return p - k.lr * delta;
}

}  // namespace dstrain
