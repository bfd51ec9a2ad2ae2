// How a config's zero_optimization block becomes the engine's ZeRO settings: where the optimizer
// partition and the stage-3 parameter partition live (device, host memory, NVMe; DeepSpeed's stage
// rules for offload, docs/offload.md §5-7), and the store factories, buckets and reduction options
// ModelStates is built from (zero/model_states.h).
#pragma once

#include "config_schema/ds_config.h"
#include "engine/optim/optimizer.h"
#include "offload/io_uring_engine.h"
#include "ops/allocator.h"
#include "zero/model_states.h"
#include "zero/state_store.h"

namespace dstrain {

// Where the optimizer partition lives (docs/training_state.md §3): host memory with
// offload_optimizer at stages 1-3 (at stage 0 DeepSpeed ignores the block, and so do we), NVMe swap
// files with device "nvme" at stage 3 (below stage 3 DeepSpeed treats "nvme" as "cpu"), else the
// training device.
StateHome optimizer_home(const config::DsConfig& c);

// Where the stage-3 parameter partition lives: host memory or NVMe with offload_param at stage 3
// (below stage 3 DeepSpeed ignores the block, and so do we), else the training device.
StateHome param_home(const config::DsConfig& c);

// The ModelStates settings for config `c`. `io`: the engine's io_uring engine (non-null when a home
// is nvme); `rank`: for the swap folder. The factories keep references to `device` and `host`.
ZeroSettings zero_settings(const config::DsConfig& c, DType storage, const Optimizer& optimizer, Allocator& device, Allocator& host, IoEngine* io,
                           int rank);

}  // namespace dstrain
