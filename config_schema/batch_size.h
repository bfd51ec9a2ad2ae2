// Batch-size arithmetic: DeepSpeed's _set_batch_related_parameters + _batch_assertion
// (docs/batch.md §2–§3), for the data-parallel world size.
#pragma once

#include <cstdint>
#include <optional>

namespace dstrain::config {

struct BatchSizes {
  std::int64_t train_batch_size = 0;                // TBS: samples per optimizer step, all ranks
  std::int64_t train_micro_batch_size_per_gpu = 0;  // MBS: samples per forward/backward per rank
  std::int64_t gradient_accumulation_steps = 0;     // GAS: micro steps per optimizer step
};

// Infers the missing values with Python floor division in DeepSpeed's order, then runs DeepSpeed's
// four assertions. nullopt = not given (a JSON null counts as not given; 0 counts as given).
// Throws Error carrying DeepSpeed's assertion text plus the fix.
BatchSizes resolve_batch_sizes(std::optional<std::int64_t> train_batch_size, std::optional<std::int64_t> micro_batch_per_gpu,
                               std::optional<std::int64_t> gradient_accumulation_steps, std::int64_t data_parallel_world_size);

// Python's a // b (rounds toward negative infinity). b must not be 0.
std::int64_t floor_div(std::int64_t a, std::int64_t b);

}  // namespace dstrain::config
