#include "ops/stop_request.h"

#include <csignal>
#include <cstdint>
#include <ctime>

#include <algorithm>
#include <atomic>

#include <fmt/format.h>

namespace dstrain {
namespace {

std::atomic<int> g_signal{0};
std::atomic<std::int64_t> g_requested_ns{0};  // CLOCK_MONOTONIC of the request
std::atomic<std::int64_t> g_longest_step_ns{0};

// clock_gettime is async-signal-safe; std::chrono's clocks are not promised to be.
std::int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

}  // namespace

int stop_signal() { return g_signal.load(); }

void request_stop(int signal_number) {
  if (g_signal.load() == 0) g_requested_ns.store(monotonic_ns());  // the first request starts the grace
  g_signal.store(signal_number);
}

void clear_stop_request() {
  g_signal.store(0);
  g_requested_ns.store(0);
  g_longest_step_ns.store(0);
}

void note_step_seconds(double seconds) {
  const auto ns = static_cast<std::int64_t>(std::min(seconds, 1e9) * 1e9);
  std::int64_t seen = g_longest_step_ns.load();
  while (ns > seen && !g_longest_step_ns.compare_exchange_weak(seen, ns)) {
  }
}

std::chrono::milliseconds stop_grace() {
  return std::max(kStopGrace, std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(2 * g_longest_step_ns.load())));
}

bool stop_overdue() {
  if (g_signal.load() == 0) return false;
  return monotonic_ns() - g_requested_ns.load() >= std::chrono::nanoseconds(stop_grace()).count();
}

StopRequested::StopRequested(int signal_number, std::string_view during)
    : Error(fmt::format("stopped by signal {} ({}) while {}: the step in progress is lost and nothing was saved since the last "
                        "checkpoint; rerun the same command with --resume auto to continue from it",
                        signal_number, signal_number == SIGINT ? "SIGINT" : "SIGTERM", during)),
      signal_(signal_number) {}

void throw_if_stop_overdue(std::string_view during) {
  if (stop_overdue()) throw StopRequested(stop_signal(), during);
}

}  // namespace dstrain
