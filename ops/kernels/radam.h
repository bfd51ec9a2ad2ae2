// RAdam: torch.optim.RAdam (torch/optim/radam.py, _single_tensor_radam). States: exp_avg,
// exp_avg_sq.
//   g     = grad·scale (+ weight_decay·θ, or θ·(1 − lr·weight_decay) with decoupled_weight_decay)
//   m     = lerp(m, g, 1 − β1);  v = β2·v + (1 − β2)·g²;  m̂ = m / (1 − β1^t)
//   ρ∞    = 2/(1 − β2) − 1;  ρ_t = ρ∞ − 2t·β2^t/(1 − β2^t)
//   ρ_t > 5: r = sqrt((ρ_t − 4)(ρ_t − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρ_t));
//            θ = θ − m̂·lr · sqrt(1 − β2^t)/(sqrt(v) + eps) · r
//   else:    θ = θ − m̂·lr
// Defaults (torch): lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0,
// decoupled_weight_decay false.
#pragma once

#include <cmath>

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct RadamConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false, maximize = false;
};

// k0 = 1 − β1^t, k1 = sqrt(1 − β2^t), k2 = r; option0 = ρ_t > 5.
inline RuleStep radam_step(const RadamConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s = adam_like_step(OptimizerRule::radam, c.lr, c.weight_decay, c.decoupled_weight_decay, c.maximize, grad_scale, c.beta1, c.beta2, c.eps);
  const double td = static_cast<double>(t);
  const double bc1 = 1.0 - std::pow(c.beta1, td), bc2 = 1.0 - std::pow(c.beta2, td);
  const double rho_inf = 2.0 / (1.0 - c.beta2) - 1.0;
  const double rho_t = rho_inf - 2.0 * td * std::pow(c.beta2, td) / bc2;
  s.k0 = static_cast<float>(bc1);
  s.k1 = static_cast<float>(std::sqrt(bc2));
  s.option0 = rho_t > 5.0;
  if (s.option0) s.k2 = static_cast<float>(std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t)));
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::radam>(const RuleStep& k, float p, float g, float* s) {
  const float m = rule_lerp(s[0], g, 1.0f - k.beta1);
  const float v = k.beta2 * s[1] + (1.0f - k.beta2) * (g * g);
  s[0] = m;
  s[1] = v;
  const float mhat = m / k.k0;
  // Selects, not a branch, so the loop vectorises; × 1.0f twice is exact, so the unrectified
  // step is still θ − m̂·lr.
  const float adaptive = k.option0 ? k.k1 / (rule_sqrt(v) + k.eps) : 1.0f;
  return p - mhat * k.lr * adaptive * (k.option0 ? k.k2 : 1.0f);
}

}  // namespace dstrain
