// Adamax: torch.optim.Adamax (torch/optim/adamax.py, _single_tensor_adamax). States: exp_avg,
// exp_inf.
//   g   = grad·scale (+ weight_decay·θ)
//   m   = lerp(m, g, 1 − β1)
//   u   = max(β2·u, |g| + eps)
//   θ   = θ − (lr / (1 − β1^t)) · m / u
// Defaults (torch): lr 2e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.
#pragma once

#include <cmath>

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct AdamaxConfig {
  double lr = 2e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool maximize = false;
};

// k0 = lr / (1 − β1^t).
inline RuleStep adamax_step(const AdamaxConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::adamax;
  s.states = 2;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.beta1 = static_cast<float>(c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.eps = static_cast<float>(c.eps);
  s.k0 = static_cast<float>(c.lr / (1.0 - std::pow(c.beta1, static_cast<double>(t))));
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::adamax>(const RuleStep& k, float p, float g, float* s) {
  const float m = rule_lerp(s[0], g, 1.0f - k.beta1);
  const float a = k.beta2 * s[1], b = rule_abs(g) + k.eps;
  const float u = a > b ? a : b;
  s[0] = m;
  s[1] = u;
  return p - k.k0 * (m / u);
}

}  // namespace dstrain
