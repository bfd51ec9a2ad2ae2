// DType: names, sizes, and the bit-exact fp32 <-> fp16 <-> bf16 conversions.
//
// Every expectation comes from an independent reference, never from the code under test:
//   - decoders that build each 16-bit value with std::ldexp from its sign / exponent / mantissa
//     fields (IEEE 754 binary16; bfloat16 = binary32 with 7 mantissa bits);
//   - an encoder that finds the nearest 16-bit value by binary search over the sorted table of all
//     finite values (decoded as above), ties to the even bit pattern, in double arithmetic; the
//     value one step past the largest finite one stands for inf, so overflow rounds exactly as
//     IEEE round-to-nearest-even with an unbounded exponent does (65520 -> inf);
//   - hand-written IEEE bit patterns.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ops/dtype.h"
#include "ops/error.h"

using namespace dstrain;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

// ---- independent decoders (double; NaN only as a class) ----

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double ref_fp16_value(std::uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v;
  if (e == 0x1f)
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);  // subnormal: m * 2^-24
  else
    v = std::ldexp(static_cast<double>(1024 + m), e - 15 - 10);  // (1.m) * 2^(e-15)
  return sign ? -v : v;
}

// bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double ref_bf16_value(std::uint16_t b) {
  const int sign = b >> 15, e = (b >> 7) & 0xff, m = b & 0x7f;
  double v;
  if (e == 0xff)
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), -126 - 7);
  else
    v = std::ldexp(static_cast<double>(128 + m), e - 127 - 7);
  return sign ? -v : v;
}

// ---- independent encoder: nearest value in a table, ties to the even pattern ----

struct Format16 {
  std::vector<double> values;  // values[p] for p = 0 .. inf_bits (the last one stands for inf)
  std::uint16_t inf_bits;
};

Format16 make_format(std::uint16_t inf_bits, double (*decode)(std::uint16_t), double past_max) {
  Format16 f;
  f.inf_bits = inf_bits;
  for (std::uint32_t p = 0; p < inf_bits; ++p) f.values.push_back(decode(static_cast<std::uint16_t>(p)));
  f.values.push_back(past_max);  // one ulp past the largest finite value: where rounding reaches inf
  return f;
}

const Format16& fp16_format() {
  static const Format16 f = make_format(0x7c00, ref_fp16_value, 65536.0);
  return f;
}
const Format16& bf16_format() {
  static const Format16 f = make_format(0x7f80, ref_bf16_value, std::ldexp(1.0, 128));
  return f;
}

// Rounds a finite or infinite non-NaN double to the format, as IEEE round-to-nearest-even.
std::uint16_t ref_round(double x, const Format16& f) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= f.values.back()) return sign | f.inf_bits;
  // values is strictly increasing: hi = first value > a, lo = the one before.
  const auto it = std::upper_bound(f.values.begin(), f.values.end(), a);
  const auto hi = static_cast<std::uint16_t>(it - f.values.begin());
  const auto lo = static_cast<std::uint16_t>(hi - 1);
  const double dlo = a - f.values[lo], dhi = f.values[hi] - a;
  std::uint16_t p;
  if (dlo < dhi)
    p = lo;
  else if (dhi < dlo)
    p = hi;
  else
    p = (lo % 2 == 0) ? lo : hi;
  return sign | p;
}

std::uint16_t ref_fp16_bits(float f) { return ref_round(static_cast<double>(f), fp16_format()); }
std::uint16_t ref_bf16_bits(float f) { return ref_round(static_cast<double>(f), bf16_format()); }

bool is_fp16_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0; }
bool is_bf16_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0; }

}  // namespace

// ============================== reference sanity ==============================

// The references themselves, against patterns from the IEEE 754 tables.
TEST(DTypeReference, KnownValues) {
  EXPECT_EQ(ref_fp16_value(0x3c00), 1.0);
  EXPECT_EQ(ref_fp16_value(0x7bff), 65504.0);
  EXPECT_EQ(ref_fp16_value(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(ref_fp16_value(0x0400), std::ldexp(1.0, -14));
  EXPECT_EQ(ref_fp16_value(0x3555), 0.333251953125);
  EXPECT_EQ(ref_bf16_value(0x3f80), 1.0);
  EXPECT_EQ(ref_bf16_value(0x4049), 3.140625);
  EXPECT_EQ(ref_bf16_value(0x0001), std::ldexp(1.0, -133));
  EXPECT_EQ(ref_bf16_value(0x7f7f), std::ldexp(255.0, 120));
  EXPECT_EQ(ref_round(65519.99, fp16_format()), 0x7bff);
  EXPECT_EQ(ref_round(65520.0, fp16_format()), 0x7c00);
  EXPECT_EQ(ref_round(-1.0, fp16_format()), 0xbc00);
}

// ============================== fp16 -> fp32 ==============================

TEST(DType, Fp16ToFp32AllPatterns) {
  for (std::uint32_t p = 0; p <= 0xffff; ++p) {
    const auto h = static_cast<std::uint16_t>(p);
    const float got = fp16_bits_to_fp32(h);
    if (is_fp16_nan(h)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << p;
      // Widening is exact: sign, quiet bit and the 10 payload bits land in the top of fp32's 23.
      const std::uint32_t expect = (static_cast<std::uint32_t>(h & 0x8000) << 16) | 0x7f800000u | (static_cast<std::uint32_t>(h & 0x03ff) << 13);
      ASSERT_EQ(bits_of(got), expect) << std::hex << p;
    } else {
      const float expect = static_cast<float>(ref_fp16_value(h));  // exact: 11 bits fit in 24
      ASSERT_EQ(bits_of(got), bits_of(expect)) << std::hex << p;   // bits: also checks -0
    }
  }
}

TEST(DType, Bf16ToFp32AllPatterns) {
  for (std::uint32_t p = 0; p <= 0xffff; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const float got = bf16_bits_to_fp32(b);
    if (is_bf16_nan(b)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << p;
      ASSERT_EQ(bits_of(got), p << 16) << std::hex << p;
    } else {
      ASSERT_EQ(bits_of(got), bits_of(static_cast<float>(ref_bf16_value(b)))) << std::hex << p;
    }
  }
}

// ============================== fp32 -> 16 bits: exhaustive boundaries ==============================

// For every non-negative finite pattern p and its successor q = p + 1 (q = inf after the largest
// finite value): p itself, the midpoint (a tie: goes to the even pattern), and the fp32 neighbours
// of the midpoint (strictly closer to p or to q). Midpoints have at most 12 significant bits (fp16)
// or 9 (bf16), so they are exact fp32 values. Both signs.
template <typename Convert>
void check_all_midpoints(const Format16& f, Convert convert, const char* what) {
  for (std::uint32_t p = 0; p < f.inf_bits; ++p) {
    const std::uint32_t q = p + 1;
    const double vp = f.values[p], vq = f.values[q];
    const double mid = (vp + vq) / 2;
    const float fmid = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(fmid), mid) << what << " midpoint not exact at " << std::hex << p;
    const std::uint32_t even = (p % 2 == 0) ? p : q;
    for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      const float s = sign ? -1.0f : 1.0f;
      ASSERT_EQ(convert(s * static_cast<float>(vp)), sign | p) << what << " value " << std::hex << p;
      ASSERT_EQ(convert(s * fmid), sign | even) << what << " tie " << std::hex << p;
      ASSERT_EQ(convert(s * std::nextafter(fmid, 0.0f)), sign | p) << what << " below tie " << std::hex << p;
      ASSERT_EQ(convert(s * std::nextafter(fmid, kInf)), sign | q) << what << " above tie " << std::hex << p;
    }
  }
}

TEST(DType, Fp32ToFp16AllMidpoints) {
  check_all_midpoints(
      fp16_format(), [](float x) { return fp32_to_fp16_bits(x); }, "fp16");
}

TEST(DType, Fp32ToBf16AllMidpoints) {
  check_all_midpoints(
      bf16_format(), [](float x) { return fp32_to_bf16_bits(x); }, "bf16");
}

// ============================== fp32 -> 16 bits: special values ==============================

TEST(DType, Fp32ToFp16Specials) {
  EXPECT_EQ(fp32_to_fp16_bits(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16_bits(kInf), 0x7c00);
  EXPECT_EQ(fp32_to_fp16_bits(-kInf), 0xfc00);
  EXPECT_EQ(fp32_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the boundary
  EXPECT_EQ(fp32_to_fp16_bits(65520.0f), 0x7c00);                        // the boundary: tie -> even = inf
  EXPECT_EQ(fp32_to_fp16_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16_bits(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16_bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(fp32_to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(fp32_to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> even (0)
  EXPECT_EQ(fp32_to_fp16_bits(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(fp32_to_fp16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002);     // tie between 1 and 2 -> even (2)
  EXPECT_EQ(fp32_to_fp16_bits(std::ldexp(1023.5f, -24)), 0x0400);  // tie: largest subnormal -> smallest normal
  // Rounding carries through the mantissa into the exponent: 2047.5/1024 * 2^0 -> 2.0.
  EXPECT_EQ(fp32_to_fp16_bits(2047.5f / 1024.0f), 0x4000);
}

TEST(DType, Fp32ToBf16Specials) {
  EXPECT_EQ(fp32_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16_bits(kInf), 0x7f80);
  EXPECT_EQ(fp32_to_bf16_bits(-kInf), 0xff80);
  EXPECT_EQ(fp32_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16_bits(3.14159265f), 0x4049);
  EXPECT_EQ(fp32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds past 255*2^120
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x7f7f7fffu)), 0x7f7f);              // just below that tie
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x7f7f8000u)), 0x7f80);              // the tie -> even = inf
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x3f808000u)), 0x3f80);              // tie, even below
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x3f818000u)), 0x3f82);              // tie, even above
}

// fp32 subnormal inputs: all of them round to ±0 in fp16 (they are < 2^-126, far below 2^-25);
// in bf16 they keep their top 7 mantissa bits, rounded (bf16 has fp32's exponent range).
TEST(DType, Fp32SubnormalInputs) {
  for (std::uint32_t m = 1; m < 0x00800000u; m += (m < 4096 ? 1 : 4093)) {
    for (const std::uint32_t sign : {0u, 0x80000000u}) {
      const float f = float_of(sign | m);
      ASSERT_EQ(fp32_to_fp16_bits(f), sign >> 16) << std::hex << m;
      ASSERT_EQ(fp32_to_bf16_bits(f), ref_bf16_bits(f)) << std::hex << m;
    }
  }
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x007fffffu)), 0x0080);  // largest subnormal rounds up to 2^-126
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x00008000u)), 0x0000);  // tie between 0 and 0x0001 -> 0
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x00018000u)), 0x0002);  // tie between 1 and 2 -> 2
  EXPECT_EQ(fp32_to_fp16_bits(float_of(0x007fffffu)), 0x0000);
  EXPECT_EQ(fp32_to_fp16_bits(float_of(0x807fffffu)), 0x8000);
}

// Every fp32 NaN: 2^23 - 1 payloads (quiet and signalling) x 2 signs. The result is NaN, quiet,
// of the same sign, and keeps the payload bits that fit below the quiet bit.
TEST(DType, Fp32NanAllPayloads) {
  for (const std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t m = 1; m < 0x00800000u; ++m) {
      const float f = float_of(sign | 0x7f800000u | m);
      const std::uint16_t h = fp32_to_fp16_bits(f);
      const std::uint16_t b = fp32_to_bf16_bits(f);
      const auto s16 = static_cast<std::uint16_t>(sign >> 16);
      const auto expect_h = static_cast<std::uint16_t>(s16 | 0x7e00u | ((m >> 13) & 0x01ffu));
      const auto expect_b = static_cast<std::uint16_t>(s16 | 0x7fc0u | ((m >> 16) & 0x003fu));
      if (h != expect_h || b != expect_b) {
        ASSERT_EQ(h, expect_h) << std::hex << (sign | 0x7f800000u | m);
        ASSERT_EQ(b, expect_b) << std::hex << (sign | 0x7f800000u | m);
      }
    }
  }
  // A few named classes, spelled out.
  EXPECT_EQ(fp32_to_fp16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_EQ(fp32_to_fp16_bits(float_of(0x7f800001u)), 0x7e00);  // signalling, payload only in low bits
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x7f800001u)), 0x7fc0);  // would truncate to inf without the quiet bit
  EXPECT_EQ(fp32_to_fp16_bits(float_of(0xffffffffu)), 0xffff);
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0xffffffffu)), 0xffff);
  EXPECT_EQ(fp32_to_bf16_bits(float_of(0x7fbfffffu)), 0x7fff);  // signalling, full payload -> quiet
}

// ============================== fp32 -> 16 bits: random sample ==============================

// Uniform random bit patterns mostly over- or underflow fp16, so half the sample is drawn with an
// exponent inside (and just around) the fp16 range.
TEST(DType, Fp32RandomSampleAgainstReference) {
  std::mt19937 rng(20261121);
  std::uniform_int_distribution<std::uint32_t> any;
  std::uniform_int_distribution<std::uint32_t> exp16(127 - 27, 127 + 17);
  for (int i = 0; i < 2'000'000; ++i) {
    std::uint32_t u = any(rng);
    if (i % 2 == 1) u = (u & 0x807fffffu) | (exp16(rng) << 23);
    const float f = float_of(u);
    if (std::isnan(f)) continue;  // covered exhaustively above
    const std::uint16_t h = fp32_to_fp16_bits(f), rh = ref_fp16_bits(f);
    const std::uint16_t b = fp32_to_bf16_bits(f), rb = ref_bf16_bits(f);
    if (h != rh || b != rb) {
      ASSERT_EQ(h, rh) << "fp16 of fp32 bits " << std::hex << u;
      ASSERT_EQ(b, rb) << "bf16 of fp32 bits " << std::hex << u;
    }
  }
}

// ============================== round trips and storage types ==============================

TEST(DType, RoundTrips) {
  for (std::uint32_t p = 0; p <= 0xffff; ++p) {
    const auto v = static_cast<std::uint16_t>(p);
    const std::uint16_t h = fp32_to_fp16_bits(fp16_bits_to_fp32(v));
    const std::uint16_t b = fp32_to_bf16_bits(bf16_bits_to_fp32(v));
    ASSERT_EQ(h, is_fp16_nan(v) ? (v | 0x0200) : v) << std::hex << p;  // NaNs come back quiet
    ASSERT_EQ(b, is_bf16_nan(v) ? (v | 0x0040) : v) << std::hex << p;
  }
}

TEST(DType, StorageTypes) {
  EXPECT_EQ(fp16_t(1.5f).bits, 0x3e00);
  EXPECT_EQ(static_cast<float>(fp16_t::from_bits(0xc000)), -2.0f);
  EXPECT_EQ(bf16_t(-1.0f).bits, 0xbf80);
  EXPECT_EQ(static_cast<float>(bf16_t::from_bits(0x4049)), 3.140625f);
  static_assert(fp16_t(65520.0f).bits == 0x7c00, "conversions are constexpr");
  static_assert(dtype_of<fp16_t>() == DType::fp16 && dtype_of<bf16_t>() == DType::bf16);
  static_assert(dtype_of<float>() == DType::fp32 && dtype_of<std::int32_t>() == DType::int32 && dtype_of<std::uint16_t>() == DType::uint16);
}

// ============================== names and sizes ==============================

TEST(DType, NamesAndSizes) {
  const DType all[] = {DType::fp32, DType::fp16, DType::bf16, DType::int32, DType::uint16};
  const char* names[] = {"fp32", "fp16", "bf16", "int32", "uint16"};
  const std::size_t sizes[] = {4, 2, 2, 4, 2};
  const bool floating[] = {true, true, true, false, false};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(dtype_name(all[i]), names[i]);
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    EXPECT_EQ(is_floating(all[i]), floating[i]);
    EXPECT_EQ(parse_dtype(names[i]), all[i]);
  }
}

TEST(DType, ParseAliases) {
  const std::pair<const char*, DType> cases[] = {
      {"float32", DType::fp32},  {"float", DType::fp32},    {"FP32", DType::fp32},           {"torch.float32", DType::fp32},
      {"float16", DType::fp16},  {"half", DType::fp16},     {"Half", DType::fp16},           {"torch.float16", DType::fp16},
      {"bfloat16", DType::bf16}, {"BF16", DType::bf16},     {"torch.bfloat16", DType::bf16}, {"int", DType::int32},
      {"int32", DType::int32},   {"uint16", DType::uint16},
  };
  for (const auto& [text, expect] : cases) EXPECT_EQ(parse_dtype(text), expect) << text;
}

TEST(DType, ParseRejectsUnknownNames) {
  for (const char* bad : {"", "fp8", "float64", "double", "int64", "bf 16", "fp16 ", "torch.", "f16"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "parse_dtype accepted '" << bad << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;  // names the value
      EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;                        // and what to use
    }
  }
}

// ============================== convert() ==============================

namespace {

// Inputs for each source type: every 16-bit pattern for fp16/bf16; for fp32 the values of every
// fp16 and bf16 pattern, their midpoints, and random patterns.
std::vector<std::uint8_t> make_source(DType t, std::size_t& n) {
  std::vector<std::uint8_t> out;
  if (t == DType::fp16 || t == DType::bf16) {
    n = 65536;
    out.resize(n * 2);
    for (std::uint32_t p = 0; p < n; ++p) {
      const auto v = static_cast<std::uint16_t>(p);
      std::memcpy(&out[p * 2], &v, 2);
    }
    return out;
  }
  std::vector<float> f;
  for (std::uint32_t p = 0; p <= 0xffff; ++p) {
    f.push_back(fp16_bits_to_fp32(static_cast<std::uint16_t>(p)));
    f.push_back(bf16_bits_to_fp32(static_cast<std::uint16_t>(p)));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) f.push_back(float_of(static_cast<std::uint32_t>(rng())));
  n = f.size();
  out.resize(n * 4);
  std::memcpy(out.data(), f.data(), out.size());
  return out;
}

// The reference result of converting element i, as dst-type bits (NaN: only checked as a class).
std::uint32_t load_bits(const std::uint8_t* p, DType t, std::size_t i) {
  if (t == DType::fp32) {
    std::uint32_t u;
    std::memcpy(&u, p + i * 4, 4);
    return u;
  }
  std::uint16_t v;
  std::memcpy(&v, p + i * 2, 2);
  return v;
}

double ref_value(std::uint32_t bits, DType t) {
  switch (t) {
    case DType::fp32:
      return static_cast<double>(float_of(bits));
    case DType::fp16:
      return ref_fp16_value(static_cast<std::uint16_t>(bits));
    default:
      return ref_bf16_value(static_cast<std::uint16_t>(bits));
  }
}

std::uint32_t ref_encode(double v, DType t) {
  switch (t) {
    case DType::fp32:
      return bits_of(static_cast<float>(v));  // exact: v came from a 16-bit value
    case DType::fp16:
      return ref_round(v, fp16_format());
    default:
      return ref_round(v, bf16_format());
  }
}

bool is_nan_bits(std::uint32_t bits, DType t) {
  switch (t) {
    case DType::fp32:
      return std::isnan(float_of(bits));
    case DType::fp16:
      return is_fp16_nan(static_cast<std::uint16_t>(bits));
    default:
      return is_bf16_nan(static_cast<std::uint16_t>(bits));
  }
}

}  // namespace

TEST(DType, ConvertAllPairs) {
  const DType types[] = {DType::fp32, DType::fp16, DType::bf16};
  for (DType st : types) {
    std::size_t n = 0;
    const std::vector<std::uint8_t> src = make_source(st, n);
    for (DType dt : types) {
      std::vector<std::uint8_t> dst(n * dtype_size(dt), 0xAB);
      convert(src.data(), st, dst.data(), dt, n);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t s = load_bits(src.data(), st, i);
        const std::uint32_t got = load_bits(dst.data(), dt, i);
        if (is_nan_bits(s, st)) {
          ASSERT_TRUE(is_nan_bits(got, dt)) << dtype_name(st) << "->" << dtype_name(dt) << " at " << i;
          continue;
        }
        const std::uint32_t expect = st == dt ? s : ref_encode(ref_value(s, st), dt);
        if (got != expect) {
          ASSERT_EQ(got, expect) << dtype_name(st) << "->" << dtype_name(dt) << " src bits " << std::hex << s;
        }
      }
    }
  }
}

TEST(DType, ConvertZeroElementsAndNull) {
  EXPECT_NO_THROW(convert(nullptr, DType::fp32, nullptr, DType::fp16, 0));
  EXPECT_NO_THROW(convert(nullptr, DType::bf16, nullptr, DType::bf16, 0));
  EXPECT_THROW(convert(nullptr, DType::fp32, nullptr, DType::fp16, 3), Error);
}

TEST(DType, ConvertRejectsIntegerTypes) {
  std::int32_t ints[4] = {1, 2, 3, 4};
  float floats[4] = {};
  for (const auto& [st, dt] : {std::pair{DType::int32, DType::fp32}, std::pair{DType::fp32, DType::uint16}, std::pair{DType::uint16, DType::bf16},
                               std::pair{DType::int32, DType::int32}}) {
    try {
      convert(ints, st, floats, dt, 4);
      ADD_FAILURE() << "convert accepted " << dtype_name(st) << " -> " << dtype_name(dt);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string(dtype_name(st))), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string(dtype_name(dt))), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(floats[0], 0.0f);  // nothing written
}
