// Stochastic rounding of fp32 to bf16 (llm.c's adamw): x rounds up in magnitude with probability
// equal to its distance from the lower bf16 neighbour, so the rounding is unbiased on average.
// Host and device share this one definition, so the CPU and the GPU round the same bits the same
// way given the same random word.
#pragma once

#include <cstdint>

#include "ops/kernels/philox.h"

namespace dstrain {

// bits: an fp32 bit pattern; random: any 32-bit word (its low 16 bits are used). Inf and NaN
// (exponent all ones) are returned unrounded-to-nearest by the caller: this is for finite values,
// where adding below the kept 16 bits and truncating is exactly "up with probability frac".
DSTRAIN_HOST_DEVICE constexpr std::uint16_t bf16_bits_stochastic(std::uint32_t bits, std::uint32_t random) {
  return static_cast<std::uint16_t>((bits + (random & 0xFFFFu)) >> 16);
}

DSTRAIN_HOST_DEVICE constexpr bool fp32_bits_finite(std::uint32_t bits) { return (bits & 0x7f800000u) != 0x7f800000u; }

}  // namespace dstrain
