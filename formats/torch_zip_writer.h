// The zip container of torch.save, written byte for byte as PyTorch's PyTorchStreamWriter (over
// miniz, PyTorch 1.6 to 2.x) writes it — for formats/torch_save.h.
//
// Every entry is stored (method 0) with DOS time and date 0, general-purpose flags 0x0808 (UTF-8
// name; CRC and sizes in a data descriptor after the data, the local header's left 0) or 0x0800 for
// an empty entry (no descriptor). The local header's extra field ends with torch's padding record
// "FB" + le16 n + n bytes 'Z', sized so that the entry's data starts at a multiple of 64 (mmap
// and zero-copy loads rely on it). An entry of 0xFFFFFFFF bytes or more, or one whose local header
// starts at or past 0xFFFFFFFF, carries a zip64 extra field (id 1: size, compressed size, offset —
// each only where saturated; the local header's compressed size 0, as miniz writes it) before the
// padding, in its local header and its central directory record, and a data descriptor with
// 64-bit sizes. The archive always ends with a zip64 end of central directory
// record and locator before the classic end record (torch opens its writer with
// MZ_ZIP_FLAG_WRITE_ZIP64), whose counts and offsets saturate at 0xFFFF / 0xFFFFFFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dstrain {

// CRC-32 of zip (and zlib, gzip, PNG): reflected polynomial 0xEDB88320, initial value and final xor
// 0xFFFFFFFF; zip_crc32("123456789") = 0xCBF43926. `crc` continues an earlier result:
// zip_crc32(b, m + n) = zip_crc32(b + m, n, zip_crc32(b, m)). Not ops/crc32c.h's Castagnoli CRC.
std::uint32_t zip_crc32(const void* data, std::size_t size, std::uint32_t crc = 0);

class TorchZipWriter {
 public:
  // `sink` receives the archive's bytes in order (a file, a string); it throws to stop the write.
  using Sink = std::function<void(const char* data, std::size_t size)>;
  explicit TorchZipWriter(Sink sink) : sink_(std::move(sink)) {}

  // Appends entry `name` (the full name, "<archive>/data/0") holding `data`.
  void add(const std::string& name, std::string_view data);
  // Writes the central directory and the end records; nothing may be added after.
  void finish();

  // Bytes written so far.
  std::uint64_t size() const { return at_; }

 private:
  struct Entry {
    std::string name;
    std::uint64_t offset = 0, size = 0;
    std::uint32_t crc = 0;
  };
  void put(std::string_view bytes);

  Sink sink_;
  std::uint64_t at_ = 0;
  std::vector<Entry> entries_;
  bool finished_ = false;
};

}  // namespace dstrain
