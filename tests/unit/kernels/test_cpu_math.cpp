// The CPU kernels' private math helpers (ops/cpu/cpu_common.h): the branch-free fp16 load must
// equal ops/dtype.h's exact conversion for every bit pattern, and fast_exp / fast_tanh must stay
// within a few ulp of libm.
#include <cmath>
#include <cstdint>

#include <gtest/gtest.h>

#include "ops/cpu/cpu_common.h"

using namespace dstrain;

TEST(CpuMath, Fp16LoadIsExactForAllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float want = fp16_bits_to_fp32(static_cast<std::uint16_t>(b));
    const float got = cpu::load(fp16_t::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << b;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << std::hex << b;
    }
  }
}

TEST(CpuMath, FastExpRelativeError) {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.001) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::abs(cpu::fast_exp(xf) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp of fp32
  EXPECT_EQ(cpu::fast_exp(0.0f), 1.0f);
  // Saturates finite: never inf (an inf e^x turns GELU's backward into NaN).
  for (float big : {88.37f, 88.7f, 100.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_TRUE(std::isfinite(cpu::fast_exp(big))) << big;
    EXPECT_GT(cpu::fast_exp(big), 1e38f) << big;
  }
  EXPECT_LT(cpu::fast_exp(-1000.0f), 1e-37f);
  EXPECT_LT(cpu::fast_exp(-std::numeric_limits<float>::infinity()), 1e-37f);
  // NaN in, NaN out: a NaN logit must reach the loss. (That no NaN is converted to an integer on
  // the way is checked where the kernels are compiled with UBSan: the gate's overflow tests feed
  // the library's GELU and softmax NaN, which is how clang's float-cast-overflow check found it.)
  EXPECT_TRUE(std::isnan(cpu::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu::fast_tanh(std::numeric_limits<float>::quiet_NaN())));
}

TEST(CpuMath, FastTanhAbsoluteError) {
  double worst = 0;
  for (double x = -20.0; x <= 20.0; x += 0.0007) {
    const float xf = static_cast<float>(x);
    worst = std::max(worst, std::abs(cpu::fast_tanh(xf) - std::tanh(static_cast<double>(xf))));
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(cpu::fast_tanh(100.0f), 1.0f);
  EXPECT_EQ(cpu::fast_tanh(-100.0f), -1.0f);
}

TEST(CpuMath, Fp16StoreMatchesExactConversion) {
  // Every pattern of the top 24 bits (all signs, exponents and leading mantissa bits), with low
  // bytes that make exact ties, just-above-ties and sticky bits, plus the special values.
  for (std::uint32_t hi = 0; hi < (1u << 24); ++hi) {
    for (std::uint32_t lo : {0x00u, 0x01u, 0x80u, 0xffu}) {
      const float f = std::bit_cast<float>((hi << 8) | lo);
      const std::uint16_t want = fp32_to_fp16_bits(f);
      const std::uint16_t got = cpu::fp16_bits_rne(f);
      if (got != want) {
        ASSERT_EQ(got, want) << "fp32 bits " << std::hex << ((hi << 8) | lo);
      }
    }
  }
}
