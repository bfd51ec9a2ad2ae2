#include "data/byte_level_alphabet.h"

#include <array>

#include "data/utf8.h"

namespace dstrain {
namespace {

struct Alphabet {
  std::array<int, 0x144> byte_of{};  // every code point of the alphabet is below U+0144; -1: none
  Alphabet() {
    byte_of.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next_extra++;
      byte_of[cp] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string bytes;
  bytes.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    char32_t cp;
    if (!next_code_point(token, i, cp) || cp >= a.byte_of.size() || a.byte_of[cp] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(a.byte_of[cp]));
  }
  return bytes;
}

}  // namespace dstrain
