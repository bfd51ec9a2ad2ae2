// MemoryStats: current and peak bytes per purpose, so memory claims are measured, not estimated.
//
// Every allocator counts what it hands out under one of five purposes (the buckets DeepSpeed's
// memory estimator and ZeRO papers reason in). The peak of the total is tracked as its own figure:
// params may peak during the forward and activations later, so the sum of per-purpose peaks
// overstates the real high-water mark.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dstrain {

enum class MemoryPurpose : std::uint8_t { params, grads, optimizer, activations, buffers };
inline constexpr std::size_t kNumMemoryPurposes = 5;
inline constexpr std::array<MemoryPurpose, kNumMemoryPurposes> kAllMemoryPurposes = {MemoryPurpose::params, MemoryPurpose::grads,
                                                                                     MemoryPurpose::optimizer, MemoryPurpose::activations,
                                                                                     MemoryPurpose::buffers};

// "params", "grads", "optimizer", "activations", "buffers".
std::string_view memory_purpose_name(MemoryPurpose p);

// One bucket. Bytes are the bytes callers asked for (alignment padding is not counted).
struct MemoryCounter {
  std::size_t current = 0;        // bytes live now
  std::size_t peak = 0;           // high-water mark of `current` since creation or reset_peaks()
  std::uint64_t allocations = 0;  // allocate() calls that returned memory, ever
  std::uint64_t frees = 0;        // deallocate() calls that released memory, ever

  std::uint64_t live_blocks() const { return allocations - frees; }
};

struct MemoryStats {
  std::array<MemoryCounter, kNumMemoryPurposes> by_purpose{};
  MemoryCounter total;

  const MemoryCounter& operator[](MemoryPurpose p) const { return by_purpose[static_cast<std::size_t>(p)]; }
  MemoryCounter& operator[](MemoryPurpose p) { return by_purpose[static_cast<std::size_t>(p)]; }

  // Bookkeeping for one block; the caller serialises (the allocator holds its lock).
  void on_allocate(std::size_t bytes, MemoryPurpose p);
  void on_free(std::size_t bytes, MemoryPurpose p);

  // Peaks restart from the current values (e.g. to measure one training step).
  void reset_peaks();
};

// "0 B", "512 B", "1.50 KiB", "768.00 MiB", "1.25 GiB" (binary units, two decimals past bytes).
std::string format_bytes(std::size_t bytes);

// A table, one row per purpose and a total row:
//   purpose         current        peak    allocs     frees
//   params         1.00 MiB    1.00 MiB         1         0
//   ...
//   total          1.00 MiB    1.50 MiB         3         2
std::string format_memory_stats(const MemoryStats& stats);

}  // namespace dstrain
