// MonitorMaster: DeepSpeed's fan-out (deepspeed/monitor/monitor.py) from the ds_config to the
// monitors dstrain provides. Only global rank 0 builds and writes monitors, as in DeepSpeed; other
// ranks get an empty master whose write_events does nothing. wandb and comet are not provided (the
// config layer warns when they are enabled), so they add no writer here.
//
//   MonitorMaster monitors(cfg, rank);          // folders created now: bad paths fail at start
//   if (monitors.enabled()) monitors.write_events(events);
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "config_schema/ds_config.h"
#include "train/monitor/monitor.h"

namespace dstrain {

class MonitorMaster final : public Monitor {
 public:
  // Builds tensorboard then csv_monitor when enabled, on rank 0 only. Throws Error (from the
  // monitor) when an enabled monitor's output_path cannot be created or written.
  MonitorMaster(const config::DsConfig& cfg, int global_rank);
  MonitorMaster(const config::TensorboardConfig& tensorboard, const config::CsvMonitorConfig& csv, int global_rank);
  MonitorMaster() = default;  // no monitors

  // Adds a monitor of the embedding program's own (rank 0 decides; the master does not filter).
  void add(std::unique_ptr<Monitor> monitor);

  // True when at least one writer exists on this rank: the engine builds events only then.
  bool enabled() const { return !monitors_.empty(); }
  std::size_t size() const { return monitors_.size(); }

  // Every monitor, in the order they were built (tensorboard, csv, then added ones).
  void write_events(std::span<const MonitorEvent> events) override;

 private:
  std::vector<std::unique_ptr<Monitor>> monitors_;
};

}  // namespace dstrain
