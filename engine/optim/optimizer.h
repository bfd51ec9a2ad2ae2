// Optimizer: the update rule of the config's "optimizer" block (docs/optimizers.md), applied to flat
// segments of the engine's buffers.
//
// Provided: "Adam" and "AdamW" (any case), "SGD" (torch.optim.SGD, ops/kernels/sgd.h: momentum in
// the segment's m buffer) and "Lamb" (DeepSpeed FusedLamb, ops/kernels/lamb.h: one trust ratio per
// parameter tensor, the segment's ranges). Decoupled weight decay (torch.optim.AdamW) when the type
// is AdamW or adam_w_mode is true (DeepSpeed's default, so "Adam" with weight_decay is AdamW);
// with "Adam" and "adam_w_mode": false, the L2 form of torch.optim.Adam: g += weight_decay·θ before
// the moments. bias_correction false drops both bias corrections (FusedAdam's option).
// Adagrad, Lion and the torch.optim fallbacks (RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop)
// are the element-wise rules of engine/optim/optimizer_rules.h (docs/optimizers.md). "Muon" is DeepSpeed's
// MuonWithAuxAdam (engine/optim/muon.h) and "Adafactor" torch.optim.Adafactor (engine/optim/adafactor.h): they
// need each parameter's name and shape (set_parameters).
// The 1-bit family is stepped by engine/optim/onebit_optimizer.h. Other types are an Error naming
// optimizer.type and the types available.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config_schema/optimizer_config.h"
#include "engine/optim/adafactor.h"
#include "engine/optim/muon.h"
#include "engine/optim/tensor_cut.h"
#include "ops/kernels/lamb.h"
#include "ops/tensor.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

// Stochastic rounding of the bf16 parameter copies (AdamW / Adam only; see AdamWConfig): off, or on
// with the run's seed (the bits of optimizer step t, layer l, element e are Philox(seed, t, l, e)).
struct StochasticRoundingOptions {
  bool enabled = false;
  std::uint64_t seed = 0;
};

class Optimizer {
 public:
  // Throws Error for a missing block or a type this engine does not provide.
  explicit Optimizer(const config::OptimizerConfig& config);

  double base_lr() const { return lr_; }  // optimizer.params.lr
  // ZeRO stages 1-3 on several ranks: tensors are split across ranks, so whole-tensor quantities
  // (Lamb's trust ratio) need every rank's partial sums (engine/optim/lamb_exact.h).
  void set_partitioned(bool partitioned) { partitioned_ = partitioned; }
  // The owned parameters in TensorPiece::tensor order: the per-tensor types (Lamb, Muon, Adafactor)
  // take their names, shapes and tensor-parallel cuts (engine/optim/tensor_cut.h) from here; the
  // element-wise types ignore them.
  void set_parameters(const std::vector<ParamSpec>& owned);
  // Muon: which owned tensors are Muon matrices, and their shapes (set_parameters does this).
  void set_muon_tensors(std::vector<MuonTensor> tensors) { muon_tensors_ = std::move(tensors); }
  // Muon: how the LR schedule reaches its two param groups. true: it writes one lr into every group
  // (DeepSpeed's WarmupLR, WarmupDecayLR, OneCycle, LRRangeTest), so the Adam group takes the step's
  // lr too; false (no schedule, WarmupCosineLR): each group keeps its own lr times the schedule's
  // ratio, adam_lr · lr / muon_lr.
  void set_schedule_sets_every_group(bool every) { schedule_sets_every_group_ = every; }
  std::pair<double, double> betas() const { return {beta1_, beta2_}; }  // optimizer.params.betas
  // Whether the type has betas (torch's param-group key "betas"): Adam, AdamW, Lamb, Lion, Adamax,
  // NAdam, RAdam. OneCycle cycles β1 only for these; for the others DeepSpeed disables
  // cycle_momentum with a warning.
  bool has_betas() const;
  // The per-element fp32 states this optimizer keeps, in order, with PyTorch's state_dict names
  // (docs/training_state.md §1): Adam / AdamW / Lamb {exp_avg, exp_avg_sq}; SGD {momentum_buffer}
  // with momentum, {} without; the element-wise rules' as docs/optimizers.md lists them. ModelStates
  // allocates exactly these; OptimizerSegment::states holds them in this order.
  std::vector<std::string> state_names() const;

  // One optimizer step over this rank's partition, sub-group by sub-group (update() on each).
  void step(OptimizerPartition& partition, double lr, float grad_scale, std::int64_t t, std::optional<std::pair<double, double>> betas = std::nullopt,
            StochasticRoundingOptions rounding = {}) const;

  // One update of every segment at learning rate `lr`, optimizer step t (1-based, for the bias
  // corrections and SGD's momentum start), with the gradients multiplied by grad_scale (the clip
  // coefficient, or 1 / DeepSpeed's un-scale and clip divisor under fp16) first.
  // `betas` replaces the optimizer's for this update (OneCycle's momentum cycling writes them into
  // the param groups; the bias corrections then use the new beta1^t, as torch's Adam does).
  // The L2 form (adam_w_mode false) overwrites the gradients of decayed segments with the
  // effective gradient grad_scale·g + weight_decay·θ (the engine zeroes them right after).
  void update(std::span<const OptimizerSegment> segments, double lr, float grad_scale, std::int64_t t,
              std::optional<std::pair<double, double>> betas = std::nullopt, StochasticRoundingOptions rounding = {}) const;

 private:
  // Lamb's step settings but its weight decay (whole-partition or per segment).
  LambConfig lamb_config(double lr, float grad_scale, std::int64_t t, std::pair<double, double> betas) const;

  config::OptimizerKind kind_ = config::OptimizerKind::adamw;
  config::OptimizerConfig config_;
  config::OptimizerParams p_;
  double lr_ = 1e-3, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0.0;
  bool decoupled_ = true;
  bool bias_correction_ = true;
  bool partitioned_ = false;
  std::vector<MuonTensor> muon_tensors_;
  std::vector<AdafactorTensor> adafactor_tensors_;
  std::vector<TensorCut> cuts_;  // Lamb: which owned tensors tensor parallelism cuts
  bool schedule_sets_every_group_ = false;
  mutable std::optional<bool> split_tensors_;  // Lamb: some tensor is cut into pieces, by ZeRO or tensor parallelism (found at the first step)
};

}  // namespace dstrain
