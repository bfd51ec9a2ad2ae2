#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

using config::SchedulerKind;

namespace {

// OneCycle's beta2 while it cycles beta1: DeepSpeed writes (beta1, 0.99) whatever the optimizer's
// beta2 was.
constexpr double kOneCycleBeta2 = 0.99;

// Python's float modulo (sign of the divisor); b is >= 0 in practice, but a config may resume at
// last_batch_iteration < -1 and C++'s fmod would then disagree with DeepSpeed.
double py_mod(double a, double b) { return a - b * std::floor(a / b); }

}  // namespace

LrSchedule::LrSchedule(double base_lr) : base_lr_(base_lr), lr_(base_lr) {}

LrSchedule::LrSchedule(const config::SchedulerConfig& cfg, double base_lr, std::optional<Betas> optimizer_betas)
    : kind_(cfg.kind), p_(cfg.params), base_lr_(base_lr), it_(cfg.params.last_batch_iteration) {
  const std::string& type = cfg.type;
  switch (kind_) {
    case SchedulerKind::warmup_lr:
    case SchedulerKind::warmup_decay_lr:
    case SchedulerKind::warmup_cosine_lr:
      if (p_.warmup_num_steps <= 0)
        fail("scheduler.params.warmup_num_steps is {}: {} needs a positive integer (DeepSpeed raises ValueError)", p_.warmup_num_steps, type);
      // The config layer rejects other values; DeepSpeed would warn and use log. Refusing here too
      // keeps one behaviour for configs built in code and configs read from JSON.
      if (p_.warmup_type != "log" && p_.warmup_type != "linear")
        fail("scheduler.params.warmup_type is \"{}\": use \"log\" or \"linear\"", p_.warmup_type);
      linear_warmup_ = p_.warmup_type == "linear";
      warmup_steps_ = static_cast<double>(std::max<std::int64_t>(2, p_.warmup_num_steps));
      if (kind_ != SchedulerKind::warmup_lr && !p_.total_num_steps)
        fail("scheduler.params.total_num_steps is missing: {} requires it (the number of optimizer steps of the run)", type);
      break;
    case SchedulerKind::one_cycle:
      if (p_.cycle_first_step_size <= 0) fail("scheduler.params.cycle_first_step_size is {}: OneCycle needs it > 0", p_.cycle_first_step_size);
      if (p_.cycle_second_step_size < 0) fail("scheduler.params.cycle_second_step_size is {}: OneCycle needs it >= 0", p_.cycle_second_step_size);
      if (p_.decay_step_size < 0) fail("scheduler.params.decay_step_size is {}: it must be >= 0 (0 = no decay)", p_.decay_step_size);
      cycle_momentum_ = p_.cycle_momentum;
      if (cycle_momentum_ && !optimizer_betas) {
        log_warning(
            "cycle_momentum is disabled because the optimizer has no betas (OneCycle cycles Adam's beta1); "
            "set \"cycle_momentum\": false to silence this");
        cycle_momentum_ = false;
      }
      break;
    case SchedulerKind::lr_range_test:
      if (p_.lr_range_test_step_size <= 0)
        fail("scheduler.params.lr_range_test_step_size is {}: LRRangeTest needs a positive integer", p_.lr_range_test_step_size);
      break;
    case SchedulerKind::none:
    case SchedulerKind::unsupported:  // the config layer warned that it is not applied
      it_ = -1;
      lr_ = base_lr_;
      return;
  }
  // DeepSpeed's constructors write their value into the optimizer only when starting from -1;
  // otherwise the optimizer keeps its own lr / betas until the first step().
  if (it_ == -1) {
    apply();
  } else {
    lr_ = base_lr_;
    betas_.reset();
  }
}

void LrSchedule::step() {
  ++it_;
  apply();
}

void LrSchedule::set_last_batch_iteration(std::int64_t it) {
  it_ = it;
  apply();
}

void LrSchedule::apply() {
  lr_ = lr_at(it_);
  betas_ = betas_at(it_);
}

double LrSchedule::one_cycle_scale(std::int64_t it) const {
  // Where in the cycle it + 1 lies: s rises 0 -> 1 over the first half, falls back over the second.
  const double F = static_cast<double>(p_.cycle_first_step_size);
  const double total = F + static_cast<double>(p_.cycle_second_step_size);
  const double b = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + b / total);
  const double x = 1.0 + b / total - cycle;
  const double ratio = F / total;
  double s = 0.0;
  std::int64_t stairs = 0;
  if (x <= ratio) {
    s = x / ratio;
    stairs = p_.cycle_first_stair_count;
  } else {
    s = (x - 1.0) / (ratio - 1.0);
    stairs = p_.cycle_second_stair_count;
  }
  // Staircase (applied since v0.19.4; stair counts were ignored before): quantised from the
  // integer offset in the cycle, not from s, which can land 1e-16 under an exact stair at a
  // half-cycle boundary and would drop a whole stair.
  if (stairs > 0) {
    const double i = py_mod(b, total);
    const double k = static_cast<double>(stairs);
    const double position = i <= F ? i * k / F : (total - i) * k / static_cast<double>(p_.cycle_second_step_size);
    s = std::floor(position) / k;
  }
  return s;
}

double LrSchedule::lr_at(std::int64_t it) const {
  const double W = warmup_steps_;
  const auto warmup_gamma = [&] {  // it in [0, W); DeepSpeed multiplies by a precomputed 1/ln(W)
    const double inverse_log = 1.0 / std::log(W);
    return linear_warmup_ ? static_cast<double>(it) / W : inverse_log * std::log(static_cast<double>(it + 1));
  };
  switch (kind_) {
    case SchedulerKind::none:
    case SchedulerKind::unsupported:
      return base_lr_;
    case SchedulerKind::warmup_lr:
    case SchedulerKind::warmup_decay_lr: {
      if (it < 0) return p_.warmup_min_lr;  // DeepSpeed: "before it has started"
      const double delta = p_.warmup_max_lr - p_.warmup_min_lr;
      double gamma = 1.0;
      if (static_cast<double>(it) < W) {
        gamma = warmup_gamma();
      } else if (kind_ == SchedulerKind::warmup_decay_lr) {
        const auto T = *p_.total_num_steps;
        const auto Wi = static_cast<std::int64_t>(W);
        gamma = std::max(0.0, static_cast<double>(T - it) / std::max(1.0, static_cast<double>(T - Wi)));
      }
      return p_.warmup_min_lr + delta * gamma;
    }
    case SchedulerKind::warmup_cosine_lr: {
      if (it < 0) return 0.0;  // the first optimizer step runs at lr 0, as in DeepSpeed
      double ratio = 0.0;
      if (static_cast<double>(it) < W) {
        ratio = p_.warmup_min_ratio + warmup_gamma() * (1.0 - p_.warmup_min_ratio);
      } else {
        const auto Wi = static_cast<std::int64_t>(W);
        const auto real_last_step = static_cast<double>(it - Wi + 1);
        const auto real_total_steps = static_cast<double>(std::max<std::int64_t>(1, *p_.total_num_steps - Wi));
        // Clamped since v0.19.3: after T the ratio stays at cos_min_ratio.
        const double progress = std::min(1.0, real_last_step / real_total_steps);
        const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
        ratio = std::max(0.0, p_.cos_min_ratio + (1.0 - p_.cos_min_ratio) * cosine);
      }
      return base_lr_ * ratio;
    }
    case SchedulerKind::one_cycle: {
      const double F = static_cast<double>(p_.cycle_first_step_size);
      const double total = F + static_cast<double>(p_.cycle_second_step_size);
      if (static_cast<double>(it) < total) {
        const double s = one_cycle_scale(it);
        return p_.cycle_min_lr + (p_.cycle_max_lr - p_.cycle_min_lr) * s;
      }
      if (p_.decay_step_size == 0 || p_.decay_lr_rate == 0.0) return p_.cycle_min_lr;
      const double d = static_cast<double>(it) - total + 1.0;
      return p_.cycle_min_lr / (1.0 + p_.decay_lr_rate * (d / static_cast<double>(p_.decay_step_size)));
    }
    case SchedulerKind::lr_range_test: {
      const double q = static_cast<double>(it + 1) / static_cast<double>(p_.lr_range_test_step_size);
      const double interval = p_.lr_range_test_staircase ? std::floor(q) : q;
      return p_.lr_range_test_min_lr * (1.0 + p_.lr_range_test_step_rate * interval);
    }
  }
  return base_lr_;
}

std::optional<LrSchedule::Betas> LrSchedule::betas_at(std::int64_t it) const {
  if (kind_ != SchedulerKind::one_cycle || !cycle_momentum_) return std::nullopt;
  // The constructor writes (cycle_min_mom, 0.99), although the cycle formula at it = -1 gives
  // cycle_max_mom: DeepSpeed's quirk, kept so the first step's beta1 matches.
  if (it == -1) return Betas{p_.cycle_min_mom, kOneCycleBeta2};
  const double F = static_cast<double>(p_.cycle_first_step_size);
  const double total = F + static_cast<double>(p_.cycle_second_step_size);
  if (static_cast<double>(it) < total) {
    const double s = one_cycle_scale(it);
    return Betas{p_.cycle_max_mom - (p_.cycle_max_mom - p_.cycle_min_mom) * s, kOneCycleBeta2};
  }
  if (p_.decay_step_size == 0 || p_.decay_mom_rate == 0.0) return Betas{p_.cycle_max_mom, kOneCycleBeta2};
  const double d = static_cast<double>(it) - total + 1.0;
  return Betas{p_.cycle_max_mom * (1.0 + p_.decay_mom_rate * (d / static_cast<double>(p_.decay_step_size))), kOneCycleBeta2};
}

}  // namespace dstrain
