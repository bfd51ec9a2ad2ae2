#include "formats/json_text.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/quoted_excerpt.h"

namespace dstrain {
namespace {

// A short, printable excerpt of `text` at `at` (control bytes and quotes escaped), for a message.
std::string excerpt_at(std::string_view text, std::size_t at) {
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

// Where `text` first nests arrays and objects deeper than `limit` (its offset), or npos. A scan of
// the bytes that skips strings: linear and without recursion, whatever the text holds.
std::size_t first_nesting_beyond(std::string_view text, std::size_t limit) {
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

// Whether `value` nests arrays and objects deeper than `limit`: a walk with its own stack, which
// stops at the first level beyond the limit.
bool nests_beyond(const nlohmann::json& value, std::size_t limit) {
  std::vector<std::pair<const nlohmann::json*, std::size_t>> pending{{&value, 0}};
  while (!pending.empty()) {
    const auto [node, depth] = pending.back();
    pending.pop_back();
    if (!node->is_structured()) continue;
    if (depth + 1 > limit) return true;
    for (const nlohmann::json& child : *node) pending.emplace_back(&child, depth + 1);
  }
  return false;
}

}  // namespace

std::string json_excerpt(const nlohmann::json& value) {
  if (nests_beyond(value, kMaxExcerptNesting)) {
    return fmt::format("{} nested more than {} deep", value.is_array() ? "a list" : "an object", kMaxExcerptNesting);
  }
  return dstrain::excerpt(value.dump());
}

std::string json_error_text(const nlohmann::json::exception& e, std::string_view text) {
  if (const auto* p = dynamic_cast<const nlohmann::json::parse_error*>(&e)) {
    // p->byte counts from 1 and points one past the character that failed.
    const std::size_t at = std::min<std::size_t>(p->byte > 0 ? p->byte - 1 : 0, text.size());
    const std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    const std::size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const std::size_t column = at - (line_start == std::string_view::npos || at == 0 ? 0 : line_start + 1) + 1;
    if (at >= text.size()) return fmt::format("the text ends early, at line {}, column {}", line, column);
    return fmt::format("unexpected '{}' at line {}, column {}", excerpt_at(text, at), line, column);
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
  // The parser is iterative, but a parsed value is copied, compared and printed recursively (a
  // tokenizer.json nesting 200,000 Sequence steps overflowed the stack in such a copy).
  if (const std::size_t at = first_nesting_beyond(text, kMaxJsonNesting); at != std::string_view::npos) {
    const std::size_t line = 1 + static_cast<std::size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    fail(
        "{} nests arrays and objects more than {} levels deep (at line {}): no file of this kind needs that many; the file is corrupt or "
        "was not written by the tool that makes it",
        what, kMaxJsonNesting, line);
  }
  try {
    return nlohmann::json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    fail("{} is not valid JSON: {}", what, json_error_text(e, text));
  }
}

}  // namespace dstrain
