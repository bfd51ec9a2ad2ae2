// ASGD: torch.optim.ASGD (torch/optim/asgd.py, _single_tensor_asgd). State: ax (the averaged
// parameters; the update of θ does not read it). torch also keeps eta and mu per parameter; they
// depend on t (and lr) alone, so dstrain derives them each step (docs/optimizers.md):
//   η_1 = lr, η_t = lr / (1 + λ·lr·(t − 1))^α;   μ_1 = 1, μ_t = 1 / max(1, t − 1 − t0)
//   g  = grad·scale (+ weight_decay·θ)
//   θ  = θ·(1 − λ·η_t) − η_t·g
//   ax = ax + (θ − ax)·μ_t  (μ_t == 1: ax = θ)
// (torch computes η_t and μ_t after step t − 1 from that step's lr; under a constant lr, as
// here, the same value.) Defaults (torch): lr 1e-2, lambd 1e-4, alpha 0.75, t0 1e6, weight_decay 0.
#pragma once

#include <algorithm>
#include <cmath>

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct AsgdConfig {
  double lr = 1e-2, lambd = 1e-4, alpha = 0.75, t0 = 1e6, weight_decay = 0.0;
  bool maximize = false;
};

// k0 = η_t, k1 = 1 − λ·η_t, k2 = μ_t.
inline RuleStep asgd_step(const AsgdConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::asgd;
  s.states = 1;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.weight_decay = static_cast<float>(c.weight_decay);
  const double prev = static_cast<double>(t - 1);
  const float eta = static_cast<float>(t == 1 ? c.lr : c.lr / std::pow(1.0 + c.lambd * c.lr * prev, c.alpha));
  s.k0 = eta;
  s.k1 = 1.0f - static_cast<float>(c.lambd) * eta;
  s.k2 = static_cast<float>(t == 1 ? 1.0 : 1.0 / std::max(1.0, prev - c.t0));
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::asgd>(const RuleStep& k, float p, float g, float* s) {
  p = p * k.k1;
  p = p - k.k0 * g;
  s[0] = k.k2 != 1.0f ? s[0] + (p - s[0]) * k.k2 : p;
  return p;
}

}  // namespace dstrain
