// The CRC-32C TensorBoard framing uses (ops/crc32c.h) against RFC 3720 (iSCSI) appendix B.4 and the
// usual check value, and TFRecord's masking of it.
#include <gtest/gtest.h>

#include <array>
#include <string_view>

#include "train/monitor/tfrecord_crc.h"
#include "ops/crc32c.h"

namespace dstrain {
namespace {

std::uint32_t crc_of(std::string_view s) { return crc32c(s.data(), s.size()); }
std::uint32_t crc32c(const std::array<std::byte, 32>& b) { return dstrain::crc32c(b.data(), b.size()); }

TEST(Crc32c, Rfc3720KnownAnswers) {
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  EXPECT_EQ(crc_of(""), 0x00000000u);
  std::array<std::byte, 32> buf{};
  EXPECT_EQ(crc32c(buf), 0x8A9136AAu);  // 32 bytes of zeros
  buf.fill(std::byte{0xFF});
  EXPECT_EQ(crc32c(buf), 0x62A8AB43u);  // 32 bytes of 0xFF
  for (int i = 0; i < 32; ++i) buf[static_cast<std::size_t>(i)] = static_cast<std::byte>(i);
  EXPECT_EQ(crc32c(buf), 0x46DD794Eu);  // 00 01 02 ... 1F
  for (int i = 0; i < 32; ++i) buf[static_cast<std::size_t>(i)] = static_cast<std::byte>(31 - i);
  EXPECT_EQ(crc32c(buf), 0x113FDB5Cu);  // 1F 1E ... 00
}

TEST(Crc32c, MaskedAsTfRecordDefinesIt) {
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8 mod 2^32, worked out by hand:
  // 0x0001C60D | 0x25060000 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
  const std::string_view s = "123456789";
  EXPECT_EQ(masked_crc32c(std::as_bytes(std::span(s.data(), s.size()))), 0xC78AB0E5u);
}

}  // namespace
}  // namespace dstrain
