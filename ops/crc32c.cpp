#include "ops/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dstrain {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t b = 0; b < 256; ++b) {
    std::uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][b] = c;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Tables kTables = make_tables();

std::uint32_t crc_table(const unsigned char* p, std::size_t n, std::uint32_t c) {
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts (every target dstrain builds for)
    w ^= c;
    c = kTables[7][w & 0xFF] ^ kTables[6][(w >> 8) & 0xFF] ^ kTables[5][(w >> 16) & 0xFF] ^ kTables[4][(w >> 24) & 0xFF] ^
        kTables[3][(w >> 32) & 0xFF] ^ kTables[2][(w >> 40) & 0xFF] ^ kTables[1][(w >> 48) & 0xFF] ^ kTables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
  return c;
}

#if defined(__x86_64__)
// The crc32 instruction takes 3 cycles before its result can feed the next one, but starts one
// every cycle: one chain runs at a third of the instruction's rate. So blocks of 3 * kLane bytes
// are taken as three chains, one per kLane-byte lane, interleaved, and joined after: the CRC
// register is linear in its input, so crc(A B) = shift(crc(A)) ^ crc0(B), where crc0 starts from
// zero and shift(c) is c run through kLane zero bytes — a 32 x 32 bit matrix, applied with four
// 256-entry tables (the register's bytes), made once from its 32 columns.
constexpr std::size_t kLane = 8192;

struct ShiftTables {
  std::array<std::array<std::uint32_t, 256>, 4> t{};
};

__attribute__((target("sse4.2"))) std::uint32_t zeros_through(std::uint32_t c, std::size_t n) {
  std::uint64_t c64 = c;
  for (std::size_t i = 0; i < n; i += 8) c64 = _mm_crc32_u64(c64, 0);
  return static_cast<std::uint32_t>(c64);
}

const ShiftTables& lane_shift() {
  static const ShiftTables tables = [] {
    ShiftTables s;
    std::array<std::uint32_t, 32> column{};
    for (int bit = 0; bit < 32; ++bit) column[static_cast<std::size_t>(bit)] = zeros_through(1u << bit, kLane);
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit)
          if ((b >> bit) & 1u) v ^= column[8 * k + static_cast<std::size_t>(bit)];
        s.t[k][b] = v;
      }
    }
    return s;
  }();
  return tables;
}

std::uint32_t shift_lane(const ShiftTables& s, std::uint32_t c) {
  return s.t[0][c & 0xFFu] ^ s.t[1][(c >> 8) & 0xFFu] ^ s.t[2][(c >> 16) & 0xFFu] ^ s.t[3][c >> 24];
}

__attribute__((target("sse4.2"))) std::uint32_t crc_sse42(const unsigned char* p, std::size_t n, std::uint32_t c) {
  if (n >= 3 * kLane) {
    const ShiftTables& s = lane_shift();
    while (n >= 3 * kLane) {
      std::uint64_t c0 = c, c1 = 0, c2 = 0;
      for (std::size_t i = 0; i < kLane; i += 8) {
        std::uint64_t w0, w1, w2;
        std::memcpy(&w0, p + i, 8);
        std::memcpy(&w1, p + kLane + i, 8);
        std::memcpy(&w2, p + 2 * kLane + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      c = shift_lane(s, static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1);
      c = shift_lane(s, c) ^ static_cast<std::uint32_t>(c2);
      p += 3 * kLane;
      n -= 3 * kLane;
    }
  }
  std::uint64_t c64 = c;
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_sse42(p, size, c);
#endif
  return ~crc_table(p, size, c);
}

}  // namespace dstrain
