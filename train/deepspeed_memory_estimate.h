// DeepSpeed's own estimates of the memory the model states take (params, gradients, optimizer
// states), as its estimate_zero2_model_states_mem_needs (runtime/zero/stage_1_and_2.py) and
// estimate_zero3_model_states_mem_needs (runtime/zero/stage3.py) compute them: `dstrain
// estimate-memory` prints them beside dstrain's own estimate (train/memory_estimate.h), so that a
// DeepSpeed user compares the figures they know with the ones dstrain plans with.
//
// DeepSpeed's formulas, for N parameters, G = gpus_per_node · nodes GPUs, buffer factor f (1.5):
//   ZeRO-2, offload_optimizer cpu:   GPU 2N;            CPU N · max(4G, 16) · f
//   ZeRO-2, no offload:              GPU 2N + ⌊18N/G⌋;  CPU N · 4 · gpus_per_node · f
//   ZeRO-3 (L the largest module's own parameters, a = 1 / nodes):
//     offload param + optimizer:     GPU 4L;            CPU N · 18a · f (zero_init), N · max(4·gpus_per_node, 18a) · f
//     offload optimizer:             GPU 4L + ⌊2N/G⌋;   CPU N · 16a · f (zero_init), N · max(4·gpus_per_node, 16a) · f
//     no offload:                    GPU 4L + ⌊18N/G⌋;  CPU L · 4 · gpus_per_node · f (zero_init), N · 4 · gpus_per_node · f
// (bytes; DeepSpeed truncates each figure to an integer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/module_flops.h"

namespace dstrain {

struct DeepSpeedStatesEstimate {
  bool zero3 = false;
  bool offload_optimizer = false;
  bool offload_param = false;  // ZeRO-3 only
  bool zero_init = false;      // ZeRO-3 only: deepspeed.zero.Init builds the model partitioned
  double cpu_bytes = 0.0, gpu_bytes = 0.0;
  // DeepSpeed's options column: "offload_optimizer=cpu " / "offload_param=none, offload_optimizer=cpu , zero_init=1".
  std::string options() const;
};

// The rows DeepSpeed prints, in its order: offload_optimizer cpu, then none.
std::vector<DeepSpeedStatesEstimate> deepspeed_zero2_estimates(double total_params, std::int64_t gpus_per_node, std::int64_t nodes,
                                                               double buffer_factor = 1.5);
// The rows DeepSpeed prints, in its order: (param cpu, optimizer cpu), (param none, optimizer cpu),
// (none, none), each with zero_init 1 then 0.
std::vector<DeepSpeedStatesEstimate> deepspeed_zero3_estimates(double total_params, double largest_layer_params, std::int64_t gpus_per_node,
                                                               std::int64_t nodes, double buffer_factor = 1.5);

// DeepSpeed's largest_layer_params: the most parameters one module holds itself (its own, not its
// children's), over a model's module tree.
std::int64_t largest_module_params(const ModuleFlops& tree);

// DeepSpeed's table: its header lines (the largest layer named for ZeRO-3) and one
// " {cpu:7.2f}GB | {gpu:6.2f}GB | {options}" row per estimate; the row `marked` (if any) ends in
// "  <- this config".
std::string format_deepspeed_estimates(const std::vector<DeepSpeedStatesEstimate>& rows, double total_params, double largest_layer_params,
                                       std::int64_t gpus_per_node, std::int64_t nodes, bool zero3, int marked = -1);

}  // namespace dstrain
