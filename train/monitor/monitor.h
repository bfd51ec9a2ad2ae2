// Monitor: DeepSpeed's monitor interface (deepspeed/monitor/monitor.py). The engine hands a list of
// (name, value, step) tuples to write_events; each backend (csv_monitor, tensorboard) writes them
// in its own format. DeepSpeed's names are "Train/Samples/lr", "Train/Samples/loss_scale",
// "Train/Samples/train_loss", "Train/Samples/elapsed_time_ms_*", and the step is global_samples.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace dstrain {

// One scalar. `step` is DeepSpeed's x axis: global_samples (samples seen so far, all ranks), not
// the optimizer step.
struct MonitorEvent {
  std::string name;
  double value = 0.0;
  std::int64_t step = 0;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  // Writes every event, in order, and makes them durable against a crash of this process (flushed
  // to the OS) before returning. Throws Error naming the file when the write fails (disk full).
  virtual void write_events(std::span<const MonitorEvent> events) = 0;
};

}  // namespace dstrain
