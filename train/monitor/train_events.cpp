#include "train/monitor/train_events.h"

#include <string>

namespace dstrain {

std::vector<MonitorEvent> step_events(double lr, std::optional<double> loss_scale, std::int64_t global_samples) {
  std::vector<MonitorEvent> events{{std::string(kLrEvent), lr, global_samples}};
  if (loss_scale) events.push_back({std::string(kLossScaleEvent), *loss_scale, global_samples});
  return events;
}

MonitorEvent train_loss_event(double loss, std::int64_t global_samples) { return {std::string(kTrainLossEvent), loss, global_samples}; }

}  // namespace dstrain
