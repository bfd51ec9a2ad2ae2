// optimizer: docs/optimizers.md. Regime A in DeepSpeed, but `params` are constructor kwargs, so for the
// optimizers dstrain implements an unknown parameter name is an error (DeepSpeed: TypeError).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "config_schema/auto_values.h"
#include "config_schema/field_spec.h"
#include "config_schema/onebit_params.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

enum class OptimizerKind {
  none,           // no optimizer section
  adam,           // "Adam" (any case): AdamW unless adam_w_mode is false
  adamw,          // "AdamW" (any case)
  sgd,            // "SGD" (torch.optim, case-sensitive)
  lamb,           // "Lamb" (any case)
  onebit_adam,    // "OneBitAdam" (any case): DeepSpeed's 1-bit Adam (docs/optimizers_onebit.md)
  zero_one_adam,  // "ZeroOneAdam" (any case): 0/1 Adam
  onebit_lamb,    // "OneBitLamb" (any case): 1-bit LAMB
  // docs/optimizers.md: DeepSpeed's Adagrad (torch.optim.Adagrad without offload) and Lion
  // (FusedLion), any case; the torch.optim fallbacks, case-sensitive as getattr(torch.optim, name).
  adagrad,      // "Adagrad"
  lion,         // "Lion"
  rmsprop,      // "RMSprop"
  adamax,       // "Adamax"
  nadam,        // "NAdam"
  radam,        // "RAdam"
  adadelta,     // "Adadelta"
  asgd,         // "ASGD"
  rprop,        // "Rprop"
  muon,         // "Muon" (any case): DeepSpeed's MuonWithAuxAdam (docs/optimizers.md §9)
  adafactor,    // "Adafactor": torch.optim.Adafactor (torch >= 2.5; docs/optimizers.md §10)
  unsupported,  // a type DeepSpeed knows that dstrain does not provide (OneBitAdam, Adagrad, RMSprop, ...)
};

// Typed optimizer parameters with DeepSpeed's / torch's constructor defaults. Fields that the
// chosen type does not take keep their defaults and are not written by to_json().
struct OptimizerParams {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};  // Adam, AdamW, Lamb
  double eps = 1e-8;                            // Adam, AdamW, Lamb
  double weight_decay = 0.0;
  bool bias_correction = true;        // Adam, AdamW, Lamb
  bool adam_w_mode = true;            // Adam/AdamW: decoupled weight decay
  bool torch_adam = false;            // Adam/AdamW: use torch's implementation
  bool fp32_optimizer_states = true;  // Adam/AdamW with CPU offload
  bool amsgrad = false;               // must stay false (FusedAdam/FusedLamb raise)
  double max_coeff = 10.0;            // Lamb trust-ratio clamp
  double min_coeff = 0.01;            // Lamb
  bool eps_inside_sqrt = false;       // Lamb
  double momentum = 0.0;              // SGD
  double dampening = 0.0;             // SGD
  bool nesterov = false;              // SGD
  bool maximize = false;              // SGD and the torch.optim types that take it
  // The torch.optim types of docs/optimizers.md; each type's own defaults replace these (lr, eps, alpha).
  double lr_decay = 0.0;                             // Adagrad
  double initial_accumulator_value = 0.0;            // Adagrad
  double alpha = 0.99;                               // RMSprop (ASGD: 0.75)
  bool centered = false;                             // RMSprop
  double momentum_decay = 4e-3;                      // NAdam
  bool decoupled_weight_decay = false;               // NAdam, RAdam
  double rho = 0.9;                                  // Adadelta
  double lambd = 1e-4;                               // ASGD
  double t0 = 1e6;                                   // ASGD
  std::pair<double, double> etas{0.5, 1.2};          // Rprop
  std::pair<double, double> step_sizes{1e-6, 50.0};  // Rprop
  // Muon (MuonWithAuxAdam): `lr` is the Muon matrices' lr (muon_lr, else lr, else 0.02), `momentum`
  // their momentum (0.95); the other parameters take Adam with adam_lr (adam_lr, else lr, else 3e-4),
  // `betas` (0.9, 0.95) and `eps` (1e-10); `weight_decay` is both groups'.
  double adam_lr = 3e-4;
  std::string ns_method = "gram";  // Muon: "gram" or "standard" (the same function)
  // Adafactor (torch.optim.Adafactor): beta2_decay, eps = (eps1, eps2) with eps1 None = the fp32
  // machine epsilon, d the update clipping threshold.
  double beta2_decay = -0.8;
  std::optional<double> eps1{};
  double eps2 = 1e-3;
  double clip_threshold = 1.0;  // "d"
};

// OneBitAdam, ZeroOneAdam, OneBitLamb: the optimizers that communicate in their step.
inline bool is_onebit_kind(OptimizerKind k) {
  return k == OptimizerKind::onebit_adam || k == OptimizerKind::zero_one_adam || k == OptimizerKind::onebit_lamb;
}

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::none;
  std::string type;  // as written in the config
  OptimizerParams params;
  OneBitParams onebit;               // the 1-bit family's own keys
  Json raw_params = Json::object();  // params as given (for unsupported types: all we keep)
  bool legacy_fusion = false;

  bool present() const { return kind != OptimizerKind::none; }
  bool is_onebit() const { return is_onebit_kind(kind); }
  // On ZeRO's list of tested optimizers (DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS: FusedAdam /
  // torch Adam, AdamW, Adagrad, Lion, MuonWithAuxAdam); any other type at stage >= 1 needs zero_allow_untested_optimizer.
  bool zero_tested() const {
    return kind == OptimizerKind::adam || kind == OptimizerKind::adamw || kind == OptimizerKind::adagrad || kind == OptimizerKind::lion ||
           kind == OptimizerKind::muon;  // zero/utils.py appends MuonWithAuxAdam to the list
  }
  // DeepSpeed: decoupled weight decay iff type is AdamW or adam_w_mode (default true) — so "Adam"
  // with weight decay behaves as AdamW unless "adam_w_mode": false.
  bool decoupled_weight_decay() const { return kind == OptimizerKind::adamw || (kind == OptimizerKind::adam && params.adam_w_mode); }
};

// Why DeepSpeed itself fails with an optimizer it builds when the model is a dense transformer
// without μP base shapes (docs/optimizers.md §10) — SparseAdam, LBFGS, MuAdam, MuAdamW, MuSGD —
// with the fix; nullopt for any other type. The engine refuses these types with this reason.
std::optional<std::string> deepspeed_failure_reason(const OptimizerConfig& config);

SectionSpec optimizer_section_spec();
SectionSpec optimizer_params_section_spec();  // union of the params of every type dstrain provides

OptimizerConfig parse_optimizer_config(const Json* value, ParseContext& ctx, Json& resolved);

// The Hugging Face Trainer's default optimizer, as the "optimizer" block a config would hold:
// torch.optim.AdamW ("adamw_torch") with TrainingArguments' defaults learning_rate 5e-5,
// adam_beta1 0.9, adam_beta2 0.999, adam_epsilon 1e-8, weight_decay 0.0, each replaced by the
// value `autos` gives (lr, betas, eps, weight_decay: the --lr, --adam-beta1/--adam-beta2 or
// --adam-betas, --adam-eps, --weight-decay flags). Error naming the flag for a value torch.optim.AdamW
// refuses (lr, eps, weight_decay < 0; a beta outside [0, 1)).
Json default_optimizer_block(const AutoValues& autos);

}  // namespace dstrain::config
