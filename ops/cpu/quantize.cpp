// Block quantization, CPU (ops/kernels/quantize.h). Two passes, both parallel: the blocks' scales
// (absmax and the non-finite flag per block), then the value words, one word per iteration. The
// values are packed by word rather than by block because with int4 and an odd block size two
// blocks share a byte: a word is only ever written by one iteration, so there is no race, and
// every value depends only on its block's scale, so nothing depends on the thread count.
#include "ops/kernels/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

// The canonical quiet NaN stored as d for a block holding an inf or a NaN; the CUDA kernel stores
// the same bits (0x7fc00000), so the packed messages of both backends compare equal.
constexpr std::uint32_t kNonFiniteScaleBits = 0x7fc00000u;

void require_bits(std::string_view op, int bits) {
  if (bits != 4 && bits != 8) fail("{}: bits = {} is not supported; use 4 or 8", op, bits);
}
void require_block(std::string_view op, std::int64_t block) {
  if (block < 1) fail("{}: block = {} must be at least 1 (elements per scale)", op, block);
}
void require_n(std::string_view op, std::int64_t n) {
  if (n < 0) fail("{}: n = {} must not be negative", op, n);
}

// One block's quantization scale s and the stored factor d.
struct BlockScale {
  float s;
  float d;
};

// s = 2^bits / (2·m), computed as 2^(bits-1) / m: the same fp32 quotient (halving both operands is
// exact), without 2·m overflowing to inf for m > FLT_MAX / 2 (which would give s = 0 and d = inf,
// a finite block dequantizing to NaN). m below 2^(bits-1) / FLT_MAX makes s overflow to inf: d is
// then 0 and the block (of values < 1e-36) dequantizes to zeros.
BlockScale block_scale(float absmax, bool nonfinite, int bits) {
  if (nonfinite) return {0.0f, std::bit_cast<float>(kNonFiniteScaleBits)};
  if (absmax == 0.0f) return {1.0f, 1.0f};
  const float s = static_cast<float>(1 << (bits - 1)) / absmax;
  return {s, 1.0f / s};
}

// q = clamp(rne(x·s), -2^(bits-1), 2^(bits-1) - 1); 0 for a non-finite block (s = 0 there, and
// x·0 may be NaN) and for a NaN product (s = inf times x = 0). Clamped as a float before the
// conversion, so that the conversion never sees a value out of int range.
inline std::int32_t quantize_value(float x, float s, bool block_nonfinite, int bits) {
  if (block_nonfinite) return 0;
  const float hi = static_cast<float>((1 << (bits - 1)) - 1), lo = -static_cast<float>(1 << (bits - 1));
  float r = std::nearbyint(x * s);  // default rounding mode: to nearest, ties to even
  if (std::isnan(r)) return 0;
  r = r > hi ? hi : r;
  r = r < lo ? lo : r;
  return static_cast<std::int32_t>(r);
}

// The q of element i of a message of n elements (bits 4: a sign-extended nibble).
inline std::int32_t packed_value(const std::uint8_t* bytes, std::int64_t i, int bits) {
  if (bits == 8) return static_cast<std::int8_t>(bytes[i]);
  const std::uint8_t byte = bytes[i >> 1];
  const std::uint32_t nibble = (i & 1) ? (byte >> 4) : (byte & 0x0fu);
  return static_cast<std::int32_t>(nibble ^ 0x8u) - 8;  // two's complement nibble -> int
}

}  // namespace

std::int64_t quantize_block_count(std::int64_t n, std::int64_t block) {
  const char* op = "quantize_block_count";
  require_n(op, n);
  require_block(op, block);
  return n == 0 ? 0 : (n - 1) / block + 1;
}

std::int64_t quantize_value_words(std::int64_t n, int bits) {
  const char* op = "quantize_value_words";
  require_n(op, n);
  require_bits(op, bits);
  const std::int64_t per_word = 32 / bits;
  return n == 0 ? 0 : (n - 1) / per_word + 1;
}

std::int64_t quantize_packed_words(std::int64_t n, int bits, std::int64_t block) {
  return quantize_value_words(n, bits) + quantize_block_count(n, block);
}

void quantize_blocks(Tensor packed, Tensor x, int bits, std::int64_t block) {
  const char* op = "quantize_blocks";
  const bool gpu = cpu::on_cuda(op, {{"packed", packed}, {"x", x}});
  require_bits(op, bits);
  require_block(op, block);
  const std::int64_t n = x.numel();
  if (n > 0) {
    require_present(op, {"x", x});
    require_floating(op, {"x", x});
  }
  require_dtype(op, {"packed", packed}, DType::int32);
  const std::int64_t words = quantize_packed_words(n, bits, block);
  if (packed.numel() < words) {
    fail("{}: tensor 'packed' ({}) has {} elements but {} int32 words are needed for {} elements at {} bits in blocks of {}", op, packed.str(),
         packed.numel(), words, n, bits, block);
  }
  if (n == 0) return;
  require_present(op, {"packed", packed});
  DSTRAIN_RETURN_ON_CUDA(gpu, quantize_blocks(packed, x, bits, block));
  const std::int64_t blocks = quantize_block_count(n, block);
  const std::int64_t value_words = quantize_value_words(n, bits);
  std::int32_t* out = static_cast<std::int32_t*>(packed.data);
  std::vector<float> scale(static_cast<std::size_t>(blocks));
  std::vector<std::uint8_t> nonfinite(static_cast<std::size_t>(blocks));
  cpu::dispatch_float(op, x.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* xs = static_cast<const T*>(x.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t begin = b * block, end = std::min(n, begin + block);
      float m = 0.0f;
      bool bad = false;
      for (std::int64_t i = begin; i < end; ++i) {
        const float v = cpu::load(xs[i]);
        bad |= !std::isfinite(v);
        m = std::max(m, std::fabs(v));  // NaN's maximum is irrelevant: `bad` decides then
      }
      const BlockScale bs = block_scale(m, bad, bits);
      scale[static_cast<std::size_t>(b)] = bs.s;
      nonfinite[static_cast<std::size_t>(b)] = bad ? 1 : 0;
      std::memcpy(out + value_words + b, &bs.d, sizeof(float));
    }
    const std::int64_t per_word = 32 / bits;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (std::int64_t w = 0; w < value_words; ++w) {
      std::uint8_t bytes[4] = {0, 0, 0, 0};  // elements past n stay 0: the zero padding
      const std::int64_t first = w * per_word, last = std::min(n, first + per_word);
      for (std::int64_t i = first; i < last; ++i) {
        const auto b = static_cast<std::size_t>(i / block);
        const std::int32_t q = quantize_value(cpu::load(xs[i]), scale[b], nonfinite[b] != 0, bits);
        const auto k = static_cast<std::size_t>((i - first) * bits / 8);
        if (bits == 8) {
          bytes[k] = static_cast<std::uint8_t>(q);
        } else {
          const auto nibble = static_cast<std::uint8_t>(q & 0xf);
          bytes[k] = static_cast<std::uint8_t>(bytes[k] | ((i & 1) ? nibble << 4 : nibble));
        }
      }
      std::memcpy(out + w, bytes, 4);  // element order is memory order
    }
  });
}

void dequantize_blocks(Tensor out, Tensor packed, int bits, std::int64_t block, bool accumulate) {
  const char* op = "dequantize_blocks";
  const bool gpu = cpu::on_cuda(op, {{"out", out}, {"packed", packed}});
  require_bits(op, bits);
  require_block(op, block);
  const std::int64_t n = out.numel();
  if (n > 0) {
    require_present(op, {"out", out});
    require_floating(op, {"out", out});
  }
  require_dtype(op, {"packed", packed}, DType::int32);
  const std::int64_t words = quantize_packed_words(n, bits, block);
  if (packed.numel() < words) {
    fail("{}: tensor 'packed' ({}) has {} elements but {} int32 words hold {} elements at {} bits in blocks of {}", op, packed.str(), packed.numel(),
         words, n, bits, block);
  }
  if (n == 0) return;
  require_present(op, {"packed", packed});
  DSTRAIN_RETURN_ON_CUDA(gpu, dequantize_blocks(out, packed, bits, block, accumulate));
  const std::int64_t value_words = quantize_value_words(n, bits);
  const auto* bytes = static_cast<const std::uint8_t*>(packed.data);
  const auto* dwords = static_cast<const std::int32_t*>(packed.data) + value_words;
  cpu::dispatch_float(op, out.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    T* o = static_cast<T*>(out.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (std::int64_t i = 0; i < n; ++i) {
      float d;
      std::memcpy(&d, dwords + i / block, sizeof(float));
      const float v = static_cast<float>(packed_value(bytes, i, bits)) * d;  // q·d: exact q, one fp32 rounding
      o[i] = cpu::store<T>(accumulate ? cpu::load(o[i]) + v : v);
    }
  });
}

std::int64_t deepspeed_weight_quant_block(std::int64_t n) {
  if (n <= 0 || n % 8 != 0) {
    fail("deepspeed_weight_quant_block: a partition of {} elements cannot be quantized as DeepSpeed's qwZ does; it needs a positive multiple of 8",
         n);
  }
  constexpr std::int64_t kTarget = 8000;  // CUDAQuantizer.target_group_size
  std::int64_t groups = (n + kTarget - 1) / kTarget;
  while (groups < n && n % (8 * groups) != 0) ++groups;  // stops by n / 8 at the latest
  while (n % (16 * groups) == 0 && n > kTarget * groups) groups *= 2;
  return n / groups;
}

}  // namespace dstrain
