// Case table for encoder (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct EncoderCase {
  const char* name;
  std::int64_t B, T, C, V, maxT;
};
inline constexpr EncoderCase kEncoderCases[] = {
    {"T1", 1, 1, 8, 5, 4},
    {"C_odd", 2, 3, 13, 7, 5},              // C not a multiple of 8
    {"repeated_tokens", 3, 17, 70, 4, 20},  // tiny V: many positions per token; C > one 64-channel block
    {"gpt2ish", 2, 32, 96, 101, 64},
};
// Forward: one add and one rounding. Backward: sums of up to B*T terms in fp32, rounded once.
inline constexpr DTypeTols kEncoderTols{{1e-6, 1e-6}, {1e-3, 2e-3}, {1e-2, 1e-2}};

}  // namespace dstrain::test
