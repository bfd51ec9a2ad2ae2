// The figures of a finished training run: printed at the end, and written by --summary-json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/memory_stats.h"

namespace dstrain {

struct TrainSummary {
  std::string model;                      // describe() of the model
  std::int64_t parameters = 0;            // as GPT-2 counts them (real vocabulary)
  std::int64_t parameters_stored = 0;     // with the padding rows
  std::int64_t steps = 0;                 // optimizer steps taken
  std::int64_t train_batch_size = 0;      // sequences per step
  std::int64_t sequence_length = 0;
  std::int64_t tokens = 0;                // trained on: steps · train_batch_size · T
  std::vector<double> train_losses;       // per step: mean of its micro-batch losses
  std::vector<double> lrs;                // per step: the learning rate it used
  std::vector<std::pair<std::int64_t, double>> val_losses;  // (after step, loss)
  double train_seconds = 0.0;             // the steps only (evaluation excluded)
  std::vector<double> step_seconds;       // per optimizer step (on a GPU: after a device synchronise)
  double elapsed_seconds = 0.0;           // everything from the first step to the end
  std::int64_t skipped_steps = 0;         // optimizer steps skipped for an inf/NaN gradient
  std::optional<double> loss_scale;       // fp16: the loss scale at the end
  MemoryStats memory;                     // the allocator's statistics at the end (peaks per purpose)

  std::optional<double> final_train_loss() const;
  std::optional<double> final_val_loss() const;
  double tokens_per_s() const { return train_seconds > 0.0 ? static_cast<double>(tokens) / train_seconds : 0.0; }
  // Tokens per second of a typical step: train_batch_size · T over the median step time, the
  // first step left out when there are more (it pays for cuBLASLt's heuristics, the allocator's
  // first allocations, page faults). What a benchmark reports; tokens_per_s() is the whole run's.
  double steady_tokens_per_s() const;
};

// {"steps": ..., "final_train_loss": ..., "final_val_loss": ..., "tokens_per_s": ..., "steady_tokens_per_s": ..., "step_seconds": [...],
//  "train_losses": [...], "lrs": [...], "val_losses": [[step, loss], ...], "peak_memory_bytes": {"params": ...,
//  ..., "total": ...}, ...}; a missing loss is null.
nlohmann::json to_json(const TrainSummary& s);

// The lines printed at the end of a run.
std::string format_summary(const TrainSummary& s);

}  // namespace dstrain
