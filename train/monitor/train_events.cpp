#include "train/monitor/train_events.h"

#include <string>

namespace dstrain {

std::vector<MonitorEvent> step_events(double lr, std::optional<double> loss_scale, std::int64_t global_samples) {
  std::vector<MonitorEvent> events{{std::string(kLrEvent), lr, global_samples}};
  if (loss_scale) events.push_back({std::string(kLossScaleEvent), *loss_scale, global_samples});
  return events;
}

MonitorEvent train_loss_event(double loss, std::int64_t global_samples) { return {std::string(kTrainLossEvent), loss, global_samples}; }

std::vector<MonitorEvent> comms_events(const std::vector<CommsOpTotals>& totals, std::int64_t global_samples) {
  std::vector<MonitorEvent> events;
  for (const CommsOpTotals& t : totals) {
    const std::string prefix = "comms/" + t.op + "/";
    events.push_back({prefix + "count", static_cast<double>(t.count), global_samples});
    events.push_back({prefix + "total_latency_ms", t.total_latency_ms, global_samples});
    events.push_back({prefix + "algbw_gbps", t.algbw_gbps, global_samples});
    events.push_back({prefix + "busbw_gbps", t.busbw_gbps, global_samples});
  }
  return events;
}

std::vector<MonitorEvent> straggler_events(int rank, double step_seconds, double ratio, std::int64_t global_samples) {
  return {MonitorEvent{std::string(kStragglerRankEvent), static_cast<double>(rank), global_samples},
          MonitorEvent{std::string(kStragglerSecondsEvent), step_seconds, global_samples},
          MonitorEvent{std::string(kStragglerRatioEvent), ratio, global_samples}};
}

}  // namespace dstrain
