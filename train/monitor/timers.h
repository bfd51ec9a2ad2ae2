// Wall-clock timers as DeepSpeed's wall_clock_breakdown keeps them (deepspeed/utils/timer.py,
// SynchronizedWallClockTimer, and the names engine.py uses), and the monitor events built on them.
//
// A timer collects one record per start/stop pair; elapsed_ms is the sum of the records since the
// last reset (DeepSpeed: elapsed(reset=True)). The engine logs, like DeepSpeed's engine.step():
//   every micro-step:           log_line(kMicroTimerNames)   -> "time (ms) | fwd_microstep: 12.34 | ..."
//   at the accumulation boundary: elapsed_time_events(...) to the monitors (reset=false), then
//                                 log_line(kGlobalTimerNames) -> "time (ms) | fwd: 49.20 | bwd: ... | step: ..."
// DeepSpeed prints these on rank 0 with a "[Rank 0] " prefix; our log_info adds the rank tag.
//
// On a GPU the host clock measures kernel launches, not kernels; pass a `synchronize` callback
// (a device synchronize) to make start/stop wait for the device, as DeepSpeed's CUDA-event timers do.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "train/monitor/monitor.h"

namespace dstrain {

// DeepSpeed's timer names (deepspeed/utils/timer.py).
inline constexpr std::string_view kForwardMicroTimer = "fwd_microstep";
inline constexpr std::string_view kForwardGlobalTimer = "fwd";
inline constexpr std::string_view kBackwardMicroTimer = "bwd_microstep";
inline constexpr std::string_view kBackwardGlobalTimer = "bwd";
inline constexpr std::string_view kBackwardInnerMicroTimer = "bwd_inner_microstep";
inline constexpr std::string_view kBackwardInnerGlobalTimer = "bwd_inner";
inline constexpr std::string_view kBackwardReduceMicroTimer = "bwd_allreduce_microstep";
inline constexpr std::string_view kBackwardReduceGlobalTimer = "bwd_allreduce";
inline constexpr std::string_view kStepMicroTimer = "step_microstep";
inline constexpr std::string_view kStepGlobalTimer = "step";

// engine.py's EngineTimers lists, in DeepSpeed's log order.
inline constexpr std::array<std::string_view, 5> kMicroTimerNames = {kForwardMicroTimer, kBackwardMicroTimer, kBackwardInnerMicroTimer,
                                                                     kBackwardReduceMicroTimer, kStepMicroTimer};
inline constexpr std::array<std::string_view, 5> kGlobalTimerNames = {kForwardGlobalTimer, kBackwardGlobalTimer, kBackwardInnerGlobalTimer,
                                                                      kBackwardReduceGlobalTimer, kStepGlobalTimer};

// Milliseconds on some monotonic clock; tests substitute a fake one.
using TimerClock = std::function<double()>;
double steady_clock_ms();

class WallClockTimer {
 public:
  explicit WallClockTimer(std::string name = {}, TimerClock clock = steady_clock_ms, std::function<void()> synchronize = {});

  const std::string& name() const { return name_; }

  // Throws Error when already started / not started (DeepSpeed asserts), naming the timer.
  void start();
  void stop();
  bool running() const { return running_; }
  // One record of `ms` measured elsewhere (the engine splits its backward into bwd_inner and
  // bwd_allreduce itself: EngineState::last_backward_*). Throws Error when ms < 0 or not finite.
  void add(double ms);

  // Sum of the records in ms; a running timer counts up to now and keeps running.
  double elapsed_ms(bool reset = true);
  // DeepSpeed's trimmed mean of the records: drop round(n * 0.1) from each end (Python's
  // half-to-even round), average the rest; 0 with no record.
  double mean_ms();
  void reset();
  std::size_t records() const { return records_.size(); }

 private:
  std::string name_;  // for error messages
  TimerClock clock_;
  std::function<void()> synchronize_;
  bool running_ = false;
  double start_ms_ = 0.0;
  std::vector<double> records_;
};

class Timers {
 public:
  explicit Timers(TimerClock clock = steady_clock_ms, std::function<void()> synchronize = {});

  // The named timer, created on first use (DeepSpeed's timers(name)).
  WallClockTimer& operator()(std::string_view name);
  bool has(std::string_view name) const;

  // "time (ms) | name: 12.34 | ..." over the names that exist, each elapsed_ms(reset) / normalizer,
  // two decimals (SynchronizedWallClockTimer.log). Throws Error when normalizer <= 0.
  std::string log_line(std::span<const std::string_view> names, double normalizer = 1.0, bool reset = true);

 private:
  TimerClock clock_;
  std::function<void()> synchronize_;
  std::map<std::string, WallClockTimer, std::less<>> timers_;
};

// engine.py's _write_monitor: Train/Samples/elapsed_time_ms_{forward, backward, backward_inner,
// backward_allreduce, step} from the global timers (fwd, bwd, bwd_inner, bwd_allreduce, step),
// read without reset, at step global_samples. A timer never started reads 0, as in DeepSpeed.
std::vector<MonitorEvent> elapsed_time_events(Timers& timers, std::int64_t global_samples);

}  // namespace dstrain
