// Adagrad: DeepSpeed's "Adagrad" without offload is torch.optim.Adagrad (torch/optim/adagrad.py,
// _single_tensor_adagrad). State: sum (torch's state_dict name), initial_accumulator_value at t = 1.
//   g   = grad·scale (+ weight_decay·θ)
//   clr = lr / (1 + (t − 1)·lr_decay)
//   sum = sum + g²
//   θ   = θ − clr · g / (sqrt(sum) + eps)
// Defaults (torch): lr 1e-2, lr_decay 0, weight_decay 0, initial_accumulator_value 0, eps 1e-10.
#pragma once

#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

struct AdagradConfig {
  double lr = 1e-2, lr_decay = 0.0, weight_decay = 0.0, initial_accumulator_value = 0.0, eps = 1e-10;
  bool maximize = false;
};

// k0 = clr, k1 = initial_accumulator_value.
inline RuleStep adagrad_step(const AdagradConfig& c, std::int64_t t, float grad_scale) {
  RuleStep s;
  s.rule = OptimizerRule::adagrad;
  s.states = 1;
  s.first = t == 1;
  s.lr = static_cast<float>(c.lr);
  s.grad_scale = c.maximize ? -grad_scale : grad_scale;
  s.weight_decay = static_cast<float>(c.weight_decay);
  s.eps = static_cast<float>(c.eps);
  s.k0 = static_cast<float>(c.lr / (1.0 + static_cast<double>(t - 1) * c.lr_decay));
  s.k1 = static_cast<float>(c.initial_accumulator_value);
  return s;
}

template <>
DSTRAIN_HOST_DEVICE inline float rule_element<OptimizerRule::adagrad>(const RuleStep& k, float p, float g, float* s) {
  const float sum = (k.first ? k.k1 : s[0]) + g * g;
  s[0] = sum;
  return p - k.k0 * (g / (rule_sqrt(sum) + k.eps));
}

}  // namespace dstrain
