// LossScaler: DeepSpeed's loss scaling, step for step (docs/precision.md §2–§6, §8).
//
// Four behaviours, chosen by the factory from the fp16 / bf16 sections and the ZeRO stage:
//   dynamic_zero      fp16, loss_scale 0, ZeRO stage >= 1: DeepSpeed's DynamicLossScaler
//                     (fp16/loss_scaler.py): hysteresis, consecutive_hysteresis, and an Error on an
//                     overflow at min_loss_scale.
//   dynamic_non_zero  fp16, loss_scale 0, no ZeRO: FP16_Optimizer / FP16_UnfusedOptimizer's own
//                     _update_scale: halve / double only, no hysteresis, sticks at the minimum.
//   static_scale      fp16, loss_scale > 0: the scale never changes; an overflow still skips.
//   unscaled          bf16 / fp32: scale 1; what an inf/NaN gradient does is the OverflowPolicy.
//
// The dynamic update, called exactly once per optimizer step (docs/precision.md §4, §5):
//   if overflow:
//     ZeRO:     if hysteresis == 1 or cur_hysteresis == 1:
//                 if cur_scale == min_scale: Error("Current loss scale already at minimum ...")
//                 cur_scale = max(cur_scale / 2, min_scale)
//               else: cur_hysteresis -= 1
//     non-ZeRO: cur_scale = max(cur_scale / 2, min_scale)
//     last_overflow_iter = cur_iter
//   else:
//     ZeRO and consecutive_hysteresis: cur_hysteresis = hysteresis
//     stable = cur_iter - last_overflow_iter - 1
//     if stable > 0 and stable % window == 0:
//       ZeRO and not consecutive_hysteresis: cur_hysteresis = hysteresis
//       cur_scale *= 2
//   cur_iter += 1
// (DeepSpeed releases before the stable-interval fix tested (cur_iter - last_overflow_iter) %
// window == 0, which grows one update earlier; dstrain follows the v0.19 rule, docs/precision.md §4.)
//
// How the engine uses it (the "scale update precedes un-scaling" quirk, docs/precision.md §6): after the
// fused overflow + norm pass and its all-reduce,
//     const double s_used = scaler.scale();            // the scale the gradients carry
//     auto r = scaler.update(overflow, first_bad_layer);
//     if (r.skipped) { log(scaler.overflow_log_line(r, 0, first_bad_layer)); clear grads; }
//     else optimizer(grad_scale = 1 / unscale_clip_divisor(norm_sq, r.new_scale, clip));
// i.e. gradients are divided by the scale AFTER the update (on a growth step, 2x the scale that
// produced them), exactly as DeepSpeed's ZeRO and FP16 wrappers do; the logged global grad norm
// uses the old scale (sqrt(norm_sq) / r.old_scale).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "config_schema/precision_config.h"

namespace dstrain {

enum class LossScalerKind { dynamic_zero, dynamic_non_zero, static_scale, unscaled };

// What an inf/NaN gradient does where there is no loss scale to lower (bf16 / fp32).
enum class OverflowPolicy {
  skip,             // skip the step (bf16 at ZeRO 1/2 with bf16.check_grad_overflow, v0.19.3 default)
  ignore,           // no check: the update is applied (bf16 at ZeRO 3 / BF16_Optimizer; fp32)
  apply_but_count,  // non-ZeRO bf16 (FP16_Optimizer in bf16 mode, v0.17.6+): the update is
                    // applied, yet the engine counts the step as skipped and does not step the LR
};

// scale_reduced: the halving branch ran (non-ZeRO at the floor: old == new, as DeepSpeed logs it).
enum class ScaleEvent { none, hysteresis_consumed, scale_reduced, scale_increased };

struct LossScaleUpdate {
  bool skipped = false;              // the optimizer step is not applied (grads are cleared)
  bool count_skipped = false;        // engine: skipped_steps += 1 and no LR-schedule step (== skipped,
                                     // except OverflowPolicy::apply_but_count)
  double old_scale = 1.0;            // the scale the gradients of this step carry
  double new_scale = 1.0;            // the scale after the update (the one to un-scale by, see above)
  std::int64_t hysteresis_left = 0;  // cur_hysteresis after the update (ZeRO dynamic; else 0)
  ScaleEvent event = ScaleEvent::none;
  std::int64_t iteration = 0;  // cur_iter when the update ran (0-based count of updates before it)
};

// Everything a checkpoint needs to resume bit for bit. The other parameters come from the config.
struct LossScalerState {
  double cur_scale = 1.0;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = 0;
};

class LossScaler {
 public:
  // fp16 (fp16.enabled): dynamic (loss_scale == 0) or static; `zero` = ZeRO stage >= 1 picks the
  // DynamicLossScaler over the non-ZeRO wrappers' rule. Throws Error for values DeepSpeed rejects
  // when dynamic (loss_scale_window <= 0, min_loss_scale <= 0, initial_scale_power outside the
  // range of a double) and for a negative or non-finite loss_scale.
  static LossScaler fp16(const config::Fp16Config& fp16, bool zero);

  // bf16 / fp32: scale 1 with the given policy.
  static LossScaler unscaled(OverflowPolicy policy);

  // DeepSpeed's bf16 policy (docs/precision.md §8): ZeRO 1/2 through DeepSpeedZeroOptimizer checks iff
  // bf16.check_grad_overflow; ZeRO 3 and the BF16_Optimizer wrapper (ZeRO 1 with fp32
  // grad_accum_dtype and no CPU optimizer offload; pipeline) never check; no ZeRO (FP16_Optimizer
  // in bf16 mode) computes the flag but applies the update.
  static OverflowPolicy bf16_policy(const config::Bf16Config& bf16, int zero_stage, bool bf16_optimizer_wrapper);

  // The whole choice: fp16 if enabled, else bf16 if enabled, else fp32 (no overflow check: the
  // plain fp32 paths of DeepSpeed do not skip steps).
  static LossScaler create(const config::Fp16Config& fp16, const config::Bf16Config& bf16, int zero_stage, bool bf16_optimizer_wrapper = false);

  LossScalerKind kind() const { return kind_; }
  OverflowPolicy unscaled_policy() const { return policy_; }
  bool dynamic() const { return kind_ == LossScalerKind::dynamic_zero || kind_ == LossScalerKind::dynamic_non_zero; }

  // The scale the next backward multiplies the loss by.
  double scale() const { return state_.cur_scale; }

  // Once per optimizer step, with the overflow flag every rank agreed on. `first_overflow_layer`
  // (optional) names where the first inf/NaN gradient was found; it only enriches the Error
  // thrown when a ZeRO dynamic scale cannot go lower.
  LossScaleUpdate update(bool overflow, std::string_view first_overflow_layer = {});

  // The log text DeepSpeed prints for a skipped step (rank 0 only, as DeepSpeed), plus dstrain's
  // extra " First non-finite gradient in: <layer>." when `first_overflow_layer` is not empty.
  // Empty for a step that was not skipped. Multi-line texts are joined by '\n'.
  //   ZeRO dynamic: "[deepspeed] OVERFLOW! Rank R Skipping step. Attempted loss scale: A, reducing to B"
  //                 "... Attempted loss scale: A, but hysteresis is H. Reducing hysteresis to H-1"
  //   non-ZeRO dynamic: "Overflow detected. Skipping step. Attempted loss scale: A, reducing to B"
  //                 (numbers as Python prints them: int until the first halving, then float "32768.0")
  //   static (any stage): "Grad overflow on iteration: N\nUsing static loss scale of: S" (the
  //                 non-ZeRO wrappers' lines; DeepSpeed's ZeRO static scaler prints nothing)
  //   unscaled (bf16 / fp32): "[deepspeed] OVERFLOW! Rank R Skipping step."
  std::string overflow_log_line(const LossScaleUpdate& result, int rank = 0, std::string_view first_overflow_layer = {}) const;

  LossScalerState state() const { return state_; }
  // Restores a checkpointed state (validated: a positive finite scale, cur_iter >= 0,
  // last_overflow_iter in [-1, cur_iter)).
  void set_state(const LossScalerState& s);

  // Configured parameters (for logs and checks).
  double min_scale() const { return min_scale_; }
  std::int64_t hysteresis() const { return delayed_shift_; }
  bool consecutive_hysteresis() const { return consecutive_hysteresis_; }

 private:
  LossScaler() = default;

  LossScalerKind kind_ = LossScalerKind::unscaled;
  OverflowPolicy policy_ = OverflowPolicy::skip;
  LossScalerState state_;
  std::int64_t window_ = 1000;
  double min_scale_ = 1.0;
  std::int64_t delayed_shift_ = 1;
  bool consecutive_hysteresis_ = false;
  // The non-ZeRO wrappers keep cur_scale a Python int until the first halving turns it into a
  // float; only their log text shows the difference ("65536" vs "32768.0").
  bool python_int_scale_ = true;
  bool last_old_int_ = true;  // python_int_scale_ before the last update (the "Attempted" number)
};

std::string_view loss_scaler_kind_name(LossScalerKind k);
std::string_view scale_event_name(ScaleEvent e);

}  // namespace dstrain
