#include "formats/json_text.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

// A short, printable excerpt of `text` at `at` (control bytes and quotes escaped), for a message.
std::string excerpt(std::string_view text, std::size_t at) {
  std::string out;
  for (std::size_t i = at; i < text.size() && i < at + 16; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\r') break;
    if (c < 0x20 || c == 0x7F || c == '\'' || c == '\\') {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

std::string json_error_text(const nlohmann::json::exception& e, std::string_view text) {
  if (const auto* p = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
    // p->byte counts from 1 and points one past the character that failed.
    const std::size_t at = std::min<std::size_t>(p->byte > 0 ? p->byte - 1 : 0, text.size());
    const std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    const std::size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const std::size_t column = at - (line_start == std::string_view::npos || at == 0 ? 0 : line_start + 1) + 1;
    if (at >= text.size()) return fmt::format("the text ends early, at line {}, column {}", line, column);
    return fmt::format("unexpected '{}' at line {}, column {}", excerpt(text, at), line, column);
  }
  if (e.id == 406) return "a number out of range (beyond what a double holds, such as 1e400)";
  // Type and range errors of reading a parsed value ("type must be number, but is string", "key
  // 'x' not found"): the library's sentence without its "[json.exception.type_error.302] " tag.
  std::string_view what = e.what();
  if (const std::size_t close = what.find("] "); what.rfind("[json.exception.", 0) == 0 && close != std::string_view::npos)
    what.remove_prefix(close + 2);
  return std::string(what);
}

nlohmann::json parse_json_text(std::string_view text, std::string_view what, const nlohmann::json::parser_callback_t& callback) {
  try {
    return nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", what, json_error_text(e, text));
  }
}

}  // namespace dstrain
