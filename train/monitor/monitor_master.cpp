#include "train/monitor/monitor_master.h"

#include "train/monitor/csv_monitor.h"
#include "train/monitor/tensorboard_monitor.h"

namespace dstrain {

MonitorMaster::MonitorMaster(const config::DsConfig& cfg, int global_rank) : MonitorMaster(cfg.tensorboard, cfg.csv_monitor, global_rank) {}

MonitorMaster::MonitorMaster(const config::TensorboardConfig& tensorboard, const config::CsvMonitorConfig& csv, int global_rank) {
  if (global_rank != 0) return;  // DeepSpeed: monitors exist on rank 0 only
  if (tensorboard.enabled) monitors_.push_back(std::make_unique<TensorBoardMonitor>(tensorboard));
  if (csv.enabled) monitors_.push_back(std::make_unique<CsvMonitor>(csv));
}

void MonitorMaster::add(std::unique_ptr<Monitor> monitor) {
  if (monitor) monitors_.push_back(std::move(monitor));
}

void MonitorMaster::write_events(std::span<const MonitorEvent> events) {
  for (auto& m : monitors_) m->write_events(events);
}

}  // namespace dstrain
