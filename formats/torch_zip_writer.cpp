#include "formats/torch_zip_writer.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "ops/error.h"

namespace dstrain {
namespace {

// Slicing by 8: eight table lookups per 8 bytes instead of one per byte (about 2 GB/s instead of
// 0.5), which matters when a checkpoint's storages are gigabytes. zlib is not linked by dstrain.
struct Crc32Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Crc32Tables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::size_t s = 1; s < 8; ++s)
      for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  }
};

constexpr std::uint64_t kSat32 = 0xFFFFFFFFu;

void le(std::string& out, std::uint64_t v, int n) {
  for (int k = 0; k < n; ++k) out += static_cast<char>((v >> (8 * k)) & 0xFFu);
}

// The zip64 extra field (id 1) miniz writes for an entry of `size` bytes at `offset`: the
// uncompressed and compressed sizes when they saturate 32 bits, then the local header's offset
// when it does; empty when neither does. In the local header the compressed size is 0: miniz
// writes that header before it has stored the data (as torch 1.13's own files past 4 GiB show).
std::string zip64_extra(std::uint64_t size, std::uint64_t offset, bool local) {
  std::string x;
  const bool big = size >= kSat32, far = offset >= kSat32;
  if (!big && !far) return x;
  le(x, 1, 2);
  le(x, (big ? 16 : 0) + (far ? 8 : 0), 2);
  if (big) le(x, size, 8), le(x, local ? 0 : size, 8);
  if (far) le(x, offset, 8);
  return x;
}

}  // namespace

std::uint32_t zip_crc32(const void* data, std::size_t size, std::uint32_t crc) {
  static const Crc32Tables tables;
  const auto& t = tables.t;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (; size >= 8; p += 8, size -= 8) {
    std::uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian hosts only, as everything in dstrain's formats
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^
        t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  while (size-- > 0) c = t[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
  return ~c;
}

void TorchZipWriter::put(std::string_view bytes) {
  if (!bytes.empty()) sink_(bytes.data(), bytes.size());
  at_ += bytes.size();
}

void TorchZipWriter::add(const std::string& name, std::string_view data) {
  if (finished_) fail("TorchZipWriter: entry '{}' added after the archive was finished", name);
  if (name.size() > 0xFFFF) fail("TorchZipWriter: entry name of {} bytes; zip allows 65535", name.size());
  Entry e{name, at_, data.size(), zip_crc32(data.data(), data.size())};
  const std::string z64 = zip64_extra(e.size, e.offset, /*local=*/true);
  // PyTorchStreamWriter's getPadding: the data starts after the 30-byte header, the name, the zip64
  // field and the 4 bytes "FB" + length; the padding brings that to a multiple of 64.
  const std::uint64_t start = e.offset + 30 + name.size() + z64.size() + 4;
  const std::uint64_t pad = (64 - start % 64) % 64;
  std::string h;
  le(h, 0x04034b50, 4);
  le(h, 0, 2);                               // version needed: miniz writes 0 for a stored entry
  le(h, e.size > 0 ? 0x0808 : 0x0800, 2);    // UTF-8 name; a data descriptor follows non-empty data
  le(h, 0, 2);                               // method: stored
  le(h, 0, 4);                               // DOS time and date
  le(h, 0, 4), le(h, 0, 4), le(h, 0, 4);     // CRC and sizes: in the data descriptor
  le(h, name.size(), 2);
  le(h, z64.size() + 4 + pad, 2);
  h += name;
  h += z64;
  h += "FB";
  le(h, pad, 2);
  h.append(pad, 'Z');
  put(h);
  put(data);
  if (e.size > 0) {
    std::string d;
    le(d, 0x08074b50, 4);
    le(d, e.crc, 4);
    const int w = z64.empty() ? 4 : 8;  // 64-bit sizes exactly when the entry has a zip64 field
    le(d, e.size, w), le(d, e.size, w);
    put(d);
  }
  entries_.push_back(std::move(e));
}

void TorchZipWriter::finish() {
  if (finished_) return;
  finished_ = true;
  const std::uint64_t cd_offset = at_;
  for (const Entry& e : entries_) {
    const std::string z64 = zip64_extra(e.size, e.offset, /*local=*/false);
    std::string c;
    le(c, 0x02014b50, 4);
    le(c, 0, 2), le(c, 0, 2);  // version made by, needed (miniz: 0 and 0 for stored entries)
    le(c, e.size > 0 ? 0x0808 : 0x0800, 2);
    le(c, 0, 2);  // stored
    le(c, 0, 4);  // DOS time and date
    le(c, e.crc, 4);
    le(c, std::min(e.size, kSat32), 4), le(c, std::min(e.size, kSat32), 4);
    le(c, e.name.size(), 2);
    le(c, z64.size(), 2);
    le(c, 0, 2), le(c, 0, 2), le(c, 0, 2), le(c, 0, 4);  // comment length, disk, internal and external attributes
    le(c, std::min(e.offset, kSat32), 4);
    c += e.name;
    c += z64;
    put(c);
  }
  const std::uint64_t cd_size = at_ - cd_offset, zip64_eocd = at_, n = entries_.size();
  std::string t;
  le(t, 0x06064b50, 4);  // zip64 end of central directory record
  le(t, 44, 8);          // its size after this field
  le(t, 0x031E, 2), le(t, 0x002D, 2);
  le(t, 0, 4), le(t, 0, 4);
  le(t, n, 8), le(t, n, 8), le(t, cd_size, 8), le(t, cd_offset, 8);
  le(t, 0x07064b50, 4);  // its locator
  le(t, 0, 4), le(t, zip64_eocd, 8), le(t, 1, 4);
  le(t, 0x06054b50, 4);  // end of central directory record
  le(t, 0, 2), le(t, 0, 2);
  le(t, std::min<std::uint64_t>(n, 0xFFFF), 2), le(t, std::min<std::uint64_t>(n, 0xFFFF), 2);
  le(t, std::min(cd_size, kSat32), 4), le(t, std::min(cd_offset, kSat32), 4);
  le(t, 0, 2);
  put(t);
}

}  // namespace dstrain
