#include "engine/optim/optimizer.h"

#include "engine/optim/lamb_exact.h"
#include "engine/optim/onebit_optimizer.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "ops/error.h"
#include "ops/kernels/adamw.h"
#include "engine/optim/optimizer_rules.h"
#include "ops/kernels/lamb.h"
#include "ops/kernels/optimizer_rule.h"
#include "ops/kernels/sgd.h"
#include "models/layer.h"  // kRngSitesPerLayer

namespace dstrain {

Optimizer::Optimizer(const config::OptimizerConfig& config) {
  using config::OptimizerKind;
  switch (config.kind) {
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::sgd:
    case OptimizerKind::lamb:
    case OptimizerKind::onebit_adam:    // stepped by OneBitOptimizer (engine/optim/onebit_optimizer.h), which
    case OptimizerKind::zero_one_adam:  // communicates; this object gives their lr, betas and states
    case OptimizerKind::onebit_lamb:
      break;
    case OptimizerKind::adagrad:
    case OptimizerKind::lion:
    case OptimizerKind::rmsprop:
    case OptimizerKind::adamax:
    case OptimizerKind::nadam:
    case OptimizerKind::radam:
    case OptimizerKind::adadelta:
    case OptimizerKind::asgd:
    case OptimizerKind::rprop:
      check_rule_params(config);  // the element-wise rules (engine/optim/optimizer_rules.h)
      break;
    case OptimizerKind::none:
      fail(
          "optimizer: the config has no \"optimizer\" block, so there is nothing to train with; add one, e.g. "
          "\"optimizer\": {{\"type\": \"AdamW\", \"params\": {{\"lr\": 1e-3, \"weight_decay\": 0.1}}}}, or pass the program's own "
          "(config::ConfigOptions::client_optimizer, TrainerOptions::optimizer) or the default AdamW "
          "(ConfigOptions::default_optimizer = config::default_optimizer_block(autos), as dstrain train does)");
    case OptimizerKind::muon:
    case OptimizerKind::adafactor:
      break;
    default:
      // SparseAdam, LBFGS and mup's optimizers: DeepSpeed builds them and then fails (docs/optimizers.md §10).
      if (const auto reason = config::deepspeed_failure_reason(config)) fail("{}", *reason);
      fail(
          "optimizer.type: \"{}\" is not an optimizer this build of dstrain trains with; the types available are "
          "\"Adam\", \"AdamW\" (with \"adam_w_mode\": false, \"Adam\" is Adam with L2 weight decay), \"SGD\", \"Lamb\", \"Adagrad\", "
          "\"Lion\", \"Muon\", \"RMSprop\", \"Adamax\", \"NAdam\", \"RAdam\", \"Adadelta\", \"ASGD\", \"Rprop\", \"Adafactor\" and the 1-bit family "
          "(docs/optimizers.md)",
          config.type);
  }
  const config::OptimizerParams& p = config.params;
  kind_ = config.kind;
  p_ = p;
  config_ = config;
  if (kind_ == OptimizerKind::sgd) {
    // torch.optim.SGD's constructor checks.
    if (p.lr < 0.0) fail("optimizer.params.lr: {} — SGD needs lr >= 0", p.lr);
    if (p.momentum < 0.0) fail("optimizer.params.momentum: {} — SGD needs momentum >= 0", p.momentum);
    if (p.weight_decay < 0.0) fail("optimizer.params.weight_decay: {} — SGD needs weight_decay >= 0", p.weight_decay);
    if (p.nesterov && (p.momentum <= 0.0 || p.dampening != 0.0)) {
      fail("optimizer.params.nesterov: true needs momentum > 0 and dampening 0 (got momentum {}, dampening {}), as torch.optim.SGD", p.momentum,
           p.dampening);
    }
  }
  if (p.amsgrad) fail("optimizer.params.amsgrad: true is rejected, as DeepSpeed's FusedAdam rejects it; remove it or set it to false");
  lr_ = p.lr;
  beta1_ = p.betas.first;
  beta2_ = p.betas.second;
  eps_ = p.eps;
  weight_decay_ = p.weight_decay;
  decoupled_ = config.decoupled_weight_decay();
  bias_correction_ = p.bias_correction;
}

bool Optimizer::has_betas() const {
  using config::OptimizerKind;
  switch (kind_) {
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
    case OptimizerKind::lamb:
    case OptimizerKind::lion:
    case OptimizerKind::adamax:
    case OptimizerKind::nadam:
    case OptimizerKind::radam:
      return true;
    default:
      return false;
  }
}

std::vector<std::string> Optimizer::state_names() const {
  if (optimizer_rule_of(kind_)) return rule_state_names(config_);
  if (kind_ == config::OptimizerKind::sgd) return p_.momentum != 0.0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  if (config::is_onebit_kind(kind_)) return OneBitOptimizer::state_names(kind_);
  if (kind_ == config::OptimizerKind::adafactor) return {"row_var", "col_var"};  // engine/optim/adafactor.h
  // Muon: Adam's two states on every element; a Muon matrix keeps its momentum_buffer in the first
  // and leaves the second at zero (engine/optim/muon.h).
  return {"exp_avg", "exp_avg_sq"};
}

void Optimizer::set_parameters(const std::vector<ParamSpec>& owned) {
  muon_tensors_.clear();
  adafactor_tensors_.clear();
  cuts_.clear();
  if (kind_ == config::OptimizerKind::lamb)
    for (const ParamSpec& ps : owned) cuts_.push_back(tensor_cut_of(ps));
  if (kind_ == config::OptimizerKind::muon)
    for (const ParamSpec& ps : owned) muon_tensors_.push_back(muon_tensor_of(ps));
  if (kind_ == config::OptimizerKind::adafactor)
    for (const ParamSpec& ps : owned) adafactor_tensors_.push_back(adafactor_tensor_of(ps));
}

void Optimizer::step(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t, std::optional<std::pair<double, double>> betas,
                     StochasticRoundingOptions rounding) const {
  if (kind_ == config::OptimizerKind::muon) {
    DSTRAIN_CHECK(!muon_tensors_.empty() || partition.tensor_count() == 0, "Optimizer::step: Muon needs set_muon_tensors() first");
    MuonStepConfig c;
    c.lr = lr;
    // The Adam group's lr (set_schedule_sets_every_group); lr / lr_ is exactly 1 without a schedule.
    c.adam_lr = schedule_sets_every_group_ ? lr : lr_ != 0.0 ? p_.adam_lr * (lr / lr_) : p_.adam_lr;
    c.momentum = p_.momentum;
    c.weight_decay = weight_decay_;
    c.beta1 = beta1_;
    c.beta2 = beta2_;
    c.eps = eps_;
    c.step = t;
    c.grad_scale = grad_scale;
    c.partitioned = partitioned_;
    muon_step(partition, muon_tensors_, c);
    return;
  }
  if (kind_ == config::OptimizerKind::adafactor) {
    DSTRAIN_CHECK(!adafactor_tensors_.empty() || partition.tensor_count() == 0, "Optimizer::step: Adafactor needs set_parameters() first");
    AdafactorStepConfig c;
    c.lr = lr;
    c.beta2_decay = p_.beta2_decay;
    c.eps1 = p_.eps1;
    c.eps2 = p_.eps2;
    c.d = p_.clip_threshold;
    c.weight_decay = weight_decay_;
    c.maximize = p_.maximize;
    c.step = t;
    c.grad_scale = grad_scale;
    adafactor_step(partition, adafactor_tensors_, c);
    return;
  }
  if (kind_ == config::OptimizerKind::lamb && !split_tensors_)  // the layout is fixed
    split_tensors_ = partitioned_ || partition.tensor_parallel_size() > 1 || has_split_tensors(partition);
  if (kind_ == config::OptimizerKind::lamb && *split_tensors_) {
    // Tensors cut by ZeRO's partitions, by sub-groups or by tensor parallelism: the trust ratios from
    // the whole tensors' norms, the pieces' partial sums all-reduced (engine/optim/lamb_exact.h).
    LambConfig c = lamb_config(lr, grad_scale, t, betas.value_or(std::pair{beta1_, beta2_}));
    c.weight_decay = static_cast<float>(weight_decay_);
    lamb_step_exact(partition, c, cuts_);
    return;
  }
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) { update(segments, lr, grad_scale, t, betas, rounding); });
}

LambConfig Optimizer::lamb_config(double lr, float grad_scale, std::int64_t t, std::pair<double, double> betas) const {
  LambConfig c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(betas.first);
  c.beta2 = static_cast<float>(betas.second);
  c.eps = static_cast<float>(eps_);
  c.max_coeff = static_cast<float>(p_.max_coeff);
  c.min_coeff = static_cast<float>(p_.min_coeff);
  c.bias_correction = bias_correction_;
  c.eps_inside_sqrt = p_.eps_inside_sqrt;
  c.step = t;
  c.grad_scale = grad_scale;
  return c;  // weight_decay: the caller's, per segment
}

void Optimizer::update(std::span<const OptimizerSegment> segments, double lr, float grad_scale, std::int64_t t,
                       std::optional<std::pair<double, double>> betas, StochasticRoundingOptions rounding) const {
  const auto [beta1, beta2] = betas.value_or(std::pair{beta1_, beta2_});
  DSTRAIN_CHECK(!config::is_onebit_kind(kind_),
                "Optimizer::update: the 1-bit optimizers communicate in their step; the engine "
                "steps them through OneBitOptimizer");
  DSTRAIN_CHECK(kind_ != config::OptimizerKind::muon && kind_ != config::OptimizerKind::adafactor,
                "Optimizer::update: Muon and Adafactor need whole-tensor quantities across sub-groups and ranks; call Optimizer::step");
  if (optimizer_rule_of(kind_)) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      optimizer_rule_update(rule_step(config_, lr, t, grad_scale, {beta1, beta2}, s.weight_decay), s.params, s.grads, s.states, s.params_lowp);
    }
    return;
  }
  if (kind_ == config::OptimizerKind::sgd) {
    SgdConfig c;
    c.lr = static_cast<float>(lr);
    c.momentum = static_cast<float>(p_.momentum);
    c.dampening = static_cast<float>(p_.dampening);
    c.nesterov = p_.nesterov;
    c.maximize = p_.maximize;
    c.step = t;
    c.grad_scale = grad_scale;
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      c.weight_decay = s.weight_decay ? static_cast<float>(weight_decay_) : 0.0f;
      // The momentum buffer is the segment's m (torch keeps none without momentum).
      sgd_update(s.params, s.grads, p_.momentum != 0.0 ? s.states[0] : Tensor{}, s.params_lowp, c);
    }
    return;
  }
  if (kind_ == config::OptimizerKind::lamb) {
    LambConfig c = lamb_config(lr, grad_scale, t, {beta1, beta2});
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      c.weight_decay = s.weight_decay ? static_cast<float>(weight_decay_) : 0.0f;
      // Whole tensors only (step() takes the exact path otherwise), so each piece is a tensor.
      std::vector<TensorRange> ranges;
      for (const TensorPiece& p : s.pieces) ranges.push_back({p.offset, p.numel});
      lamb_update(s.params, s.grads, s.states[0], s.states[1], s.params_lowp, ranges, Tensor{}, c);
    }
    return;
  }
  AdamWConfig c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.eps = static_cast<float>(eps_);
  c.step = t;
  c.bias_correction = bias_correction_;
  for (const OptimizerSegment& s : segments) {
    if (s.params.numel() == 0) continue;
    const bool decay = s.weight_decay && weight_decay_ != 0.0;
    c.decoupled_weight_decay = true;
    if (decay && !decoupled_) {
      // Adam with L2 (torch.optim.Adam): the kernel's coupled form adds weight_decay·θ (the fp32
      // master) to grad·grad_scale, on the clipped gradient, in its own pass over the buffer.
      c.weight_decay = static_cast<float>(weight_decay_);
      c.grad_scale = grad_scale;
      c.decoupled_weight_decay = false;
    } else {
      c.weight_decay = decay ? static_cast<float>(weight_decay_) : 0.0f;
      c.grad_scale = grad_scale;
    }
    c.stochastic_rounding = rounding.enabled;
    // A site past the layer's dropout sites (kRngSitesPerLayer), so no dropout mask shares these
    // bits; the step is the optimizer's t, so a skipped step does not shift the steps after it.
    c.rounding_key = RngKey{rounding.seed, static_cast<std::uint32_t>(t), s.layer, 0, kRngSitesPerLayer};
    c.rounding_offset = s.layer_offset;
    adamw_update(s.params, s.grads, s.states[0], s.states[1], s.params_lowp, c);
  }
}

}  // namespace dstrain
