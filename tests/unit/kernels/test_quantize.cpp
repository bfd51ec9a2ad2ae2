// Block quantization (ops/kernels/quantize.h) against the naive reference of quantize_cases.h, bit
// for bit on the packed words; hand-computed words for the byte and nibble layout, ties and the
// clamp; non-finite and zero blocks; the round-trip bound; accumulate's single rounding; DeepSpeed's
// qwZ block size; argument errors.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/quantize.h"
#include "quantize_cases.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

constexpr std::int32_t kSentinel = 0x5a5a5a5a;  // words past packed_words must stay untouched

// Quantizes x (as fp32 values) with the kernel; returns the packed words and checks the words past
// the message are untouched.
std::vector<std::int32_t> quantize_fp32(const std::vector<float>& x, int bits, std::int64_t block) {
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t words = quantize_packed_words(n, bits, block);
  std::vector<float> xs = x;
  std::vector<std::int32_t> packed(static_cast<std::size_t>(words + 3), kSentinel);
  quantize_blocks(Tensor(packed.data(), DType::int32, Shape{words + 3}), Tensor(xs.data(), DType::fp32, Shape{n}), bits, block);
  for (std::int64_t w = words; w < words + 3; ++w) EXPECT_EQ(packed[static_cast<std::size_t>(w)], kSentinel) << "word " << w << " written";
  packed.resize(static_cast<std::size_t>(words));
  return packed;
}

std::vector<float> dequantize_fp32(std::vector<std::int32_t> packed, std::int64_t n, int bits, std::int64_t block) {
  std::vector<float> out(static_cast<std::size_t>(n), -7.0f);
  dequantize_blocks(Tensor(out.data(), DType::fp32, Shape{n}), Tensor(packed.data(), DType::int32, Shape{static_cast<std::int64_t>(packed.size())}),
                    bits, block);
  return out;
}

std::int32_t bits_of(float f) { return std::bit_cast<std::int32_t>(f); }

// v rounded to the storage dtype, as the kernels store it.
double stored(DType dt, float v) {
  switch (dt) {
    case DType::fp16:
      return static_cast<float>(fp16_t(v));
    case DType::bf16:
      return static_cast<float>(bf16_t(v));
    default:
      return v;
  }
}

}  // namespace

TEST(Quantize, SizesFollowTheLayout) {
  EXPECT_EQ(quantize_block_count(0, 7), 0);
  EXPECT_EQ(quantize_block_count(7, 7), 1);
  EXPECT_EQ(quantize_block_count(8, 7), 2);
  EXPECT_EQ(quantize_value_words(0, 8), 0);
  EXPECT_EQ(quantize_value_words(1, 8), 1);
  EXPECT_EQ(quantize_value_words(4, 8), 1);
  EXPECT_EQ(quantize_value_words(5, 8), 2);
  EXPECT_EQ(quantize_value_words(8, 4), 1);
  EXPECT_EQ(quantize_value_words(9, 4), 2);
  EXPECT_EQ(quantize_packed_words(9, 4, 4), 2 + 3);
  EXPECT_EQ(quantize_packed_words(0, 4, 4), 0);
}

class QuantizeTest : public ::testing::TestWithParam<DType> {};

// Every case, with a zero block, +inf, NaN and -inf blocks where there are enough blocks: packed
// words bit for bit, dequantized values bit for bit, non-finite blocks NaN, the others finite.
TEST_P(QuantizeTest, MatchesNaiveReferenceBitForBit) {
  const DType dt = GetParam();
  std::mt19937_64 rng(71);
  for (const QuantizeCase& c : kQuantizeCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.n, nb = ceil_div(n, c.block);
    Buf x(dt, n);
    std::uniform_real_distribution<double> mag(-6, 6), u(-1, 1);
    for (std::int64_t b = 0; b < nb; ++b) {
      const double scale = std::exp2(mag(rng));  // blocks of very different magnitudes
      for (std::int64_t i = b * c.block; i < std::min(n, (b + 1) * c.block); ++i) x.set(i, scale * u(rng));
    }
    std::vector<bool> nonfinite(static_cast<std::size_t>(nb), false);
    if (nb >= 5) {
      for (std::int64_t i = c.block; i < std::min(n, 2 * c.block); ++i) x.set(i, 0.0);  // block 1: zeros
      const double inf = std::numeric_limits<double>::infinity();
      x.set(2 * c.block + (c.block - 1) / 2, inf);
      x.set(3 * c.block, std::numeric_limits<double>::quiet_NaN());
      x.set(4 * c.block + c.block - 1 < n ? 4 * c.block + c.block - 1 : n - 1, -inf);
      nonfinite[2] = nonfinite[3] = nonfinite[4] = true;
    }
    std::vector<float> xv(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) xv[static_cast<std::size_t>(i)] = static_cast<float>(x.get(i));
    const QuantRef ref = quantize_ref(xv, c.bits, c.block);

    const std::int64_t words = quantize_packed_words(n, c.bits, c.block);
    ASSERT_EQ(words, static_cast<std::int64_t>(ref.words.size()));
    std::vector<std::int32_t> packed(static_cast<std::size_t>(words + 2), kSentinel);
    quantize_blocks(Tensor(packed.data(), DType::int32, Shape{words + 2}), x.tensor(Shape{n}), c.bits, c.block);
    for (std::int64_t w = 0; w < words; ++w)
      ASSERT_EQ(packed[static_cast<std::size_t>(w)], ref.words[static_cast<std::size_t>(w)]) << "word " << w << " of " << words;
    EXPECT_EQ(packed[static_cast<std::size_t>(words)], kSentinel);

    Buf out(dt, n);
    dequantize_blocks(out.tensor(Shape{n}), Tensor(packed.data(), DType::int32, Shape{words + 2}), c.bits, c.block);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto b = static_cast<std::size_t>(i / c.block);
      const double want = stored(dt, dequantize_ref(ref, i, c.block));
      if (nonfinite[b]) {
        ASSERT_TRUE(std::isnan(out.get(i))) << "element " << i << " of a non-finite block";
      } else {
        ASSERT_TRUE(std::isfinite(out.get(i))) << "element " << i;
        ASSERT_EQ(out.get(i), want) << "element " << i;
      }
    }
    if (nb >= 5) {
      for (std::int64_t i = c.block; i < std::min(n, 2 * c.block); ++i) ASSERT_EQ(out.get(i), 0.0) << "zero block element " << i;
      EXPECT_EQ(packed[static_cast<std::size_t>(quantize_value_words(n, c.bits) + 1)], bits_of(1.0f)) << "zero block: d = 1";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, QuantizeTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

// The layout by hand: bytes in element order, int4 element 2i in the low nibble, two's complement,
// the absmax element clamped to 2^(bits-1) - 1, the last word zero-padded, then d.
TEST(Quantize, HandComputedWords) {
  // m = 8: int4 s = 16 / 16 = 1, q = x (8 clamps to 7); int8 s = 256 / 16 = 16, q = 16·x (128 -> 127).
  const std::vector<float> x{8, -8, 1, -1, 2, 3, -4, 0};
  // int4 nibbles 7 8 1 F 2 3 C 0 -> bytes 87 F1 32 0C -> little-endian word 0x0C32F187.
  EXPECT_EQ(quantize_fp32(x, 4, 8), (std::vector<std::int32_t>{0x0C32F187, bits_of(1.0f)}));
  // int8 bytes 7F 80 10 F0 | 20 30 C0 00.
  EXPECT_EQ(quantize_fp32(x, 8, 8), (std::vector<std::int32_t>{static_cast<std::int32_t>(0xF010807Fu), 0x00C03020, bits_of(0.0625f)}));
  // n = 3, int4: the last byte half filled, the rest of the word zero. m = 1, s = 8: 1 -> 7, -1 -> -8.
  EXPECT_EQ(quantize_fp32({1, -1, 1}, 4, 4), (std::vector<std::int32_t>{0x00000787, bits_of(0.125f)}));
  // Two blocks sharing a byte (block 3, int4): [1, -1, 1 | 2, -2, 1]: block 1 m = 2, s = 4: 2 -> 7,
  // -2 -> -8, 1 -> 4. Nibbles 7 8 7 | 7 8 4 -> bytes 87 77 48.
  EXPECT_EQ(quantize_fp32({1, -1, 1, 2, -2, 1}, 4, 3), (std::vector<std::int32_t>{0x00487787, bits_of(0.125f), bits_of(0.25f)}));
}

// Exact ties x·s = k + 1/2 round to even, in both directions of sign.
TEST(Quantize, TiesRoundToEven) {
  // int8, m = 128: s = 1, q = rne(x). 128 -> 127 (clamp).
  const std::vector<float> x8{128, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f};
  // q: 127 0 2 2 0 -2 -2 4 -> bytes 7F 00 02 02 | 00 FE FE 04.
  EXPECT_EQ(quantize_fp32(x8, 8, 8), (std::vector<std::int32_t>{0x0202007F, 0x04FEFE00, bits_of(1.0f)}));
  // int4, m = 8: s = 1. q: 7 0 2 2 -2 -4 6 -8 -> nibbles 7 0 2 2 E C 6 8 -> bytes 07 22 CE 86.
  const std::vector<float> x4{8, 0.5f, 1.5f, 2.5f, -2.5f, -3.5f, 6.5f, -8};
  EXPECT_EQ(quantize_fp32(x4, 4, 8), (std::vector<std::int32_t>{static_cast<std::int32_t>(0x86CE2207u), bits_of(1.0f)}));
}

// A block of zeros stores d = 1 and q = 0 and dequantizes to exact +0; a non-finite block stores
// the canonical NaN and q = 0 and dequantizes to NaN while its neighbours are untouched.
TEST(Quantize, ZeroAndNonFiniteBlocks) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const int bits : {4, 8}) {
    SCOPED_TRACE(bits);
    const std::vector<float> x{0, -0.0f, 0, 0, 1, inf, 2, 3, -inf, 1, 1, 1, nan, 0, 0, 0, 4, -4, 2, 1};
    const std::int64_t block = 4, n = static_cast<std::int64_t>(x.size());
    const auto packed = quantize_fp32(x, bits, block);
    const std::int64_t vw = quantize_value_words(n, bits);
    EXPECT_EQ(packed[static_cast<std::size_t>(vw + 0)], bits_of(1.0f));
    for (const std::int64_t b : {1, 2, 3}) EXPECT_EQ(static_cast<std::uint32_t>(packed[static_cast<std::size_t>(vw + b)]), kQuantNonFiniteD);
    EXPECT_EQ(packed, quantize_ref(x, bits, block).words);
    const auto out = dequantize_fp32(packed, n, bits, block);
    for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(bits_of(out[static_cast<std::size_t>(i)]), 0) << "exact +0 at " << i;
    for (std::int64_t i = 4; i < 16; ++i) EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(i)])) << i;
    const float d = std::ldexp(1.0f, 2 - (bits - 1));                   // m = 4: s = 2^(bits-1) / 4, d = 4 / 2^(bits-1)
    EXPECT_EQ(out[16], static_cast<float>((1 << (bits - 1)) - 1) * d);  // the clamped absmax
    EXPECT_EQ(out[17], -4.0f);
    EXPECT_EQ(out[18], 2.0f);
    EXPECT_EQ(out[19], 1.0f);
  }
}

// Extreme magnitudes: m = FLT_MAX (2·m would overflow fp32) still gives a finite block; a block of
// values below 2^(bits-1) / FLT_MAX gets s = inf, d = 0 and dequantizes to zeros.
TEST(Quantize, ExtremeMagnitudes) {
  const float big = std::numeric_limits<float>::max();
  for (const int bits : {4, 8}) {
    SCOPED_TRACE(bits);
    const std::vector<float> x{big, -big / 3, 1.0f, 0.0f, 1e-39f, -1e-40f, 0.0f, 1e-45f};
    const auto packed = quantize_fp32(x, bits, 4);
    EXPECT_EQ(packed, quantize_ref(x, bits, 4).words);
    const auto out = dequantize_fp32(packed, 8, bits, 4);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(std::isfinite(out[i])) << i;
    EXPECT_GT(out[0], big / 2);
    for (std::size_t i = 4; i < 8; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  }
}

// |x - x'| <= d/2 inside the range, <= d where x·s lies above 2^(bits-1) - 1/2 and is clamped
// (the block's absmax always is), up to the fp32 roundings of s, d, x·s and q·d (|x|·2^-20).
TEST(Quantize, RoundTripErrorBound) {
  std::mt19937_64 rng(72);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int bits : {4, 8}) {
    for (const std::int64_t block : {1, 7, 32, 2048}) {
      SCOPED_TRACE(testing::Message() << "bits " << bits << " block " << block);
      const std::int64_t n = 3 * block + 5;
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& v : x) v = u(rng) * 37.0f;
      const auto packed = quantize_fp32(x, bits, block);
      const auto out = dequantize_fp32(packed, n, bits, block);
      const std::int64_t vw = quantize_value_words(n, bits);
      for (std::int64_t b = 0; b * block < n; ++b) {
        const std::int64_t begin = b * block, end = std::min(n, begin + block);
        float m = 0;
        for (std::int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(x[static_cast<std::size_t>(i)]));
        const double d = std::bit_cast<float>(packed[static_cast<std::size_t>(vw + b)]);
        for (std::int64_t i = begin; i < end; ++i) {
          const double xi = x[static_cast<std::size_t>(i)], err = std::fabs(xi - out[static_cast<std::size_t>(i)]);
          const double top = std::ldexp(1.0, bits - 1) - 0.5;  // x·s above this is clamped
          const bool clamped = xi / d > top * (1 - std::ldexp(1.0, -20));
          if (xi == m) {
            ASSERT_TRUE(clamped) << "the absmax element " << i;
          }
          const double bound = (clamped ? d : d / 2) + std::fabs(xi) * std::ldexp(1.0, -20);
          ASSERT_LE(err, bound) << "element " << i << " x " << xi << " x' " << out[static_cast<std::size_t>(i)];
        }
      }
    }
  }
}

// accumulate: out += q·d added in fp32 and rounded once into out's dtype (not q·d rounded to the
// dtype first).
TEST_P(QuantizeTest, AccumulateAddsInFp32AndRoundsOnce) {
  const DType dt = GetParam();
  std::mt19937_64 rng(73);
  const std::int64_t n = 1000, block = 33;
  std::vector<float> x(static_cast<std::size_t>(n));
  std::uniform_real_distribution<float> u(-3, 3);
  for (float& v : x) v = u(rng);
  for (const int bits : {4, 8}) {
    SCOPED_TRACE(bits);
    const QuantRef ref = quantize_ref(x, bits, block);
    std::vector<std::int32_t> packed = quantize_fp32(x, bits, block);
    Buf out(dt, n);
    out.fill_uniform(rng, -100, 100);
    const std::vector<double> before = out.values();
    dequantize_blocks(out.tensor(Shape{n}), Tensor(packed.data(), DType::int32, Shape{static_cast<std::int64_t>(packed.size())}), bits, block,
                      /*accumulate=*/true);
    for (std::int64_t i = 0; i < n; ++i) {
      const float sum = static_cast<float>(before[static_cast<std::size_t>(i)]) + dequantize_ref(ref, i, block);
      ASSERT_EQ(out.get(i), stored(dt, sum)) << "element " << i;
    }
  }
}

// q·d = 1 + 2^-11 added to an fp16 2048: in fp32 2049.00048828125, one rounding (fp16 spacing 2
// there) gives 2050. Rounding q·d to fp16 first gives 1 (a tie, to even), then 2048 + 1 = 2049 is
// a tie again and gives 2048. The message is built by hand: q = 1 (int8), d = 1 + 2^-11.
TEST(Quantize, AccumulateSingleRoundingFp16) {
  std::vector<std::int32_t> packed{0x00000001, bits_of(1.0f + std::ldexp(1.0f, -11))};
  fp16_t o(2048.0f);
  dequantize_blocks(Tensor(&o, DType::fp16, Shape{1}), Tensor(packed.data(), DType::int32, Shape{2}), 8, 1, true);
  EXPECT_EQ(static_cast<float>(o), 2050.0f);
}

TEST(Quantize, DeepSpeedWeightBlock) {
  // By hand: 8008 = 8·7·11·13 -> 7 groups; 123456 = 8·15432 -> 24 groups; 2^20 -> 256 groups.
  EXPECT_EQ(deepspeed_weight_quant_block(8), 8);
  EXPECT_EQ(deepspeed_weight_quant_block(4096), 4096);
  EXPECT_EQ(deepspeed_weight_quant_block(8000), 8000);
  EXPECT_EQ(deepspeed_weight_quant_block(8008), 1144);
  EXPECT_EQ(deepspeed_weight_quant_block(16000), 8000);
  EXPECT_EQ(deepspeed_weight_quant_block(123456), 5144);
  EXPECT_EQ(deepspeed_weight_quant_block(1 << 20), 4096);
  for (const std::int64_t n : {std::int64_t{8}, std::int64_t{16}, std::int64_t{4096}, std::int64_t{8000}, std::int64_t{8008}, std::int64_t{16000},
                               std::int64_t{123456}, std::int64_t{1} << 20, std::int64_t{768} * 3072, std::int64_t{50257} * 8,
                               std::int64_t{4096} * 11008, std::int64_t{8} * 8191, std::int64_t{64000} * 3}) {
    const std::int64_t groups = deepspeed_groups_ref(n);
    ASSERT_EQ(n % groups, 0) << n;
    EXPECT_EQ(deepspeed_weight_quant_block(n), n / groups) << "n = " << n;
  }
  for (std::int64_t n = 8; n <= 200000; n += 8 * 37) EXPECT_EQ(deepspeed_weight_quant_block(n), n / deepspeed_groups_ref(n)) << "n = " << n;
  expect_error([] { deepspeed_weight_quant_block(0); }, {"deepspeed_weight_quant_block", "0", "multiple of 8"});
  expect_error([] { deepspeed_weight_quant_block(12); }, {"deepspeed_weight_quant_block", "12", "multiple of 8"});
  expect_error([] { deepspeed_weight_quant_block(-8); }, {"deepspeed_weight_quant_block", "-8"});
}

TEST(Quantize, BadArgumentsNameTheOpAndTensor) {
  std::vector<float> x(10, 1.0f), f(10, 0.0f);
  std::vector<std::int32_t> p(16, 0);
  const Tensor xt(x.data(), DType::fp32, Shape{10}), pt(p.data(), DType::int32, Shape{16});
  expect_error([&] { quantize_blocks(Tensor(f.data(), DType::fp32, Shape{10}), xt, 8, 4); }, {"quantize_blocks", "packed", "int32"});
  expect_error([&] { quantize_blocks(pt, Tensor(p.data(), DType::int32, Shape{10}), 8, 4); }, {"quantize_blocks", "'x'", "fp32, fp16 or bf16"});
  // 10 elements at 8 bits in blocks of 4: 3 value words + 3 scales = 6.
  expect_error([&] { quantize_blocks(Tensor(p.data(), DType::int32, Shape{5}), xt, 8, 4); }, {"quantize_blocks", "packed", "5", "6"});
  expect_error([&] { quantize_blocks(pt, xt, 5, 4); }, {"quantize_blocks", "bits", "5"});
  expect_error([&] { quantize_blocks(pt, xt, 8, 0); }, {"quantize_blocks", "block", "0"});
  expect_error([&] { dequantize_blocks(Tensor(p.data(), DType::int32, Shape{10}), pt, 8, 4); }, {"dequantize_blocks", "'out'", "fp32, fp16 or bf16"});
  expect_error([&] { dequantize_blocks(Tensor(f.data(), DType::fp32, Shape{10}), Tensor(f.data(), DType::fp32, Shape{10}), 8, 4); },
               {"dequantize_blocks", "packed", "int32"});
  // 10 elements at 4 bits in blocks of 4: 2 value words + 3 scales = 5.
  expect_error([&] { dequantize_blocks(Tensor(f.data(), DType::fp32, Shape{10}), Tensor(p.data(), DType::int32, Shape{4}), 4, 4); },
               {"dequantize_blocks", "packed", "4", "5"});
  expect_error([&] { dequantize_blocks(Tensor(f.data(), DType::fp32, Shape{10}), pt, 2, 4); }, {"dequantize_blocks", "bits", "2"});
  expect_error([&] { dequantize_blocks(Tensor(f.data(), DType::fp32, Shape{10}), pt, 4, -1); }, {"dequantize_blocks", "block", "-1"});
  expect_error([] { quantize_packed_words(8, 16, 4); }, {"bits", "16"});
  expect_error([] { quantize_block_count(8, 0); }, {"block", "0"});
}
