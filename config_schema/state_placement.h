// Where a run's training state lives: the one place that turns zero_optimization's stage and its
// offload sections into homes (docs/offload.md §5-7, docs/training_state.md §1-3). The config
// layer's warnings, the engine's stores and host memory, the pre-flight memory estimate and the
// run's report all read this placement; none of them re-derives DeepSpeed's rules:
//   - offload_optimizer acts at stages 1-3; at stage 0 there is no ZeRO optimizer to hold it and
//     DeepSpeed ignores the block, as dstrain does;
//   - its device "nvme" swaps to files only at stage 3; at stages 1-2 DeepSpeed's ZeRO-1/2
//     optimizer treats any offload device as "cpu", as dstrain does;
//   - partial offload (ratio < 1) keeps the first sub-groups on the device, at stage 3 only;
//   - offload_param acts at stage 3 only, and is ignored below it;
//   - the fp32 masters are kept apart from the params under fp16 / bf16 and whenever either
//     partition is offloaded; host memory is page-locked unless an acting section says
//     pin_memory false.
#pragma once

#include <string_view>

#include "config_schema/zero_config.h"

namespace dstrain {

// Where one partition of the state lives: the training device's memory, host memory, NVMe swap files.
enum class StateHome { device, host, nvme };
std::string_view state_home_name(StateHome h);  // "device", "host", "nvme"

// The fp32 masters kept apart from the params (docs/training_state.md §1): under 16-bit storage,
// or when either partition lives off the device (offload updates the masters where they live).
bool masters_apart(bool mixed_precision, StateHome optimizer, StateHome params);

namespace config {

struct StatePlacement {
  int stage = 0;
  bool mixed_precision = false;             // fp16 or bf16 storage of params and grads
  StateHome optimizer = StateHome::device;  // the optimizer partition: fp32 masters and optimizer states
  StateHome params = StateHome::device;     // the stage-3 parameter partition
  // Of the optimizer's sub-groups, the share that is offloaded (offload_optimizer.ratio at stage 3;
  // 1 below it; 0 when the optimizer stays on the device).
  double offload_ratio = 0.0;
  bool masters_apart = false;
  bool pin_host_memory = true;  // the acting offload sections' pin_memory (all true, or none acting)
  // What the config asks that acts differently here, as DeepSpeed does (the config layer warns):
  bool optimizer_offload_ignored = false;  // offload_optimizer at stage 0
  bool nvme_optimizer_as_cpu = false;      // offload_optimizer nvme at stages 1-2
  bool param_offload_ignored = false;      // offload_param below stage 3

  bool offloads() const { return optimizer != StateHome::device || params != StateHome::device; }
  bool uses_nvme() const { return optimizer == StateHome::nvme || params == StateHome::nvme; }
};

// The placement of a zero_optimization section for a run in fp16 / bf16 (`mixed_precision`) or fp32.
StatePlacement state_placement(const ZeroConfig& zero, bool mixed_precision);

}  // namespace config
}  // namespace dstrain
