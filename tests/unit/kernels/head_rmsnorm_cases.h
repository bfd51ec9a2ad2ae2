// Case table for head_rmsnorm (Qwen3's q/k norm inside the fused attention input).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct HeadRmsnormCase {
  const char* name;
  std::int64_t B, T, H, D, head0, nheads;
};
inline constexpr HeadRmsnormCase kHeadRmsnormCases[] = {
    {"q_heads", 2, 5, 8, 16, 0, 4},                                     // NH = 4, NKV = 2: heads [0, 4)
    {"k_heads", 2, 5, 8, 16, 4, 2},                                     // heads [4, 6); v [6, 8) untouched
    {"one_head", 1, 1, 3, 8, 1, 1},      {"D_odd", 1, 7, 5, 13, 0, 5},  // every head of the row
    {"qwen3ish", 1, 33, 32, 128, 16, 8},
};
inline constexpr DTypeTols kHeadRmsnormTols{{2e-5, 2e-5}, {3e-3, 3e-3}, {2e-2, 2e-2}};

}  // namespace dstrain::test
