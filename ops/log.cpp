#include "ops/log.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "ops/error.h"

namespace dstrain {
namespace {

LogLevel initial_level() {
  // DSTRAIN_LOG_LEVEL lets a user turn on debug output without touching the config.
  if (const char* env = std::getenv("DSTRAIN_LOG_LEVEL"); env != nullptr && *env != '\0') {
    try {
      return parse_log_level(env);
    } catch (const Error&) {
      std::fprintf(stderr, "[dstrain] warning: ignoring DSTRAIN_LOG_LEVEL=%s (use debug, info, warning, error or off)\n", env);
    }
  }
  return LogLevel::info;
}

std::atomic<LogLevel> g_level{initial_level()};
std::atomic<int> g_rank{0};
std::atomic<int> g_world{1};
std::mutex g_write_mutex;
thread_local int t_rank = -1;  // < 0: no per-thread override
thread_local int t_world = 1;

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "debug" || lower == "10") return LogLevel::debug;
  if (lower == "info" || lower == "20") return LogLevel::info;
  if (lower == "warning" || lower == "warn" || lower == "30") return LogLevel::warning;
  if (lower == "error" || lower == "40" || lower == "critical" || lower == "50") return LogLevel::error;
  if (lower == "off" || lower == "none") return LogLevel::off;
  fail("log level '{}' is not known; use debug, info, warning, error or off", text);
}

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

void set_thread_log_rank(int rank, int world_size) {
  t_rank = rank;
  t_world = world_size;
}

int log_rank() { return t_rank >= 0 ? t_rank : g_rank.load(); }
int log_world_size() { return t_rank >= 0 ? t_world : g_world.load(); }

void set_log_level(LogLevel level) { g_level = level; }

LogLevel log_level() { return g_level.load(std::memory_order_relaxed); }

void log_line(LogLevel level, std::string_view message) {
  if (level < log_level()) return;
  const int rank = log_rank();
  const bool everyone = level >= LogLevel::warning;
  if (!everyone && rank != 0) return;

  const char* tag = "";
  switch (level) {
    case LogLevel::debug:
      tag = "debug: ";
      break;
    case LogLevel::info:
      tag = "";
      break;
    case LogLevel::warning:
      tag = "warning: ";
      break;
    case LogLevel::error:
      tag = "error: ";
      break;
    case LogLevel::off:
      return;
  }
  std::string line =
      log_world_size() > 1 ? fmt::format("[dstrain rank {}] {}{}\n", rank, tag, message) : fmt::format("[dstrain] {}{}\n", tag, message);
  std::lock_guard<std::mutex> lock(g_write_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace dstrain
