// The optimizer types whose update is an element-wise rule of ops/kernels/optimizer_rule.h
// (docs/optimizers.md): DeepSpeed's Adagrad and Lion and the torch.optim fallbacks RMSprop, Adamax,
// NAdam, RAdam, Adadelta, ASGD, Rprop. Optimizer (engine/optim/optimizer.h) asks here whether a type is
// one, which states it keeps, and for the RuleStep of each update.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_schema/optimizer_config.h"
#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain {

// The rule of `kind`, or nullopt for the types Optimizer implements itself (Adam, SGD, Lamb, ...).
std::optional<OptimizerRule> optimizer_rule_of(config::OptimizerKind kind);

// torch's constructor checks for the rule's params (Error naming optimizer.params.<key>).
void check_rule_params(const config::OptimizerConfig& config);

// The per-element states, with torch's state_dict names, in the kernel's order.
std::vector<std::string> rule_state_names(const config::OptimizerConfig& config);

// One update's RuleStep: `lr` (the schedule's), optimizer step t (1-based), the gradient
// multiplier, `betas` (the schedule's, for the types with betas), `decayed` (the segment's
// weight-decay flag: false leaves weight_decay out).
RuleStep rule_step(const config::OptimizerConfig& config, double lr, std::int64_t t, float grad_scale, std::pair<double, double> betas, bool decayed);

}  // namespace dstrain
