#include "engine/optim/optimizer_rules.h"

#include "ops/error.h"
#include "ops/kernels/adadelta.h"
#include "ops/kernels/adagrad.h"
#include "ops/kernels/adamax.h"
#include "ops/kernels/asgd.h"
#include "ops/kernels/lion.h"
#include "ops/kernels/nadam.h"
#include "ops/kernels/radam.h"
#include "ops/kernels/rmsprop.h"
#include "ops/kernels/rprop.h"

namespace dstrain {

using config::OptimizerKind;

std::optional<OptimizerRule> optimizer_rule_of(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adagrad:
      return OptimizerRule::adagrad;
    case OptimizerKind::lion:
      return OptimizerRule::lion;
    case OptimizerKind::rmsprop:
      return OptimizerRule::rmsprop;
    case OptimizerKind::adamax:
      return OptimizerRule::adamax;
    case OptimizerKind::nadam:
      return OptimizerRule::nadam;
    case OptimizerKind::radam:
      return OptimizerRule::radam;
    case OptimizerKind::adadelta:
      return OptimizerRule::adadelta;
    case OptimizerKind::asgd:
      return OptimizerRule::asgd;
    case OptimizerKind::rprop:
      return OptimizerRule::rprop;
    default:
      return std::nullopt;
  }
}

void check_rule_params(const config::OptimizerConfig& c) {
  const config::OptimizerParams& p = c.params;
  const std::string& type = c.type;
  // torch's constructor messages ("Invalid learning rate: ..."), with the key to change.
  auto at_least_zero = [&](const char* key, double v, const char* what) {
    if (!(v >= 0.0)) fail("optimizer.params.{}: {} — {} needs {} >= 0 (torch: \"Invalid {} value\")", key, v, type, key, what);
  };
  at_least_zero("lr", p.lr, "learning rate");
  switch (c.kind) {
    case OptimizerKind::adagrad:
      at_least_zero("lr_decay", p.lr_decay, "lr_decay");
      at_least_zero("initial_accumulator_value", p.initial_accumulator_value, "initial_accumulator_value");
      break;
    case OptimizerKind::rmsprop:
      at_least_zero("alpha", p.alpha, "alpha");
      break;
    case OptimizerKind::nadam:
      at_least_zero("momentum_decay", p.momentum_decay, "momentum_decay");
      break;
    case OptimizerKind::adadelta:
      if (!(p.rho >= 0.0 && p.rho <= 1.0)) fail("optimizer.params.rho: {} — Adadelta needs rho in [0, 1] (torch: \"Invalid rho value\")", p.rho);
      break;
    case OptimizerKind::rprop:
      if (!(0.0 < p.etas.first && p.etas.first < 1.0 && 1.0 < p.etas.second))
        fail("optimizer.params.etas: ({}, {}) — Rprop needs 0 < etaminus < 1 < etaplus (torch: \"Invalid eta values\")", p.etas.first, p.etas.second);
      break;
    default:
      break;
  }
}

std::vector<std::string> rule_state_names(const config::OptimizerConfig& c) {
  switch (c.kind) {
    case OptimizerKind::adagrad:
      return {"sum"};
    case OptimizerKind::lion:
      return {"exp_avg"};
    case OptimizerKind::rmsprop: {
      std::vector<std::string> names{"square_avg"};
      if (c.params.momentum > 0.0) names.emplace_back("momentum_buffer");
      if (c.params.centered) names.emplace_back("grad_avg");
      return names;
    }
    case OptimizerKind::adamax:
      return {"exp_avg", "exp_inf"};
    case OptimizerKind::nadam:
    case OptimizerKind::radam:
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::adadelta:
      return {"square_avg", "acc_delta"};
    case OptimizerKind::asgd:
      return {"ax"};
    case OptimizerKind::rprop:
      return {"prev", "step_size"};
    default:
      return {};
  }
}

RuleStep rule_step(const config::OptimizerConfig& c, double lr, std::int64_t t, float grad_scale, std::pair<double, double> betas, bool decayed) {
  const config::OptimizerParams& p = c.params;
  const double wd = decayed ? p.weight_decay : 0.0;
  switch (c.kind) {
    case OptimizerKind::adagrad:
      return adagrad_step({.lr = lr,
                           .lr_decay = p.lr_decay,
                           .weight_decay = wd,
                           .initial_accumulator_value = p.initial_accumulator_value,
                           .eps = p.eps,
                           .maximize = p.maximize},
                          t, grad_scale);
    case OptimizerKind::lion:
      return lion_step({.lr = lr, .beta1 = betas.first, .beta2 = betas.second, .weight_decay = wd}, grad_scale);
    case OptimizerKind::rmsprop:
      return rmsprop_step({.lr = lr,
                           .alpha = p.alpha,
                           .eps = p.eps,
                           .weight_decay = wd,
                           .momentum = p.momentum,
                           .centered = p.centered,
                           .maximize = p.maximize},
                          grad_scale);
    case OptimizerKind::adamax:
      return adamax_step({.lr = lr, .beta1 = betas.first, .beta2 = betas.second, .eps = p.eps, .weight_decay = wd, .maximize = p.maximize}, t,
                         grad_scale);
    case OptimizerKind::nadam:
      return nadam_step({.lr = lr,
                         .beta1 = betas.first,
                         .beta2 = betas.second,
                         .eps = p.eps,
                         .weight_decay = wd,
                         .momentum_decay = p.momentum_decay,
                         .decoupled_weight_decay = p.decoupled_weight_decay,
                         .maximize = p.maximize},
                        t, grad_scale);
    case OptimizerKind::radam:
      return radam_step({.lr = lr,
                         .beta1 = betas.first,
                         .beta2 = betas.second,
                         .eps = p.eps,
                         .weight_decay = wd,
                         .decoupled_weight_decay = p.decoupled_weight_decay,
                         .maximize = p.maximize},
                        t, grad_scale);
    case OptimizerKind::adadelta:
      return adadelta_step({.lr = lr, .rho = p.rho, .eps = p.eps, .weight_decay = wd, .maximize = p.maximize}, grad_scale);
    case OptimizerKind::asgd:
      return asgd_step({.lr = lr, .lambd = p.lambd, .alpha = p.alpha, .t0 = p.t0, .weight_decay = wd, .maximize = p.maximize}, t, grad_scale);
    case OptimizerKind::rprop:
      return rprop_step({.lr = lr,
                         .etaminus = p.etas.first,
                         .etaplus = p.etas.second,
                         .step_min = p.step_sizes.first,
                         .step_max = p.step_sizes.second,
                         .maximize = p.maximize},
                        t, grad_scale);
    default:
      fail("optimizer.type \"{}\" is not an element-wise rule", c.type);
  }
}

}  // namespace dstrain
