// LrSchedule: DeepSpeed's five LR schedules (deepspeed/runtime/lr_schedules.py) with their exact
// formulas; docs/lr_schedules.md.
//
// Notation: it = last_batch_iteration, -1 at construction (unless the config resumes elsewhere),
// +1 per step(). W = max(2, warmup_num_steps).
//
// When to step (the engine's part): once per APPLIED optimizer step, after optimizer.step(), never
// on a step skipped for fp16/bf16 overflow. So the LR that optimizer step k (1-based, counting
// applied steps) uses is lr_at(k - 2), and the first step uses the constructor's value lr_at(-1):
//
//     LrSchedule s(cfg.scheduler, opt_lr, opt_betas);
//     loop: if (!overflow) { optimizer.step(lr = s.lr(), betas = s.betas().value_or(opt_betas)); s.step(); }
//
// Like DeepSpeed, a schedule constructed with last_batch_iteration != -1 does not write its value
// into the optimizer: until the first step() (or set_last_batch_iteration) lr() is the optimizer's
// own base lr and betas() is nullopt. Checkpoint resume calls set_last_batch_iteration(saved it);
// DeepSpeed's state_dict is {last_batch_iteration} and the optimizer's own checkpoint restores the
// lr the schedule last wrote, which is lr_at(saved it), so that is what lr() returns afterwards.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "config_schema/scheduler_config.h"

namespace dstrain {

class LrSchedule {
 public:
  using Betas = std::pair<double, double>;

  // `cfg`: the parsed scheduler section (defaults already resolved by the config layer; kind none
  // or unsupported = a constant base_lr, as the config layer's warning for torch schedulers says).
  // `base_lr`: the optimizer's lr. WarmupCosineLR multiplies it (org_lr); the constant for none.
  // `optimizer_betas`: the optimizer's (beta1, beta2), or nullopt when it has none (SGD). OneCycle
  // with cycle_momentum then disables momentum cycling with a warning, as DeepSpeed does.
  // Throws Error for parameters DeepSpeed rejects (warmup_num_steps <= 0, a missing
  // total_num_steps, cycle_first_step_size <= 0, lr_range_test_step_size <= 0, ...) and for a
  // warmup_type other than log/linear (the config layer rejects it too; DeepSpeed would warn).
  LrSchedule(const config::SchedulerConfig& cfg, double base_lr, std::optional<Betas> optimizer_betas);

  // A constant base_lr (no scheduler section).
  explicit LrSchedule(double base_lr);

  // it += 1, then the lr (and betas) for the new it. Call once per applied optimizer step.
  void step();

  // The lr the next optimizer step uses.
  double lr() const { return lr_; }
  // The betas the next optimizer step uses when the schedule sets them (OneCycle with momentum
  // cycling: (beta1, 0.99)); nullopt = keep the optimizer's own.
  std::optional<Betas> betas() const { return betas_; }

  std::int64_t last_batch_iteration() const { return it_; }
  // DeepSpeed's load_state_dict({last_batch_iteration: it}) plus the optimizer state's lr/betas.
  void set_last_batch_iteration(std::int64_t it);

  // The pure schedule: the lr / betas DeepSpeed computes for last_batch_iteration = it.
  double lr_at(std::int64_t it) const;
  std::optional<Betas> betas_at(std::int64_t it) const;

  config::SchedulerKind kind() const { return kind_; }
  bool cycles_momentum() const { return cycle_momentum_; }

 private:
  void apply();                                   // lr_ / betas_ from it_
  double one_cycle_scale(std::int64_t it) const;  // OneCycle cycle phase: 0 at min lr, 1 at max

  config::SchedulerKind kind_ = config::SchedulerKind::none;
  config::SchedulerParams p_;
  double base_lr_ = 0.0;
  bool linear_warmup_ = false;
  double warmup_steps_ = 2.0;    // W = max(2, warmup_num_steps)
  bool cycle_momentum_ = false;  // OneCycle: cycle_momentum and the optimizer has betas
  std::int64_t it_ = -1;
  double lr_ = 0.0;
  std::optional<Betas> betas_;
};

}  // namespace dstrain
