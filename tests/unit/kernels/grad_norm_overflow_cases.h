// Case table for grad_norm_overflow (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct GradNormOverflowCase {
  const char* name;
  std::int64_t n;
};
// Sizes around the block and lane boundaries (4096-element blocks, 8 lanes, at most 256 blocks).
inline constexpr GradNormOverflowCase kGradNormOverflowCases[] = {
    {"one", 1},
    {"seven", 7},
    {"lanes_plus_one", 9},
    {"block_minus_one", 4095},
    {"two_blocks_odd", 8193},
    {"many_blocks", 300001},
    {"over_256_blocks", 256 * 4096 + 17},
};
// Squares summed in double vs a naive double loop: only the summation order differs.
inline constexpr Tol kGradNormOverflowTol{0.0, 1e-12};

}  // namespace dstrain::test
