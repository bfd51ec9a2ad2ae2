// Block quantization for ZeRO++ (docs/zero.md §10): symmetric int8 / int4 values with one fp32
// scale per block of consecutive elements, packed into int32 words so that the communicators
// (which move fp32/fp16/bf16/int32) carry them unchanged.
//
// The rule is DeepSpeed's symmetric quantizer (csrc/includes/quantization_utils.h, Params<Symmetric>):
// for a block with absmax m (the largest |x| of its elements),
//   scale s = 2^bits / (2·m)        (m = 0: s = 1)
//   q       = clamp(rne(x·s), −2^(bits−1), 2^(bits−1) − 1)     rne: round to nearest, ties to even
//   stored  d = 1 / s               (the dequantization factor, fp32)
//   x'      = q·d
// so |x − x'| ≤ d/2 inside the range, and the block's largest element, which lands on 2^(bits−1)
// and is clamped, is off by at most d. dstrain's one difference: a block holding an inf or a NaN
// stores d = NaN and q = 0, so it dequantizes to NaN — an fp16 gradient overflow survives the
// quantization and the step's overflow check still sees it (DeepSpeed's s = 0 would give 0·inf).
// The stored NaN is 0x7fc00000 on every backend. All of s, d, x·s and q·d are single fp32
// operations, so their limits are fp32's: a block whose m is below 2^(bits−1) / FLT_MAX (< 4e-37)
// gets s = inf, d = 0 and dequantizes to zeros (the kernels take a NaN x·s, from 0·inf, as q = 0).
//
// Layout of a packed message for n elements, block size b (the last block may be shorter):
//   words [0, value_words(n, bits))          the q values, as bytes in element order: int8 one per
//                                            byte (two's complement); int4 two per byte, element 2i
//                                            in the low nibble, 2i+1 in the high one (two's
//                                            complement nibbles); the last word zero-padded
//   words [value_words, + block_count(n, b)) the blocks' d, one fp32 bit pattern per word
// packed_words(n, bits, b) is the total. Deterministic and thread-count independent (each block is
// independent; CPU and CUDA give the same bits: rne and fp32 products and quotients, no FMA).
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// bits ∈ {4, 8}; b >= 1; n >= 0.
std::int64_t quantize_block_count(std::int64_t n, std::int64_t block);
std::int64_t quantize_value_words(std::int64_t n, int bits);
std::int64_t quantize_packed_words(std::int64_t n, int bits, std::int64_t block);

// packed (int32, at least quantize_packed_words(x.numel(), bits, block) elements; the first that
// many are written) = the quantization of x (fp32 / fp16 / bf16, n = x.numel() elements).
void quantize_blocks(Tensor packed, Tensor x, int bits, std::int64_t block);

// out (fp32 / fp16 / bf16, n = out.numel() elements) = the dequantized values of `packed` (as
// written by quantize_blocks for n elements), or, with accumulate, out += them (computed in fp32,
// rounded once into out's dtype).
void dequantize_blocks(Tensor out, Tensor packed, int bits, std::int64_t block, bool accumulate = false);

// DeepSpeed's qwZ block size for a partition of n elements (partition_parameters.py CUDAQuantizer:
// groups = ceil(n / 8000), raised until n % (8·groups) == 0, then doubled while n % (16·groups) == 0
// and n / groups > 8000): n / groups. n must be a positive multiple of 8 (Error otherwise).
std::int64_t deepspeed_weight_quant_block(std::int64_t n);

}  // namespace dstrain
