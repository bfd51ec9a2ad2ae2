// Case table and naive reference for block quantization (ops/kernels/quantize.h), shared with a
// future CUDA test in tests/gpu/: the packed words must match the reference bit for bit on both
// backends. (Dequantized NaNs are compared as NaN, not by payload: the GPU's 0·NaN may carry
// another one.)
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_test_util.h"

namespace dstrain::test {

struct QuantizeCase {
  const char* name;
  std::int64_t n;
  int bits;
  std::int64_t block;
};
// Block sizes 1, 7, 32, 2048; ragged last blocks; odd n for int4 (a half-filled last byte); an odd
// block with int4 puts two blocks in one byte.
inline constexpr QuantizeCase kQuantizeCases[] = {
    {"empty8", 0, 8, 32},
    {"empty4", 0, 4, 7},
    {"one8", 1, 8, 1},
    {"one4", 1, 4, 1},
    {"b1_8", 13, 8, 1},
    {"b1_4", 13, 4, 1},
    {"b7_8", 50, 8, 7},
    {"b7_4", 51, 4, 7},
    {"b32_8", 32 * 9, 8, 32},
    {"b32_4", 32 * 9 + 3, 4, 32},
    {"b32_ragged8", 1001, 8, 32},
    {"b2048_8", 2048 * 3 + 5, 8, 2048},
    {"b2048_4", 2048 * 2 + 1, 4, 2048},
    {"big4", (1 << 16) + 77, 4, 2048},
    {"big8_odd", (1 << 16) + 3, 8, 999},
};

// The canonical quiet NaN a non-finite block stores as d.
inline constexpr std::uint32_t kQuantNonFiniteD = 0x7fc00000u;

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The header's rule, written independently of the kernels: absmax in double, s = 2^bits / (2·m)
// and d = 1 / s computed in double and rounded to fp32 (a correctly rounded quotient either way:
// double has more than 2·24 + 2 bits), x·s as the exact double product rounded to fp32 (the fp32
// product), rne by std::nearbyint, bytes laid out one by one.
struct QuantRef {
  std::vector<std::int32_t> words;  // the packed message
  std::vector<float> d;             // per block
  std::vector<std::int32_t> q;      // per element
};
inline QuantRef quantize_ref(const std::vector<float>& x, int bits, std::int64_t block) {
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t nb = ceil_div(n, block), vw = ceil_div(n * bits, 32);
  QuantRef r;
  r.d.resize(static_cast<std::size_t>(nb));
  r.q.resize(static_cast<std::size_t>(n));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(vw * 4), 0);
  const double qmax = std::ldexp(1.0, bits - 1) - 1, qmin = -std::ldexp(1.0, bits - 1);
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t begin = b * block, end = std::min(n, begin + block);
    double m = 0;
    bool finite = true;
    for (std::int64_t i = begin; i < end; ++i) {
      const float v = x[static_cast<std::size_t>(i)];
      if (!std::isfinite(v)) finite = false;
      m = std::max(m, std::fabs(static_cast<double>(v)));
    }
    float s = 1.0f, d = 1.0f;
    if (!finite) {
      d = std::bit_cast<float>(kQuantNonFiniteD);
    } else if (m != 0) {
      s = static_cast<float>(std::ldexp(1.0, bits) / (2.0 * m));
      d = static_cast<float>(1.0 / static_cast<double>(s));
    }
    r.d[static_cast<std::size_t>(b)] = d;
    for (std::int64_t i = begin; i < end; ++i) {
      std::int32_t q = 0;
      if (finite) {
        const float p = static_cast<float>(static_cast<double>(x[static_cast<std::size_t>(i)]) * static_cast<double>(s));
        if (!std::isnan(p)) q = static_cast<std::int32_t>(std::clamp(static_cast<double>(std::nearbyint(p)), qmin, qmax));
      }
      r.q[static_cast<std::size_t>(i)] = q;
    }
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t q = r.q[static_cast<std::size_t>(i)];
    if (bits == 8) {
      bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(q & 0xff);
    } else {
      bytes[static_cast<std::size_t>(i / 2)] |= static_cast<std::uint8_t>((q & 0xf) << (4 * (i % 2)));
    }
  }
  r.words.resize(static_cast<std::size_t>(vw + nb));
  if (vw > 0) std::memcpy(r.words.data(), bytes.data(), bytes.size());
  for (std::int64_t b = 0; b < nb; ++b) r.words[static_cast<std::size_t>(vw + b)] = std::bit_cast<std::int32_t>(r.d[static_cast<std::size_t>(b)]);
  return r;
}

// Dequantized element i in fp32: q·d, one fp32 rounding.
inline float dequantize_ref(const QuantRef& r, std::int64_t i, std::int64_t block) {
  return static_cast<float>(r.q[static_cast<std::size_t>(i)]) * r.d[static_cast<std::size_t>(i / block)];
}

// DeepSpeed's CUDAQuantizer.quantize group count (partition_parameters.py), line by line; the
// block is n / groups.
inline std::int64_t deepspeed_groups_ref(std::int64_t numel) {
  const std::int64_t target_group_size = 8000;
  std::int64_t groups = static_cast<std::int64_t>(std::ceil(static_cast<double>(numel) / static_cast<double>(target_group_size)));
  while (groups < numel) {
    if (numel % (8 * groups) == 0) break;
    groups += 1;
  }
  while (true) {
    if (numel % (8 * groups * 2) == 0 && static_cast<double>(numel) / static_cast<double>(groups) > static_cast<double>(target_group_size)) {
      groups = groups * 2;
    } else {
      break;
    }
  }
  return groups;
}

}  // namespace dstrain::test
