// Case table for matmul (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct MatmulCase {
  const char* name;
  std::int64_t BT, C, OC;
  bool bias;
};
inline constexpr MatmulCase kMatmulCases[] = {
    {"1x1x1", 1, 1, 1, true},      {"odd", 3, 13, 7, true},
    {"no_bias", 5, 9, 11, false},  {"crosses_tiles", 300, 40, 520, true},  // BT and OC both cross the 256-row tile
    {"long_K", 17, 600, 33, true},
};
// Tolerance on values scaled by sqrt(K) (K = reduction length): inputs are uniform in [-1, 1].
// fp32: sgemm vs double; 16-bit: one rounding of the output (the reference sees rounded inputs).
inline constexpr DTypeTols kMatmulTols{{2e-5, 1e-5}, {1e-3, 2e-3}, {8e-3, 1e-2}};

}  // namespace dstrain::test
