// The events DeepSpeed's engine writes to its monitors each step, so the engine need not spell the
// names: at every gradient-accumulation boundary (including fp16-skipped steps) Train/Samples/lr
// and, with fp16, Train/Samples/loss_scale (engine.step()); Train/Samples/train_loss with the
// averaged loss (engine.backward() / the pipeline engine). All at step = global_samples.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "train/monitor/monitor.h"
#include "zero/comms_logger.h"

namespace dstrain {

inline constexpr std::string_view kTrainLossEvent = "Train/Samples/train_loss";
inline constexpr std::string_view kLrEvent = "Train/Samples/lr";
inline constexpr std::string_view kLossScaleEvent = "Train/Samples/loss_scale";

// [lr] or [lr, loss_scale] (loss_scale only when given: fp16 runs), at global_samples.
std::vector<MonitorEvent> step_events(double lr, std::optional<double> loss_scale, std::int64_t global_samples);

MonitorEvent train_loss_event(double loss, std::int64_t global_samples);

inline constexpr std::string_view kStragglerRankEvent = "Train/Stragglers/rank";
inline constexpr std::string_view kStragglerSecondsEvent = "Train/Stragglers/step_seconds";
inline constexpr std::string_view kStragglerRatioEvent = "Train/Stragglers/ratio_to_median";

// A straggler named (train/straggler_detector.h): its rank, its mean step seconds over the slow
// steps, and that over the median, at global_samples (docs/monitoring.md "Stragglers").
std::vector<MonitorEvent> straggler_events(int rank, double step_seconds, double ratio, std::int64_t global_samples);

// comms_logger (docs/monitoring.md §6), per op since the start of training at global_samples:
// comms/<op>/count, comms/<op>/total_latency_ms, comms/<op>/algbw_gbps, comms/<op>/busbw_gbps (the
// bandwidths of all the op's calls together: CommsOpTotals). <op> is DeepSpeed's name (all_reduce,
// reduce_scatter_tensor, ...).
std::vector<MonitorEvent> comms_events(const std::vector<CommsOpTotals>& totals, std::int64_t global_samples);

}  // namespace dstrain
