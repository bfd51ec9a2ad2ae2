// The zip container of torch.save read (formats/torch_zip_reader.h).
#include "formats/torch_zip_reader.h"

#include <cstdint>

#include "ops/error.h"

namespace dstrain {
namespace {

std::uint64_t le(const std::string& b, std::size_t at, int n, const std::string& file) {
  // Written as a subtraction: an offset read from the file can be near 2^64, where `at + n` wraps.
  if (at > b.size() || static_cast<std::size_t>(n) > b.size() - at) fail("torch file '{}': truncated zip structure at byte {}", file, at);
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

std::map<std::string, std::string_view> read_stored_zip(const std::string& z, const std::string& file) {
  const auto L = [&](std::size_t at, int n) { return le(z, at, n, file); };
  if (z.size() < 22) fail("torch file '{}': not a zip archive (too short); dstrain reads torch.save files of PyTorch >= 1.6", file);
  std::size_t eocd = std::string::npos;
  for (std::size_t i = z.size() - 22 + 1; i-- > (z.size() > 22 + 65535 ? z.size() - 22 - 65535 : 0);) {
    if (L(i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) {
    fail(
        "torch file '{}': no zip directory; it is not a torch.save file of PyTorch >= 1.6 (re-save it with torch.save in a current PyTorch, "
        "or convert it to safetensors)",
        file);
  }
  std::uint64_t count = L(eocd + 10, 2), cd = L(eocd + 16, 4);
  if (cd == 0xFFFFFFFFu || count == 0xFFFF) {
    // Zip64 end of central directory locator, just before the EOCD.
    if (eocd < 20 || L(eocd - 20, 4) != 0x07064b50) fail("torch file '{}': malformed zip64 directory", file);
    const std::size_t z64 = L(eocd - 20 + 8, 8);
    if (L(z64, 4) != 0x06064b50) fail("torch file '{}': malformed zip64 directory", file);
    count = L(z64 + 32, 8);
    cd = L(z64 + 48, 8);
  }
  std::map<std::string, std::string_view> out;
  std::size_t at = cd;
  for (std::uint64_t k = 0; k < count; ++k) {
    if (L(at, 4) != 0x02014b50) fail("torch file '{}': malformed zip directory entry {}", file, k);
    const std::uint64_t method = L(at + 10, 2);
    std::uint64_t csize = L(at + 20, 4), usize = L(at + 24, 4);
    const std::size_t nlen = L(at + 28, 2), xlen = L(at + 30, 2), clen = L(at + 32, 2);
    std::uint64_t local = L(at + 42, 4);
    const std::string name = z.substr(at + 46, nlen);
    // Zip64 extra field (id 1): the saturated values, in the order usize, csize, offset.
    for (std::size_t x = at + 46 + nlen; x + 4 <= at + 46 + nlen + xlen;) {
      const std::uint64_t id = L(x, 2), len = L(x + 2, 2);
      if (id == 1) {
        std::size_t p = x + 4;
        if (usize == 0xFFFFFFFFu) usize = L(p, 8), p += 8;
        if (csize == 0xFFFFFFFFu) csize = L(p, 8), p += 8;
        if (local == 0xFFFFFFFFu) local = L(p, 8);
      }
      x += 4 + len;
    }
    if (method != 0) fail("torch file '{}': entry '{}' is compressed (method {}); torch.save stores its entries uncompressed", file, name, method);
    if (L(local, 4) != 0x04034b50) fail("torch file '{}': malformed local header of '{}'", file, name);
    const std::size_t data = local + 30 + L(local + 26, 2) + L(local + 28, 2);
    if (data > z.size() || usize > z.size() - data) fail("torch file '{}': entry '{}' runs past the end of the file (truncated?)", file, name);
    out[name] = std::string_view(z).substr(data, usize);
    at += 46 + nlen + xlen + clen;
  }
  return out;
}

}  // namespace dstrain
