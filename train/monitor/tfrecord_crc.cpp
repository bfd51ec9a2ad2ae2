#include "train/monitor/tfrecord_crc.h"

#include "ops/crc32c.h"

namespace dstrain {

std::uint32_t masked_crc32c(std::span<const std::byte> data) {
  const std::uint32_t crc = crc32c(data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace dstrain
