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

namespace dstrain {

inline constexpr std::string_view kTrainLossEvent = "Train/Samples/train_loss";
inline constexpr std::string_view kLrEvent = "Train/Samples/lr";
inline constexpr std::string_view kLossScaleEvent = "Train/Samples/loss_scale";

// [lr] or [lr, loss_scale] (loss_scale only when given: fp16 runs), at global_samples.
std::vector<MonitorEvent> step_events(double lr, std::optional<double> loss_scale, std::int64_t global_samples);

MonitorEvent train_loss_event(double loss, std::int64_t global_samples);

}  // namespace dstrain
