// Rprop: torch.optim.Rprop (torch/optim/rprop.py, _single_tensor_rprop). States: prev,
// step_size (lr at t = 1). No weight decay (torch's Rprop takes none).
//   g = grad·scale
//   f = etaplus if g·prev > 0, etaminus if g·prev < 0, else 1
//   step_size = clamp(step_size·f, step_min, step_max)
//   g = 0 where f == etaminus
//   θ = θ − sign(g)·step_size;  prev = g
// Defaults (torch): lr 1e-2, etas (0.5, 1.2), step_sizes (1e-6, 50).
#pragma once

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct RpropConfig {
  double lr = 1e-2, etaminus = 0.5, etaplus = 1.2, step_min = 1e-6, step_max = 50.0;
  bool maximize = false;
};

// k0 = etaminus, k1 = etaplus, k2 = step_min, k3 = step_max.
inline RuleStep rprop_step(const RpropConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::rprop;
  s.states = 2;
  s.first = t == 1;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.k0 = static_cast<float>(c.etaminus);
  s.k1 = static_cast<float>(c.etaplus);
  s.k2 = static_cast<float>(c.step_min);
  s.k3 = static_cast<float>(c.step_max);
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::rprop>(const RuleStep& k, float p, float g, float* s) {
  const float prod = g * s[0];
  const float f = prod > 0.0f ? k.k1 : prod < 0.0f ? k.k0 : 1.0f;
  float step = (k.first ? k.lr : s[1]) * f;
  step = step < k.k2 ? k.k2 : step;
  step = step > k.k3 ? k.k3 : step;
  s[1] = step;
  if (f == k.k0) g = 0.0f;
  s[0] = g;
  const float sign = g > 0.0f ? 1.0f : g < 0.0f ? -1.0f : 0.0f;
  return p - sign * step;
}

}  // namespace dstrain
