// The checks of a config against what the engine trains, apart from the step: what this build
// provides (check_config_is_provided, which the Engine's constructor runs first), and the public
// check_engine_trains / machine_findings of engine.h that check-config and train call.
#pragma once

#include "config_schema/ds_config.h"

namespace dstrain {

// Throws Error naming the key when `c` asks for something this build does not train on
// `world_size` ranks.
void check_config_is_provided(const config::DsConfig& c, int world_size);

}  // namespace dstrain
