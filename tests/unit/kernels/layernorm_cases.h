// Case table for layernorm / fused_residual_layernorm (shared with the future CUDA tests).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct LayernormCase {
  const char* name;
  std::int64_t B, T, C;
};
inline constexpr LayernormCase kLayernormCases[] = {
    {"T1", 1, 1, 8},         {"C_odd", 2, 3, 13},    {"C1", 2, 2, 1},
    {"C_blocks", 3, 5, 130}, {"gpt2ish", 2, 16, 96}, {"long_row", 1, 2, 8200},  // C above the CPU's 8192-float row buffer: the other code path
};
// Outputs are O(1); 16-bit errors come from rounding inputs/outputs once (reference sees the
// rounded inputs). Gradient sums over rows get the same relative tolerance.
inline constexpr DTypeTols kLayernormTols{{2e-5, 2e-5}, {3e-3, 3e-3}, {2e-2, 2e-2}};

}  // namespace dstrain::test
