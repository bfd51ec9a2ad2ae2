// TFRecord's masked CRC-32C, the checksum framing every TensorBoard event. The CRC-32C itself is
// the project's one implementation (ops/crc32c.h, hardware-accelerated where the CPU has it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dstrain {

// ((crc >> 15) | (crc << 17)) + 0xa282ead8 of the CRC-32C of `data`, so that a CRC stored inside
// the data it covers does not checksum to a fixed value.
std::uint32_t masked_crc32c(std::span<const std::byte> data);

}  // namespace dstrain
