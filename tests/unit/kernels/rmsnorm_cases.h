// Case table for rmsnorm / fused_residual_rmsnorm (shared with the CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct RmsnormCase {
  const char* name;
  std::int64_t B, T, C;
  double eps;
};
inline constexpr RmsnormCase kRmsnormCases[] = {
    {"T1", 1, 1, 8, 1e-6},         {"C_odd", 2, 3, 13, 1e-5},      {"C1", 2, 2, 1, 1e-6}, {"C_blocks", 3, 5, 130, 1e-6},
    {"llamaish", 2, 16, 96, 1e-5}, {"long_row", 1, 2, 8200, 1e-6},  // rows wider than one CUDA block's threads and the CPU's 64-channel blocks
};
// Outputs are O(1); 16-bit errors come from rounding inputs/outputs once (the reference sees the
// rounded inputs). Gradient sums over rows get the same relative tolerance.
inline constexpr DTypeTols kRmsnormTols{{2e-5, 2e-5}, {3e-3, 3e-3}, {2e-2, 2e-2}};

}  // namespace dstrain::test
