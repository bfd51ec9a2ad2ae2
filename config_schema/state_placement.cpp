#include "config_schema/state_placement.h"

namespace dstrain {

std::string_view state_home_name(StateHome h) {
  switch (h) {
    case StateHome::device:
      return "device";
    case StateHome::host:
      return "host";
    case StateHome::nvme:
      return "nvme";
  }
  return "?";
}

bool masters_apart(bool mixed_precision, StateHome optimizer, StateHome params) {
  return mixed_precision || optimizer != StateHome::device || params != StateHome::device;
}

namespace config {

StatePlacement state_placement(const ZeroConfig& z, bool mixed_precision) {
  StatePlacement p;
  p.stage = z.stage;
  p.mixed_precision = mixed_precision;
  if (const auto& off = z.offload_optimizer; off && off->device != OffloadDevice::none) {
    if (z.stage == 0) {
      p.optimizer_offload_ignored = true;
    } else {
      p.optimizer = off->device == OffloadDevice::nvme && z.stage == 3 ? StateHome::nvme : StateHome::host;
      p.nvme_optimizer_as_cpu = off->device == OffloadDevice::nvme && z.stage != 3;
      p.offload_ratio = z.stage == 3 ? off->ratio : 1.0;
      p.pin_host_memory = p.pin_host_memory && off->pin_memory;
    }
  }
  if (const auto& off = z.offload_param; off && off->device != OffloadDevice::none) {
    if (z.stage != 3) {
      p.param_offload_ignored = true;
    } else {
      p.params = off->device == OffloadDevice::nvme ? StateHome::nvme : StateHome::host;
      p.pin_host_memory = p.pin_host_memory && off->pin_memory;
    }
  }
  p.masters_apart = dstrain::masters_apart(mixed_precision, p.optimizer, p.params);
  return p;
}

}  // namespace config
}  // namespace dstrain
