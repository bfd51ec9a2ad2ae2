// Storage types of the kernels that must match ops/dtype.h's conversions bit for bit, NaNs
// included (cast.cu, rank_reduce.cu): load widens exactly, store rounds to nearest even, and a NaN
// keeps its sign and payload bits as the CPU's convert() does, where the hardware conversion
// instructions may return a canonical NaN. `acc` is the type sums accumulate in.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace dstrain::cuda_exact {

struct F32 {
  using storage = float;
  using acc = float;
  __device__ static float load(float x) { return x; }
  __device__ static float store(float f) { return f; }
};

struct F16 {
  using storage = std::uint16_t;
  using acc = float;
  __device__ static float load(std::uint16_t h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0) {  // NaN: exact widening, payload kept
      return __uint_as_float((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | (static_cast<std::uint32_t>(h & 0x03ffu) << 13));
    }
    return __half2float(__ushort_as_half(h));
  }
  __device__ static std::uint16_t store(float f) {
    const std::uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: sign, quiet bit, top payload bits
      return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x03ffu));
    }
    return __half_as_ushort(__float2half_rn(f));
  }
};

struct BF16 {
  using storage = std::uint16_t;
  using acc = float;
  __device__ static float load(std::uint16_t b) { return __uint_as_float(static_cast<std::uint32_t>(b) << 16); }
  __device__ static std::uint16_t store(float f) {
    const std::uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};

}  // namespace dstrain::cuda_exact
