// How a config's zero_optimization block becomes the engine's ZeRO settings: the stores that hold
// the optimizer and stage-3 parameter partitions where the placement puts them (device, host memory,
// NVMe; config_schema/state_placement.h), buckets and reduction options ModelStates is built from
// (zero/model_states.h).
#pragma once

#include "config_schema/ds_config.h"
#include "engine/optim/optimizer.h"
#include "offload/io_uring_engine.h"
#include "ops/allocator.h"
#include "zero/model_states.h"
#include "zero/state_store.h"

namespace dstrain {

// The ModelStates settings for config `c`, its partitions placed as c.placement() says
// (config_schema/state_placement.h). `io`: the engine's io_uring engine (non-null when a home
// is nvme); `rank`: for the swap folder. The factories keep references to `device` and `host`.
ZeroSettings zero_settings(const config::DsConfig& c, DType storage, const Optimizer& optimizer, Allocator& device, Allocator& host, IoEngine* io,
                           int rank);

}  // namespace dstrain
