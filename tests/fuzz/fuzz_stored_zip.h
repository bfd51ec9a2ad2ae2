// A zip archive of stored (uncompressed) entries, as torch.save writes one: the fuzz target of the
// torch reader builds its archive itself in its pickle mode (fuzz_torch_state_dict.cpp), so that
// mutations land in the pickle rather than in the zip's framing.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::fuzz {

inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i) & 0xFF));
}

// entries: (name, bytes). The CRCs are written as 0: the reader does not check them.
inline std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, directory;
  for (const auto& [name, bytes] : entries) {
    const std::uint64_t offset = out.size();
    put_le(out, 0x04034b50, 4);  // local file header
    put_le(out, 20, 2);          // version needed
    put_le(out, 0, 2);           // flags
    put_le(out, 0, 2);           // method: stored
    put_le(out, 0, 4);           // time, date
    put_le(out, 0, 4);           // crc-32
    put_le(out, bytes.size(), 4);
    put_le(out, bytes.size(), 4);
    put_le(out, name.size(), 2);
    put_le(out, 0, 2);  // extra length
    out += name;
    out += bytes;
    put_le(directory, 0x02014b50, 4);  // central directory header
    put_le(directory, 20, 2);          // version made by
    put_le(directory, 20, 2);          // version needed
    put_le(directory, 0, 2);
    put_le(directory, 0, 2);
    put_le(directory, 0, 4);
    put_le(directory, 0, 4);
    put_le(directory, bytes.size(), 4);
    put_le(directory, bytes.size(), 4);
    put_le(directory, name.size(), 2);
    put_le(directory, 0, 2);  // extra
    put_le(directory, 0, 2);  // comment
    put_le(directory, 0, 2);  // disk
    put_le(directory, 0, 2);  // internal attributes
    put_le(directory, 0, 4);  // external attributes
    put_le(directory, offset, 4);
    directory += name;
  }
  const std::uint64_t directory_offset = out.size();
  out += directory;
  put_le(out, 0x06054b50, 4);  // end of central directory
  put_le(out, 0, 4);           // disk numbers
  put_le(out, entries.size(), 2);
  put_le(out, entries.size(), 2);
  put_le(out, directory.size(), 4);
  put_le(out, directory_offset, 4);
  put_le(out, 0, 2);  // comment length
  return out;
}

}  // namespace dstrain::fuzz
