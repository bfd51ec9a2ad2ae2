#include "ops/quoted_excerpt.h"

#include <fmt/format.h>

#include "ops/utf8_char.h"

namespace dstrain {
namespace {

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
