#include "train/monitor/memory_breakdown.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "train/monitor/python_format.h"

namespace dstrain {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gb(std::size_t bytes) { return python_float_repr(python_round(static_cast<double>(bytes) / kGiB, 2)); }

}  // namespace

std::optional<HostMemory> read_host_memory() {
  std::ifstream in("/proc/meminfo");
  if (!in) return std::nullopt;
  HostMemory m;
  bool have_total = false, have_available = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") m.total = kib * 1024, have_total = true;
    if (key == "MemAvailable:") m.available = kib * 1024, have_available = true;
  }
  if (!have_total || !have_available) return std::nullopt;
  return m;
}

std::string format_memory_breakdown(std::string_view message, const MemoryStats& stats, const std::optional<HostMemory>& host) {
  const MemoryCounter& t = stats.total;
  std::string out(message);
  // DeepSpeed's f-string continues over lines with a backslash, which keeps the next line's
  // 8-space indent: hence "GB" + 9 spaces between fields, and a trailing space.
  out += fmt::format("\nMA {} GB         Max_MA {} GB         CA {} GB         Max_CA {} GB ", gb(t.current), gb(t.peak), gb(t.current),
                     static_cast<long long>(std::nearbyint(static_cast<double>(t.peak) / kGiB)));
  out += "\nMA by purpose:";
  const char* sep = " ";
  for (MemoryPurpose p : kAllMemoryPurposes) {
    out += fmt::format("{}{} {} GB Max_MA {} GB", sep, memory_purpose_name(p), gb(stats[p].current), gb(stats[p].peak));
    sep = " | ";
  }
  if (host && host->total > 0) {
    const std::uint64_t used = host->total - std::min(host->available, host->total);
    out += fmt::format("\nCPU Virtual Memory:  used = {} GB, percent = {}%", gb(used),
                       python_float_repr(python_round(100.0 * static_cast<double>(used) / static_cast<double>(host->total), 1)));
  }
  return out;
}

}  // namespace dstrain
