// LossScaler: the update rules of engine/loss_scaler.h, with DeepSpeed's log texts and errors.
#include "engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

// Python's int(x) of a float, as DeepSpeed's ZeRO log prints it: truncated, every digit.
std::string py_int(double x) { return fmt::format("{:.0f}", std::trunc(x)); }

// Python's repr of a float: "32768.0", and exponent notation from 1e16 on ("1.8446744073709552e+19").
std::string py_float(double x) {
  if (std::isfinite(x) && x == std::trunc(x) && std::fabs(x) < 1e16) return fmt::format("{:.0f}.0", x);
  return fmt::format("{}", x);
}

std::string with_layer(std::string line, std::string_view layer) {
  if (!layer.empty()) line += fmt::format(" First non-finite gradient in: {}.", layer);
  return line;
}

}  // namespace

std::string_view loss_scaler_kind_name(LossScalerKind k) {
  switch (k) {
    case LossScalerKind::dynamic_zero:
      return "dynamic (ZeRO DynamicLossScaler)";
    case LossScalerKind::dynamic_non_zero:
      return "dynamic (non-ZeRO FP16 optimizer)";
    case LossScalerKind::static_scale:
      return "static";
    case LossScalerKind::unscaled:
      return "unscaled";
  }
  return "?";
}

std::string_view scale_event_name(ScaleEvent e) {
  switch (e) {
    case ScaleEvent::none:
      return "none";
    case ScaleEvent::hysteresis_consumed:
      return "hysteresis_consumed";
    case ScaleEvent::scale_reduced:
      return "scale_reduced";
    case ScaleEvent::scale_increased:
      return "scale_increased";
  }
  return "?";
}

LossScaler LossScaler::fp16(const config::Fp16Config& c, bool zero) {
  LossScaler s;
  if (!std::isfinite(c.loss_scale) || c.loss_scale < 0) {
    fail("fp16.loss_scale = {} is not a finite number >= 0; use 0 for dynamic loss scaling or a positive static scale", c.loss_scale);
  }
  if (!c.dynamic()) {
    // DeepSpeed: ZeRO wraps the value in LossScaler(loss_scale); the non-ZeRO wrappers keep
    // cur_scale = loss_scale. Either way it never changes.
    s.kind_ = LossScalerKind::static_scale;
    s.state_.cur_scale = c.loss_scale;
    s.python_int_scale_ = false;  // a pydantic float
    return s;
  }
  if (c.loss_scale_window <= 0) {
    fail(
        "fp16.loss_scale_window = {} but dynamic loss scaling needs a window > 0 (clean steps before the scale doubles); "
        "set it to a positive integer (default 1000)",
        c.loss_scale_window);
  }
  if (c.min_loss_scale <= 0) {
    fail("fp16.min_loss_scale = {} but dynamic loss scaling needs a floor > 0; set it to a positive integer (default 1)", c.min_loss_scale);
  }
  // 2^power must be a finite double; DeepSpeed would compute a Python int of any size, but the
  // scale multiplies an fp32 loss, where anything beyond 2^127 is inf anyway.
  if (c.initial_scale_power < -1000 || c.initial_scale_power > 1000) {
    fail("fp16.initial_scale_power = {} is out of range; the initial scale is 2^power (default 16); use a value in [0, 64]", c.initial_scale_power);
  }
  s.kind_ = zero ? LossScalerKind::dynamic_zero : LossScalerKind::dynamic_non_zero;
  s.state_.cur_scale = std::ldexp(1.0, static_cast<int>(c.initial_scale_power));
  s.python_int_scale_ = c.initial_scale_power >= 0;  // 2 ** power is a Python int for power >= 0
  s.window_ = c.loss_scale_window;
  s.min_scale_ = static_cast<double>(c.min_loss_scale);
  // Hysteresis and its refill belong to the ZeRO DynamicLossScaler only (docs/precision.md §5).
  s.delayed_shift_ = zero ? c.hysteresis : 1;
  s.consecutive_hysteresis_ = zero && c.consecutive_hysteresis;
  s.state_.cur_hysteresis = s.delayed_shift_;
  return s;
}

LossScaler LossScaler::unscaled(OverflowPolicy policy) {
  LossScaler s;
  s.kind_ = LossScalerKind::unscaled;
  s.policy_ = policy;
  s.state_.cur_scale = 1.0;
  s.python_int_scale_ = false;
  return s;
}

OverflowPolicy LossScaler::bf16_policy(const config::Bf16Config& bf16, int zero_stage, bool bf16_optimizer_wrapper) {
  if (bf16_optimizer_wrapper) return OverflowPolicy::ignore;
  if (zero_stage == 0) return OverflowPolicy::apply_but_count;
  if (zero_stage >= 3) return OverflowPolicy::ignore;
  return bf16.check_grad_overflow ? OverflowPolicy::skip : OverflowPolicy::ignore;
}

LossScaler LossScaler::create(const config::Fp16Config& fp16c, const config::Bf16Config& bf16, int zero_stage, bool bf16_optimizer_wrapper) {
  if (fp16c.enabled && bf16.enabled) {
    fail(
        "fp16.enabled and {}.enabled are both true; DeepSpeed rejects this ('bfloat16 and fp16 modes cannot be simultaneously "
        "enabled'): enable one of them",
        bf16.source_key);
  }
  if (fp16c.enabled) return fp16(fp16c, zero_stage >= 1);
  if (bf16.enabled) return unscaled(bf16_policy(bf16, zero_stage, bf16_optimizer_wrapper));
  return unscaled(OverflowPolicy::ignore);
}

LossScaleUpdate LossScaler::update(bool overflow, std::string_view first_overflow_layer) {
  LossScaleUpdate r;
  r.old_scale = state_.cur_scale;
  r.iteration = state_.cur_iter;
  last_old_int_ = python_int_scale_;

  switch (kind_) {
    case LossScalerKind::unscaled:
      r.skipped = overflow && policy_ == OverflowPolicy::skip;
      r.count_skipped = overflow && policy_ != OverflowPolicy::ignore;
      if (r.count_skipped) state_.last_overflow_iter = state_.cur_iter;
      state_.cur_iter += 1;
      break;

    case LossScalerKind::static_scale:
      // FP16_Optimizer counts iterations for its "Grad overflow on iteration: N" line.
      r.skipped = r.count_skipped = overflow;
      if (overflow) state_.last_overflow_iter = state_.cur_iter;
      state_.cur_iter += 1;
      break;

    case LossScalerKind::dynamic_zero:
      r.skipped = r.count_skipped = overflow;
      if (overflow) {
        if (delayed_shift_ == 1 || state_.cur_hysteresis == 1) {
          if (state_.cur_scale == min_scale_) {
            // DeepSpeed's message first (users search for it), then what to do about it.
            fail(
                "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run. "
                "(fp16 gradients overflowed at update {} with the loss scale at fp16.min_loss_scale = {}{}.) "
                "Fix: train in bf16 (\"bf16\": {{\"enabled\": true}}), above all for a model pre-trained in bf16; "
                "or lower the learning rate; or enable gradient clipping (\"gradient_clipping\": 1.0); "
                "or lower fp16.min_loss_scale.",
                state_.cur_iter, py_int(min_scale_),
                first_overflow_layer.empty() ? std::string() : fmt::format("; first non-finite gradient in {}", first_overflow_layer));
          }
          state_.cur_scale = std::max(state_.cur_scale / 2.0, min_scale_);
          r.event = ScaleEvent::scale_reduced;
        } else {
          state_.cur_hysteresis -= 1;
          r.event = ScaleEvent::hysteresis_consumed;
        }
        state_.last_overflow_iter = state_.cur_iter;
      } else {
        if (consecutive_hysteresis_) state_.cur_hysteresis = delayed_shift_;
        const std::int64_t stable = state_.cur_iter - state_.last_overflow_iter - 1;
        if (stable > 0 && stable % window_ == 0) {
          if (!consecutive_hysteresis_) state_.cur_hysteresis = delayed_shift_;
          state_.cur_scale *= 2.0;
          r.event = ScaleEvent::scale_increased;
        }
      }
      state_.cur_iter += 1;
      r.hysteresis_left = state_.cur_hysteresis;
      break;

    case LossScalerKind::dynamic_non_zero:
      r.skipped = r.count_skipped = overflow;
      if (overflow) {
        const double half = state_.cur_scale / 2.0;
        // Python's max(cur / 2, min): the float half when >= min, else the int min.
        python_int_scale_ = !(half >= min_scale_);
        state_.cur_scale = std::max(half, min_scale_);
        state_.last_overflow_iter = state_.cur_iter;
        r.event = ScaleEvent::scale_reduced;
      } else {
        const std::int64_t stable = state_.cur_iter - state_.last_overflow_iter - 1;
        if (stable > 0 && stable % window_ == 0) {
          state_.cur_scale *= 2.0;
          r.event = ScaleEvent::scale_increased;
        }
      }
      state_.cur_iter += 1;
      break;
  }
  r.new_scale = state_.cur_scale;
  return r;
}

std::string LossScaler::overflow_log_line(const LossScaleUpdate& r, int rank, std::string_view layer) const {
  if (!r.count_skipped) return {};
  const std::string head = fmt::format("[deepspeed] OVERFLOW! Rank {} Skipping step.", rank);
  switch (kind_) {
    case LossScalerKind::dynamic_zero:
      if (r.event == ScaleEvent::hysteresis_consumed) {
        return with_layer(fmt::format("{} Attempted loss scale: {}, but hysteresis is {}. Reducing hysteresis to {}", head, py_int(r.old_scale),
                                      r.hysteresis_left + 1, r.hysteresis_left),
                          layer);
      }
      return with_layer(fmt::format("{} Attempted loss scale: {}, reducing to {}", head, py_int(r.old_scale), py_int(r.new_scale)), layer);
    case LossScalerKind::dynamic_non_zero: {
      const std::string a = last_old_int_ ? py_int(r.old_scale) : py_float(r.old_scale);
      const std::string b = python_int_scale_ ? py_int(r.new_scale) : py_float(r.new_scale);
      return with_layer(fmt::format("Overflow detected. Skipping step. Attempted loss scale: {}, reducing to {}", a, b), layer);
    }
    case LossScalerKind::static_scale:
      // The non-ZeRO wrappers' two lines; DeepSpeed's ZeRO static scaler prints nothing, and the
      // same two lines serve there too.
      return with_layer(fmt::format("Grad overflow on iteration: {}\nUsing static loss scale of: {}", r.iteration, py_float(r.old_scale)), layer);
    case LossScalerKind::unscaled:
      return with_layer(head, layer);
  }
  return {};
}

void LossScaler::set_state(const LossScalerState& s) {
  if (!(std::isfinite(s.cur_scale) && s.cur_scale > 0)) {
    fail("loss scaler state: cur_scale = {} is not a positive finite number; the checkpoint is corrupt or from another run", s.cur_scale);
  }
  if (!(s.cur_iter >= 0 && s.last_overflow_iter >= -1 && s.last_overflow_iter < s.cur_iter)) {
    fail(
        "loss scaler state: cur_iter = {}, last_overflow_iter = {} but 0 <= cur_iter and -1 <= last_overflow_iter < cur_iter must hold; "
        "the checkpoint is corrupt",
        s.cur_iter, s.last_overflow_iter);
  }
  if (kind_ != LossScalerKind::dynamic_zero && kind_ != LossScalerKind::dynamic_non_zero && s.cur_scale != state_.cur_scale) {
    fail(
        "loss scaler state: cur_scale = {} but this run's {} scale is {}; a static or unscaled run cannot resume another scale "
        "(check fp16.loss_scale / bf16 against the checkpoint's config)",
        s.cur_scale, loss_scaler_kind_name(kind_), state_.cur_scale);
  }
  state_ = s;
  // After a resume the scale is a float in DeepSpeed unless it is the untouched initial int; only
  // the non-ZeRO log text could tell, so assume float once anything was halved.
  python_int_scale_ = python_int_scale_ && s.last_overflow_iter < 0;
}

}  // namespace dstrain
