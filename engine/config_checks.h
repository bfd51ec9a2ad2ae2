// The checks of a config against what the engine trains, apart from the step: what this build
// provides (check_config_is_provided, which the Engine's constructor runs first), and the public
// check_engine_trains / machine_findings of engine.h that check-config and train call.
#pragma once

#include "config_schema/ds_config.h"
#include "ops/device.h"

namespace dstrain {

// Throws Error naming the key when `c` asks for something this build does not train on
// `world_size` ranks.
void check_config_is_provided(const config::DsConfig& c, int world_size);

// Error naming the key and the fix when the engine cannot train `config` with `tp_ranks`
// tensor-parallel ranks on `device` (docs/parallelism.md "What composes"): the 1-bit family, which
// communicates its own compressed gradients with scales from the pieces a rank holds, or a CUDA
// device, whose vocabulary-parallel cross-entropy kernels are owed. (Lamb, Muon and Adafactor,
// whose rules read whole matrices, sum or gather the pieces over the group: engine/optim/tensor_cut.h.)
void check_tensor_parallel_engine(const config::DsConfig& config, const Device& device, int tp_ranks);

}  // namespace dstrain
