// NAdam: torch.optim.NAdam (torch/optim/nadam.py, _single_tensor_nadam). States: exp_avg,
// exp_avg_sq. torch also keeps mu_product = Π_{i<=t} μ_i per parameter; it depends on t alone, so
// dstrain derives it from t each step (docs/optimizers.md) instead of storing it.
//   g     = grad·scale (+ weight_decay·θ, or θ·(1 − lr·weight_decay) with decoupled_weight_decay)
//   μ_t   = β1·(1 − 0.5·0.96^(t·ψ)),  μ_{t+1} likewise,  ψ = momentum_decay
//   m     = lerp(m, g, 1 − β1);  v = β2·v + (1 − β2)·g²
//   denom = sqrt(v / (1 − β2^t)) + eps
//   θ     = θ − lr·(1 − μ_t)/(1 − Π_{i<=t} μ_i) · g / denom − lr·μ_{t+1}/(1 − Π_{i<=t+1} μ_i) · m / denom
// Defaults (torch): lr 2e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, momentum_decay 4e-3,
// decoupled_weight_decay false.
#pragma once

#include <cmath>

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct NadamConfig {
  double lr = 2e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, momentum_decay = 4e-3;
  bool decoupled_weight_decay = false, maximize = false;
};

// k0 = −lr·(1 − μ_t)/(1 − Π μ), k1 = −lr·μ_{t+1}/(1 − Π μ · μ_{t+1}), k2 = 1 − β2^t (double, then fp32).
inline RuleStep nadam_step(const NadamConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s = adam_like_step(OptimizerRule::nadam, c.lr, c.weight_decay, c.decoupled_weight_decay, c.maximize, grad_scale, c.beta1, c.beta2, c.eps);
  auto mu = [&](std::int64_t i) { return c.beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(i) * c.momentum_decay)); };
  double product = 1.0;
  for (std::int64_t i = 1; i <= t; ++i) product *= mu(i);
  const double mu_t = mu(t), mu_next = mu(t + 1);
  s.k0 = static_cast<float>(-c.lr * (1.0 - mu_t) / (1.0 - product));
  s.k1 = static_cast<float>(-c.lr * mu_next / (1.0 - product * mu_next));
  s.k2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(t)));
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::nadam>(const RuleStep& k, float p, float g, float* s) {
  const float m = rule_lerp(s[0], g, 1.0f - k.beta1);
  const float v = k.beta2 * s[1] + (1.0f - k.beta2) * (g * g);
  s[0] = m;
  s[1] = v;
  const float denom = rule_sqrt(v / k.k2) + k.eps;
  p = p + k.k0 * (g / denom);
  return p + k.k1 * (m / denom);
}

}  // namespace dstrain
