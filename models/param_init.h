// Deterministic parameter init from a seed, identical on any machine and for any world size.
//
// Each parameter draws from its own Philox stream, keyed by the seed and a hash of its NAME (not
// its position), so adding a layer or initialising a ZeRO partition alone does not shift the
// numbers of the others. Element pairs (2k, 2k+1) come from Box-Muller on the words of Philox
// group k (uniforms from the top 24 bits, log/cos/sin in double, rounded once to the target dtype).
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/tensor.h"
#include "models/layer.h"

namespace dstrain {

// Fills `param` (shape spec.shape, any floating dtype, on the CPU) as spec.init says.
// Throws Error for a tied spec (a tied parameter has no storage of its own) or a shape mismatch.
void init_param(Tensor param, const ParamSpec& spec, std::uint64_t seed);

// The Philox key of a parameter's init stream (exposed for tests).
RngKey param_init_key(std::string_view name, std::uint64_t seed);

}  // namespace dstrain
