// Case table for rope (shared with the CUDA tests in tests/gpu/), and the double-precision
// reference rotation both use.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_test_util.h"
#include "ops/kernels/rope.h"

namespace dstrain::test {

struct RopeCase {
  const char* name;
  std::int64_t B, T, H, rotate_heads, D, pos_offset;
  double theta;
  RopeScaling scaling;
};
inline const RopeCase kRopeCases[] = {
    {"D2", 1, 3, 1, 1, 2, 0, 10000.0, {}},
    {"qkv_gqa", 2, 5, 8, 6, 16, 0, 10000.0, {}},  // NH 4 + NKV 2 rotated, the 2 v heads copied
    {"linear", 1, 7, 2, 2, 8, 3, 10000.0, {RopeScaling::Kind::linear, 4.0}},
    {"llama3", 2, 9, 3, 2, 16, 0, 500000.0, {RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 64.0}},
    {"long", 1, 300, 2, 2, 64, 1000, 10000.0, {}},  // large angles: positions up to 1299
};
// Outputs are O(1); the angle's fp32 product is the same on every backend, its cos/sin within an
// ulp or two; 16-bit errors come from one rounding of the output.
inline constexpr DTypeTols kRopeTols{{2e-5, 2e-5}, {2e-3, 2e-3}, {1.6e-2, 1.6e-2}};

// Rotate-half in double with angle = fp32(position * inv_freq[j]) (as Hugging Face's fp32
// product). sign -1: the transposed rotation.
inline std::vector<double> rope_ref(const std::vector<double>& x, const std::vector<float>& inv_freq, const RopeCase& c, double sign) {
  std::vector<double> y = x;
  const std::int64_t h = c.D / 2;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t hd = 0; hd < c.rotate_heads; ++hd)
        for (std::int64_t j = 0; j < h; ++j) {
          const auto k = static_cast<std::size_t>(((b * c.T + t) * c.H + hd) * c.D + j);
          const double a = static_cast<double>(static_cast<float>(t + c.pos_offset) * inv_freq[static_cast<std::size_t>(j)]);
          const double co = std::cos(a), si = sign * std::sin(a);
          y[k] = x[k] * co - x[k + static_cast<std::size_t>(h)] * si;
          y[k + static_cast<std::size_t>(h)] = x[k + static_cast<std::size_t>(h)] * co + x[k] * si;
        }
  return y;
}

}  // namespace dstrain::test
