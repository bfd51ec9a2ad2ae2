#include "ops/quoted_excerpt.h"

#include <fmt/format.h>

namespace dstrain {
namespace {

// The length of the valid UTF-8 character at text[i] (1 to 4), or 0 when the bytes there are not one
// (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, or cut short).
std::size_t utf8_char_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return n;
}

std::string escaped_prefix(std::string_view text, std::size_t max_chars, bool quote_marks) {
  std::string out;
  std::size_t i = 0, chars = 0;
  for (; i < text.size() && chars < max_chars; ++chars) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '"':
        case '\\':
          if (quote_marks) out += '\\';
          out += static_cast<char>(c);
          break;
        default:
          if (c < 0x20 || c == 0x7F)
            out += fmt::format("\\x{:02X}", c);
          else
            out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const std::size_t n = utf8_char_length(text, i);
    if (n == 0) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    } else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      out += fmt::format("\\u{{{:02X}}}", static_cast<unsigned char>(text[i + 1]));  // a C1 control, U+0080..U+009F
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  const bool cut = i < text.size();
  if (cut) out += "\u2026";
  if (quote_marks) out = '"' + out + '"';
  if (cut) out += fmt::format(" ({} bytes)", text.size());
  return out;
}

}  // namespace

std::string quoted_excerpt(std::string_view text, std::size_t max_chars) { return escaped_prefix(text, max_chars, true); }

std::string excerpt(std::string_view text, std::size_t max_chars) { return escaped_prefix(text, max_chars, false); }

}  // namespace dstrain
