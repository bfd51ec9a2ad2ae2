// The memory_breakdown lines: DeepSpeed's see_memory_usage(message, force=memory_breakdown())
// (deepspeed/runtime/utils.py), printed by rank 0 at the engine's checkpoints ("Engine before
// forward", "Engine after step", ...), from the allocators' measured MemoryStats:
//
//   Engine after step
//   MA 0.47 GB         Max_MA 1.23 GB         CA 0.47 GB         Max_CA 1 GB
//   MA by purpose: params 0.23 GB Max_MA 0.23 GB | grads 0.23 GB Max_MA 0.23 GB | ...
//   CPU Virtual Memory:  used = 12.5 GB, percent = 10.2%
//
// GB are GiB (DeepSpeed divides by 1024**3), rounded as Python's round(x, 2) and printed with
// str(); Max_CA is rounded to a whole number, as DeepSpeed does. dstrain's allocators keep no cache,
// so CA (reserved) equals MA and Max_CA equals Max_MA. The per-purpose line is dstrain's addition:
// what DeepSpeed users otherwise estimate, measured.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ops/memory_stats.h"

namespace dstrain {

// Host memory as psutil.virtual_memory() reports it: total and available bytes.
struct HostMemory {
  std::uint64_t total = 0;
  std::uint64_t available = 0;
};

// MemTotal and MemAvailable from /proc/meminfo; nullopt where that file is absent or unreadable.
std::optional<HostMemory> read_host_memory();

// The lines above (without a trailing newline); the CPU line only when `host` is given.
std::string format_memory_breakdown(std::string_view message, const MemoryStats& stats, const std::optional<HostMemory>& host);

}  // namespace dstrain
