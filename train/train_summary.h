// The figures of a finished training run: printed at the end, and written by --summary-json.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/memory_stats.h"
#include "zero/comms_logger.h"

namespace dstrain {

// Where an offloaded run (offload_optimizer "cpu" or "nvme") kept its state, and what NVMe moved
// (docs/offload.md §9). The lead rank's figures; --summary-json's "zero" object has every rank's.
struct OffloadSummary {
  std::string optimizer_home;  // "host" or "nvme"
  // Bytes held between steps per purpose (index: MemoryPurpose) on the training device, in host
  // memory and in the swap files.
  std::array<std::uint64_t, kNumMemoryPurposes> device{}, host{}, nvme{};
  std::uint64_t last_step_bytes_read = 0, last_step_bytes_written = 0;  // the last optimizer step's
  std::uint64_t bytes_read = 0, bytes_written = 0;                      // every optimizer step's
  double wait_seconds = 0.0;                                            // every step's time blocked waiting for an NVMe transfer

  // Per step (means over `steps`), the rate over the steps' time, and the share of it spent waiting.
  double bytes_read_per_step(std::int64_t steps) const;
  double bytes_written_per_step(std::int64_t steps) const;
  double gb_per_s(double train_seconds) const;
  double io_wait_share(double train_seconds) const;
};

// comms_logger (docs/monitoring.md §6): the lead rank's table at the end of training, as
// DeepSpeed's comms.log_summary(return_dict=True) gives it.
struct CommsSummary {
  int world_size = 1;
  int rank = 0;
  std::vector<CommsLogRow> rows;
};

struct TrainSummary {
  std::string model;                   // describe() of the model
  std::int64_t parameters = 0;         // as GPT-2 counts them (real vocabulary)
  std::int64_t parameters_stored = 0;  // with the padding rows
  std::int64_t steps = 0;              // optimizer steps taken
  std::int64_t train_batch_size = 0;   // sequences per step
  std::int64_t sequence_length = 0;
  std::int64_t tokens = 0;                                  // trained on: steps · train_batch_size · T
  std::vector<double> train_losses;                         // per step: mean of its micro-batch losses
  std::vector<double> lrs;                                  // per step: the learning rate it used
  std::vector<std::pair<std::int64_t, double>> val_losses;  // (after step, loss)
  double train_seconds = 0.0;                               // the steps only (evaluation excluded)
  std::vector<double> step_seconds;                         // per optimizer step (on a GPU: after a device synchronise)
  double elapsed_seconds = 0.0;                             // everything from the first step to the end
  std::int64_t skipped_steps = 0;                           // optimizer steps skipped for an inf/NaN gradient
  std::optional<double> loss_scale;                         // fp16: the loss scale at the end
  MemoryStats memory;                                       // the allocator's statistics at the end (peaks per purpose)
  std::optional<OffloadSummary> offload;                    // runs with an offloaded optimizer only
  std::optional<CommsSummary> comms;                        // runs with comms_logger.enabled only
  // MFU: the model's training FLOPs per token (Architecture::flops_per_token) and the peak it is
  // read against (TrainingPlan::mfu_peak_flops); 0: unknown, no MFU.
  double flops_per_token = 0.0;
  double peak_flops = 0.0;
  std::string peak_source;  // "a 1024^3 bf16 GEMM (oneDNN ...), measured at start" or "--peak-flops"

  std::optional<double> final_train_loss() const;
  std::optional<double> final_val_loss() const;
  double tokens_per_s() const { return train_seconds > 0.0 ? static_cast<double>(tokens) / train_seconds : 0.0; }
  // Tokens per second of a typical step: train_batch_size · T over the median step time, the
  // first step left out when there are more (it pays for cuBLASLt's heuristics, the allocator's
  // first allocations, page faults). What a benchmark reports; tokens_per_s() is the whole run's.
  double steady_tokens_per_s() const;
  // steady_tokens_per_s() · flops_per_token / peak_flops; 0 when the peak is unknown.
  double steady_mfu() const;
};

// {"steps": ..., "final_train_loss": ..., "final_val_loss": ..., "tokens_per_s": ..., "steady_tokens_per_s": ..., "step_seconds": [...],
//  "train_losses": [...], "lrs": [...], "val_losses": [[step, loss], ...], "peak_memory_bytes": {"params": ...,
//  ..., "total": ...}, "offload": {...} (offloaded runs; docs/offload.md §9), "comms": {"world_size": W, "rank": 0,
//  "summary": {op: {"<message bytes>": {"count": ..., "total_latency_ms": ..., "avg_latency_ms": ..., "tput_avg_gbps": ...,
//  "busbw_avg_gbps": ..., "msg_size_bytes": ..., "msg_size_str": "3.91 KB"}}}} (comms_logger), ...}; a missing loss is null.
nlohmann::json to_json(const TrainSummary& s);

// {"params": bytes, ..., "total": sum}: bytes held per memory purpose, as --summary-json writes them
// (the offload summary's and every rank's ZeroReport's).
nlohmann::json memory_purposes_json(const std::array<std::uint64_t, kNumMemoryPurposes>& bytes);

// The lines printed at the end of a run.
std::string format_summary(const TrainSummary& s);

}  // namespace dstrain
