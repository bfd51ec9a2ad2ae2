#include "train/monitor/timers.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "ops/error.h"

namespace dstrain {

double steady_clock_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

WallClockTimer::WallClockTimer(std::string name, TimerClock clock, std::function<void()> synchronize)
    : name_(std::move(name)), clock_(std::move(clock)), synchronize_(std::move(synchronize)) {}

void WallClockTimer::start() {
  DSTRAIN_CHECK(!running_, "timer '{}' started twice: stop it before starting it again", name_);
  if (synchronize_) synchronize_();
  start_ms_ = clock_();
  running_ = true;
}

void WallClockTimer::stop() {
  DSTRAIN_CHECK(running_, "timer '{}' stopped without being started: call start() first", name_);
  if (synchronize_) synchronize_();
  records_.push_back(clock_() - start_ms_);
  running_ = false;
}

void WallClockTimer::add(double ms) {
  DSTRAIN_CHECK(std::isfinite(ms) && ms >= 0.0, "timer '{}': a record of {} ms; records are finite and >= 0", name_, ms);
  records_.push_back(ms);
}

double WallClockTimer::elapsed_ms(bool reset_after) {
  // DeepSpeed stops a running timer, sums, and starts it again: the running part is counted.
  const bool was_running = running_;
  if (was_running) stop();
  const double total = std::accumulate(records_.begin(), records_.end(), 0.0);
  if (reset_after) reset();
  if (was_running) start();
  return total;
}

double WallClockTimer::mean_ms() {
  if (running_) {
    stop();
    start();
  }
  if (records_.empty()) return 0.0;
  std::vector<double> sorted = records_;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  // Python's round(n * 0.1): nearbyint rounds half to even in the default rounding mode.
  const auto k = static_cast<std::size_t>(std::nearbyint(static_cast<double>(n) * 0.1));
  if (2 * k >= n) return 0.0;  // numpy's mean of an empty slice is nan; never reached for n >= 1
  return std::accumulate(sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end() - static_cast<std::ptrdiff_t>(k), 0.0) /
         static_cast<double>(n - 2 * k);
}

void WallClockTimer::reset() {
  running_ = false;
  records_.clear();
}

Timers::Timers(TimerClock clock, std::function<void()> synchronize) : clock_(std::move(clock)), synchronize_(std::move(synchronize)) {}

WallClockTimer& Timers::operator()(std::string_view name) {
  auto it = timers_.find(name);
  if (it == timers_.end()) it = timers_.emplace(std::string(name), WallClockTimer(std::string(name), clock_, synchronize_)).first;
  return it->second;
}

bool Timers::has(std::string_view name) const { return timers_.find(name) != timers_.end(); }

std::string Timers::log_line(std::span<const std::string_view> names, double normalizer, bool reset) {
  DSTRAIN_CHECK(normalizer > 0.0, "Timers::log_line: normalizer must be > 0, got {}", normalizer);
  std::string line = "time (ms)";
  for (std::string_view name : names) {
    auto it = timers_.find(name);
    if (it == timers_.end()) continue;
    line += fmt::format(" | {}: {:.2f}", name, it->second.elapsed_ms(reset) / normalizer);
  }
  return line;
}

std::vector<MonitorEvent> elapsed_time_events(Timers& timers, std::int64_t global_samples) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kEvents = {{
      {"Train/Samples/elapsed_time_ms_forward", kForwardGlobalTimer},
      {"Train/Samples/elapsed_time_ms_backward", kBackwardGlobalTimer},
      {"Train/Samples/elapsed_time_ms_backward_inner", kBackwardInnerGlobalTimer},
      {"Train/Samples/elapsed_time_ms_backward_allreduce", kBackwardReduceGlobalTimer},
      {"Train/Samples/elapsed_time_ms_step", kStepGlobalTimer},
  }};
  std::vector<MonitorEvent> events;
  events.reserve(kEvents.size());
  for (const auto& [event_name, timer_name] : kEvents) {
    const double ms = timers.has(timer_name) ? timers(timer_name).elapsed_ms(/*reset=*/false) : 0.0;
    events.push_back({std::string(event_name), ms, global_samples});
  }
  return events;
}

}  // namespace dstrain
