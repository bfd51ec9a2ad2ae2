// CRC-32C (Castagnoli), the checksum of every tensor a checkpoint stores (docs/checkpoints.md).
//
// The same function as iSCSI's, ext4's and Google's crc32c library: reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF; crc32c("123456789") = 0xE3069283.
// x86-64 CPUs with SSE4.2 compute it in hardware (several GB/s, faster than the disk it guards);
// elsewhere a slicing-by-8 table does (about 1 GB/s).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dstrain {

// The checksum of `size` bytes, continuing from `crc` (the value a previous call returned; 0 to
// start), so a stream can be checked in pieces: crc32c(b, m + n) = crc32c(b + m, n, crc32c(b, m)).
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

}  // namespace dstrain
