// RMSprop: torch.optim.RMSprop (torch/optim/rmsprop.py, _single_tensor_rmsprop). States, in
// torch's state_dict names and this order: square_avg; momentum_buffer when momentum > 0; grad_avg
// when centered.
//   g   = grad·scale (+ weight_decay·θ)
//   sq  = α·sq + (1 − α)·g²
//   centered: ga = lerp(ga, g, 1 − α);  avg = sqrt(sq − ga²) + eps   else avg = sqrt(sq) + eps
//   momentum > 0: buf = momentum·buf + g / avg;  θ = θ − lr·buf      else θ = θ − lr · g / avg
// Defaults (torch): lr 1e-2, alpha 0.99, eps 1e-8, weight_decay 0, momentum 0, centered false.
#pragma once

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct RmspropConfig {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0.0, momentum = 0.0;
  bool centered = false, maximize = false;
};

// k0 = alpha, k1 = momentum; option0 = momentum > 0, option1 = centered.
inline RuleStep rmsprop_step(const RmspropConfig& c, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::rmsprop;
  s.option0 = c.momentum > 0.0;
  s.option1 = c.centered;
  s.states = 1 + (s.option0 ? 1 : 0) + (s.option1 ? 1 : 0);
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.eps = static_cast<float>(c.eps);
  s.k0 = static_cast<float>(c.alpha);
  s.k1 = static_cast<float>(c.momentum);
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::rmsprop>(const RuleStep& k, float p, float g, float* s) {
  const float sq = k.k0 * s[0] + (1.0f - k.k0) * (g * g);
  s[0] = sq;
  float avg;
  if (k.option1) {
    float& ga = s[k.option0 ? 2 : 1];
    ga = rule_lerp(ga, g, 1.0f - k.k0);
    avg = rule_sqrt(sq - ga * ga) + k.eps;
  } else {
    avg = rule_sqrt(sq) + k.eps;
  }
  if (k.option0) {
    const float buf = k.k1 * s[1] + g / avg;
    s[1] = buf;
    return p - k.lr * buf;
  }
  return p - k.lr * (g / avg);
}

}  // namespace dstrain
