// DType: the element types dstrain stores, and exact conversions between them.
//
// Compute is fp32; fp16 and bf16 are storage formats. Conversions to 16 bits round to nearest,
// ties to even, as CUDA's __float2half_rn / __float2bfloat16_rn do, so the CPU reference and the
// GPU produce the same bits. Infinities stay infinite, values past the largest finite fp16 (65504,
// rounding boundary 65520) become inf, and fp16 subnormals are exact.
//
// NaN policy (ops/cuda/cast.cu follows it bit for bit, whatever the hardware's own NaN rule is):
//   narrowing fp32 -> fp16/bf16: NaN stays NaN of the same sign, made quiet, keeping the top
//     payload bits that fit (so a signalling NaN whose payload sits in the low bits cannot collapse
//     into inf);
//   widening fp16/bf16 -> fp32: exact, payload and quiet bit kept (bf16 is the top half of fp32,
//     and an exact widening lets fp16 -> fp32 -> fp16 return every quiet NaN unchanged).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dstrain {

// fp64 is not a storage or compute format of the layers: it carries the step's global sums (norm²,
// overflow count, loss) through the communicators, which reduce it in double.
enum class DType : std::uint8_t { fp32, fp16, bf16, int32, uint16, fp64 };

// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::fp32:
      return 4;
    case DType::fp16:
      return 2;
    case DType::bf16:
      return 2;
    case DType::int32:
      return 4;
    case DType::uint16:
      return 2;
    case DType::fp64:
      return 8;
  }
  return 0;
}

// Canonical short names: "fp32", "fp16", "bf16", "int32", "uint16", "fp64".
std::string_view dtype_name(DType t);

// Accepts (fp64 excepted: no config or file names it) the canonical names and the spellings DeepSpeed and PyTorch use: "float32", "float",
// "fp16", "float16", "half", "bf16", "bfloat16", "int32", "int", "uint16". Throws Error naming the
// value and the accepted names otherwise.
DType parse_dtype(std::string_view name);

constexpr bool is_floating(DType t) { return t == DType::fp32 || t == DType::fp16 || t == DType::bf16; }

// ---- bit-exact scalar conversions (inline: they sit in the kernels' inner loops) ----

constexpr std::uint16_t fp32_to_bf16_bits(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even; overflow carries into inf
  return static_cast<std::uint16_t>(u >> 16);
}

constexpr float bf16_bits_to_fp32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

constexpr std::uint16_t fp32_to_fp16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x03ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                                                   // normal in fp16 (>= 2^-14): rebias exponent 127 -> 15, round 13 bits
    std::uint32_t r = ax - 0x38000000u;
    r += 0x0fffu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25: rounds to (signed) zero; 2^-25 is a tie -> even
  // fp16 subnormal: value = m * 2^(e-150), unit 2^-24, so q = m >> (126 - e), rounded to even.
  const std::uint32_t e = ax >> 23;
  const std::uint32_t m = (ax & 0x007fffffu) | 0x00800000u;
  const std::uint32_t shift = 126u - e;  // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: still right
  return static_cast<std::uint16_t>(sign | q);
}

constexpr float fp16_bits_to_fp32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x03ffu;
  if (exp == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise the mantissa.
  std::uint32_t e = 113u;
  while ((mant & 0x0400u) == 0) {
    mant <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((mant & 0x03ffu) << 13));
}

// Storage types with no arithmetic: kernels load them into float, compute, and store back.
struct fp16_t {
  std::uint16_t bits = 0;
  fp16_t() = default;
  explicit constexpr fp16_t(float f) : bits(fp32_to_fp16_bits(f)) {}
  constexpr operator float() const { return fp16_bits_to_fp32(bits); }
  static constexpr fp16_t from_bits(std::uint16_t b) {
    fp16_t h;
    h.bits = b;
    return h;
  }
};
struct bf16_t {
  std::uint16_t bits = 0;
  bf16_t() = default;
  explicit constexpr bf16_t(float f) : bits(fp32_to_bf16_bits(f)) {}
  constexpr operator float() const { return bf16_bits_to_fp32(bits); }
  static constexpr bf16_t from_bits(std::uint16_t b) {
    bf16_t h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(fp16_t) == 2 && sizeof(bf16_t) == 2);

// The DType of a C++ storage type, for templated kernels.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::fp32;
}
template <>
constexpr DType dtype_of<fp16_t>() {
  return DType::fp16;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::int32;
}
template <>
constexpr DType dtype_of<std::uint16_t>() {
  return DType::uint16;
}

// Converts n floating-point elements between any two of fp32 / fp16 / bf16 (same type: a copy;
// src and dst must not overlap unless they are the same type). Throws Error when either dtype is an
// integer type, also when both are the same integer type: token ids are never "converted".
// n == 0 does nothing (null pointers allowed).
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

}  // namespace dstrain
