// Case table for swiglu (shared with the CUDA tests in tests/gpu/).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct SwigluCase {
  const char* name;
  std::int64_t B, T, I;
};
inline constexpr SwigluCase kSwigluCases[] = {
    {"one", 1, 1, 1},
    {"odd", 2, 3, 13},
    {"llamaish", 2, 16, 172},
    {"big", 1, 8, 4099},
};
// Elementwise: one rounding of the output; gate values span the sigmoid's tails (|x| up to 12).
inline constexpr DTypeTols kSwigluTols{{2e-6, 2e-5}, {2e-3, 2e-3}, {1.6e-2, 1.6e-2}};

// silu and its derivative in double: the reference of the SwiGLU ops.
inline double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
inline double silu_grad_ref(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

}  // namespace dstrain::test
