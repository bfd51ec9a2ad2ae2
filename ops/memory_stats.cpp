#include "ops/memory_stats.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

std::string_view memory_purpose_name(MemoryPurpose p) {
  switch (p) {
    case MemoryPurpose::params:
      return "params";
    case MemoryPurpose::grads:
      return "grads";
    case MemoryPurpose::optimizer:
      return "optimizer";
    case MemoryPurpose::activations:
      return "activations";
    case MemoryPurpose::buffers:
      return "buffers";
  }
  return "unknown";
}

namespace {

void count_allocate(MemoryCounter& c, std::size_t bytes) {
  c.current += bytes;
  c.peak = std::max(c.peak, c.current);
  ++c.allocations;
}

void count_free(MemoryCounter& c, std::size_t bytes, MemoryPurpose p) {
  // The allocator remembers each block's size and purpose, so this can only fire on a bug in it.
  DSTRAIN_CHECK(c.current >= bytes, "memory statistics: freeing {} bytes of {} with only {} counted (allocator bug)", bytes, memory_purpose_name(p),
                c.current);
  c.current -= bytes;
  ++c.frees;
}

}  // namespace

void MemoryStats::on_allocate(std::size_t bytes, MemoryPurpose p) {
  count_allocate((*this)[p], bytes);
  count_allocate(total, bytes);
}

void MemoryStats::on_free(std::size_t bytes, MemoryPurpose p) {
  count_free((*this)[p], bytes, p);
  count_free(total, bytes, p);
}

void MemoryStats::reset_peaks() {
  for (MemoryCounter& c : by_purpose) c.peak = c.current;
  total.peak = total.current;
}

std::string format_bytes(std::size_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

std::string format_memory_stats(const MemoryStats& stats) {
  std::string out = fmt::format("{:<12} {:>12} {:>12} {:>10} {:>10}\n", "purpose", "current", "peak", "allocs", "frees");
  auto row = [&out](std::string_view name, const MemoryCounter& c) {
    out += fmt::format("{:<12} {:>12} {:>12} {:>10} {:>10}\n", name, format_bytes(c.current), format_bytes(c.peak), c.allocations, c.frees);
  };
  for (MemoryPurpose p : kAllMemoryPurposes) row(memory_purpose_name(p), stats[p]);
  row("total", stats.total);
  return out;
}

}  // namespace dstrain
