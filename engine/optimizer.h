// Optimizer: the update rule of the config's "optimizer" block (reference §4), applied to flat
// segments of the engine's buffers.
//
// Provided: "Adam" and "AdamW" (any case), "SGD" (torch.optim.SGD, ops/kernels/sgd.h: momentum in
// the segment's m buffer) and "Lamb" (DeepSpeed FusedLamb, ops/kernels/lamb.h: one trust ratio per
// parameter tensor, the segment's ranges). Decoupled weight decay (torch.optim.AdamW) when the type
// is AdamW or adam_w_mode is true (DeepSpeed's default, so "Adam" with weight_decay is AdamW);
// with "Adam" and "adam_w_mode": false, the L2 form of torch.optim.Adam: g += weight_decay·θ before
// the moments. bias_correction false drops both bias corrections (FusedAdam's option).
// Other types (Adagrad, OneBitAdam, ...) are an Error naming optimizer.type and the types available.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "config_schema/optimizer_config.h"
#include "ops/kernels/lamb.h"
#include "ops/tensor.h"

namespace dstrain {

// A contiguous run of parameters that share a weight-decay setting, with its gradient and Adam
// moments (the same number of elements; m and v start at zero). params, m, v are fp32; grads are
// fp32, or the 16-bit storage dtype under fp16 / bf16, where params is the fp32 master copy and
// params_lowp the 16-bit parameters the layers read (rewritten by the update in the same pass).
struct OptimizerSegment {
  Tensor params, grads, m, v;
  bool weight_decay = true;  // false: biases, LayerNorm weights (ParamSpec::weight_decay)
  Tensor params_lowp{};      // empty in fp32 training
  // The parameter tensors inside the segment (offsets from its start), for Lamb's per-tensor
  // trust ratio.
  std::vector<TensorRange> ranges{};
  // Where the segment's first element sits in the model: layer index and offset in that layer's
  // flat buffer (the same for any ZeRO split), numbering the stochastic rounding's random bits.
  std::uint32_t layer = 0;
  std::int64_t layer_offset = 0;
};

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
  std::pair<double, double> betas() const { return {beta1_, beta2_}; }  // optimizer.params.betas

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
  config::OptimizerKind kind_ = config::OptimizerKind::adamw;
  config::OptimizerParams p_;
  double lr_ = 1e-3, beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0.0;
  bool decoupled_ = true;
  bool bias_correction_ = true;
};

}  // namespace dstrain
