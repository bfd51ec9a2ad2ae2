// Case table for philox / dropout (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

// Random123 kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> output[4].
struct PhiloxKat {
  std::uint32_t ctr[4];
  std::uint32_t key[2];
  std::uint32_t out[4];
};
inline constexpr PhiloxKat kPhiloxKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

struct DropoutCase {
  const char* name;
  std::int64_t n;  // elements (odd sizes exercise the partial last Philox group)
  float p;
};
inline constexpr DropoutCase kDropoutCases[] = {
    {"one", 1, 0.5f},          {"odd7", 7, 0.1f},           {"p0_identity", 1001, 0.0f},
    {"n4099_p01", 4099, 0.1f}, {"n10000_p05", 10000, 0.5f}, {"n3000_p09", 3000, 0.9f},
};
// Dropout only scales by 1/(1-p) and rounds once: exact in fp32 up to one rounding.
inline constexpr DTypeTols kDropoutTols{{0, 1e-6}, {0, 1e-3}, {0, 8e-3}};

struct GeluCase {
  const char* name;
  std::int64_t n;
  double range;  // inputs uniform in [-range, range]
};
inline constexpr GeluCase kGeluCases[] = {{"one", 1, 3.0}, {"odd13", 13, 4.0}, {"n4096", 4096, 6.0}, {"n3001_small", 3001, 0.1}};
inline constexpr DTypeTols kGeluTols{{1e-6, 1e-5}, {1e-4, 2e-3}, {1e-3, 1e-2}};

}  // namespace dstrain::test
