// Helpers private to the CPU kernels (not installed): storage-type dispatch, fp32 load/store,
// branch-free exp/tanh, and the threshold below which loops stay serial.
//
// Kernels are templates over the storage type T (float, fp16_t, bf16_t) and compute in fp32;
// load() widens, store<T>() rounds to nearest even exactly as ops/dtype.h does (so the CPU
// matches CUDA's __float2half_rn / __float2bfloat16_rn), with branch-free fp16 variants so that
// loops over fp16 vectorise. tests/unit/kernels/test_cpu_math.cpp checks them against ops/dtype.h.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "ops/dtype.h"
#include "ops/error.h"

namespace dstrain::cpu {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the storage type for dtype t.
template <typename F>
decltype(auto) dispatch_float(std::string_view op, DType t, F&& f) {
  switch (t) {
    case DType::fp32:
      return f(TypeTag<float>{});
    case DType::fp16:
      return f(TypeTag<fp16_t>{});
    case DType::bf16:
      return f(TypeTag<bf16_t>{});
    default:
      break;
  }
  fail("{}: storage dtype {} is not supported; use fp32, fp16 or bf16", op, dtype_name(t));
}

// Whether a loop of `work` element operations is worth an OpenMP team. Below this, waking the
// threads (and, on a loaded machine, waiting at the barrier for a descheduled one) costs more
// than the loop itself.
inline constexpr bool parallel_worth(std::int64_t work) { return work >= (std::int64_t{1} << 15); }

inline float load(float x) { return x; }
// fp16 -> fp32 without branches, so loops over fp16 vectorise (ops/dtype.h's exact conversion
// normalises subnormals in a loop). Same value for all 65536 patterns (tested exhaustively):
// shifting the exponent+mantissa into fp32 position and multiplying by 2^112 rebiases normals and
// turns fp16 subnormals (read as fp32 subnormals) into their exact value; inf/NaN are patched.
inline float load(fp16_t x) {
  const std::uint32_t h = x.bits;
  const std::uint32_t sign = (h & 0x8000u) << 16;
  const std::uint32_t em = (h & 0x7fffu) << 13;
  const float scaled = std::bit_cast<float>(em) * 0x1p112f;
  const std::uint32_t infnan = ((h & 0x7c00u) == 0x7c00u) ? (0x7f800000u | em) : std::bit_cast<std::uint32_t>(scaled);
  return std::bit_cast<float>(sign | infnan);
}
inline float load(bf16_t x) { return static_cast<float>(x); }

// exp(x) in fp32 without branches or libm calls, so that loops over it vectorise (libm's expf
// does not without -ffast-math). Cephes' expf: x = n ln2 + r with n rounded to nearest by the
// 1.5 * 2^23 trick, a degree-5 polynomial for e^r on |r| <= ln2 / 2, times 2^n built from bits.
// Max relative error ~2 ulp on [-87, 88] (tested); inputs below -87.3 give ~1e-38 (treated as 0
// by the softmax sums), above 88.37 give ~2.4e38 (finite). The upper clamp keeps n <= 127: at
// 88.7 n rounds to 128, whose exponent bits 255 make 2^n infinite (and GELU's backward NaN).
// A NaN input gives NaN: x stays NaN through the clamp (std::max(NaN, b) is NaN), while n is
// computed from xn, whose clamp turns NaN into -87.3 (std::max(a, NaN) is a), because converting a
// NaN n to an integer below is undefined behaviour (UBSan: float-cast-overflow). For every other
// input xn == x.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.37f);  // maxps/minps: no branch
  const float xn = std::min(std::max(-87.3f, x), 88.37f);
  const float n = (xn * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  float r = x - n * 0.693359375f;                                           // ln2 split in two for an exact first product
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const auto bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

// tanh through fast_exp: 1 - 2 / (e^{2x} + 1); saturates correctly at both ends.
inline float fast_tanh(float x) { return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f); }

// fp32 -> fp16 bits, round to nearest even, without branches so that loops storing fp16
// vectorise; bit-identical to ops/dtype.h's fp32_to_fp16_bits (tested over 2^26 patterns that
// cover every exponent and the rounding cases). All three cases are computed and selected:
//   normal:    rebias the exponent and round 13 mantissa bits (carry may overflow into inf);
//   subnormal: adding 0.5 (2^-1) aligns the fp16 subnormal unit (2^-24) with the fp32 ulp, so
//              the FPU's own round-to-nearest-even does the rounding;
//   inf/NaN:   inf, or a quiet NaN keeping the top payload bits.
inline std::uint16_t fp16_bits_rne(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  const std::uint32_t normal = (ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(ax) + 0.5f) - 0x3f000000u;
  const std::uint32_t nan = 0x7e00u | ((ax >> 13) & 0x03ffu);
  std::uint32_t r = ax < 0x38800000u ? sub : normal;
  r = ax >= 0x477ff000u ? 0x7c00u : r;
  r = ax > 0x7f800000u ? nan : r;
  return static_cast<std::uint16_t>(sign | r);
}

template <typename T>
inline T store(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, fp16_t>) {
    return fp16_t::from_bits(fp16_bits_rne(x));
  } else {
    return T(x);
  }
}

}  // namespace dstrain::cpu
