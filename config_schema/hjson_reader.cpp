// Hjson reader modelled function by function on hjson-py 3.1.0's decoder (hjson/decoder.py):
// skip_blank = getNext, key = scanKeyName, quoted = scanstring, multiline = mlscanstring,
// quoteless = scantfnns, object = JSONObject, array = JSONArray, parse = decode/raw_decode.
// The control flow is kept the same on purpose: the odd corners of Hjson (where a quoteless string
// ends, when a comma may be left out) are defined by that code, not by the prose spec. Only the
// error messages differ: they point at the offending character and say how to fix it.
#include "config_schema/hjson_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"
#include "ops/utf8_char.h"

namespace dstrain {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kEof = -1;
constexpr size_t kNone = std::string_view::npos;
// hjson-py recurses once per nesting level and Python stops it near 1000 frames; we stop at the
// same depth so a hostile config cannot overflow our stack either.
constexpr int kMaxDepth = 1000;

// ---- UTF-8 ---------------------------------------------------------------------------------

// Index of the first byte that is not part of well-formed UTF-8 (what Python's strict decoder
// rejects: overlong forms, surrogates, > U+10FFFF), or kNone.
size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return kNone;
}

// Decodes the code point starting at s[i] (s is known to be valid UTF-8); sets len to its size.
char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    len = 1;
    return b;
  }
  len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's str.isspace(): hjson-py trims quoteless strings with str.strip(), which removes these.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string_view python_rstrip(std::string_view s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    if (!is_python_space(decode_utf8(s, start, len))) break;
    s.remove_suffix(s.size() - start);
  }
  return s;
}

std::string_view python_strip(std::string_view s) {
  while (!s.empty()) {
    size_t len = 0;
    if (!is_python_space(decode_utf8(s, 0, len))) break;
    s.remove_prefix(len);
  }
  return python_rstrip(s);
}

bool is_digit(int c) { return c >= '0' && c <= '9'; }

int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string child_path(const std::string& parent, const std::string& key) { return parent.empty() ? key : parent + "." + key; }

// A non-negative integer is unsigned and a negative one signed, as nlohmann::json::parse stores
// them, so trees from both parsers compare equal type for type.
Json make_integer(std::int64_t v) { return v >= 0 ? Json(static_cast<std::uint64_t>(v)) : Json(v); }

// ---- the parser ----------------------------------------------------------------------------

struct Duplicate {
  std::string key;
  std::string object_path;          // "" = the top-level object
  std::vector<size_t> occurrences;  // byte offsets of every occurrence of the key, in order
};

class Parser {
 public:
  Parser(std::string_view text, const HjsonOptions& opts) : s_(text), opts_(opts) {}

  Json parse() {
    if (const size_t bad = find_invalid_utf8(s_); bad != kNone) {
      error_at(bad, fmt::format("byte 0x{:02X} is not valid UTF-8; save the config as UTF-8 text", static_cast<unsigned char>(s_[bad])));
    }
    size_t p = 0;
    if (s_.substr(0, 3) == "\xEF\xBB\xBF") p = 3;  // a UTF-8 byte-order mark, skipped as hjson-py does
    p = skip_blank(p);
    Json root;
    if (ch(p) == '{' || ch(p) == '[') {
      root = value(p, "", 0);
    } else if (ch(p) == kEof) {
      error_at(p,
               "there is no value: the text is empty or holds only whitespace and comments; "
               "a DeepSpeed config is a JSON object such as {\"train_batch_size\": 8}");
    } else if (s_.find('\n') != kNone) {
      // hjson-py: text without a leading '{' or '[' that spans several lines is an object whose
      // root braces were left out; a single line is a single value.
      root = object(p, kNone, "", 0);
    } else {
      root = value(p, "", 0);
    }
    p = skip_blank(p);
    if (p != s_.size()) {
      error_at(p, fmt::format("unexpected {} after the end of the top-level value; remove it, or "
                              "look for an extra '}}' or ']' before it",
                              describe(p)));
    }
    if (opts_.reject_duplicate_keys && !duplicates_.empty()) report_duplicates();
    return root;
  }

 private:
  int ch(size_t i) const { return i < s_.size() ? static_cast<unsigned char>(s_[i]) : kEof; }

  // getNext: skips whitespace and comments; returns the index of the next significant character.
  size_t skip_blank(size_t p) const {
    while (true) {
      while (ch(p) == ' ' || ch(p) == '\t' || ch(p) == '\n' || ch(p) == '\r') ++p;
      const int c = ch(p), c2 = ch(p + 1);
      if (c == '#' || (c == '/' && c2 == '/')) {
        p = end_of_line(p);
      } else if (c == '/' && c2 == '*') {
        const size_t start = p;
        p += 2;
        while (p < s_.size() && !(s_[p] == '*' && ch(p + 1) == '/')) ++p;
        if (p >= s_.size()) error_at(start, "this /* comment is never closed; end it with */");
        p += 2;
      } else {
        return p;
      }
    }
  }

  size_t end_of_line(size_t p) const {
    while (ch(p) != '\n' && ch(p) != '\r' && ch(p) != kEof) ++p;
    return p;
  }

  // scan_once: the value that starts at s_[p] (p already past blanks); leaves p after it.
  Json value(size_t& p, const std::string& path, int depth) {
    if (depth > kMaxDepth) {
      error_at(p, fmt::format("values are nested more than {} levels deep; DeepSpeed's hjson "
                              "cannot read this either — flatten the config",
                              kMaxDepth));
    }
    const int c = ch(p);
    if (c == kEof) {
      error_at(p, path.empty() ? std::string("expected a value but the input ends here")
                               : fmt::format("expected a value for \"{}\" but the input ends here; "
                                             "write the value, then close every open '{{' and '['",
                                             path));
    }
    if (c == '"' || c == '\'') {
      if (s_.substr(p, 3) == "'''") return multiline(p);
      return quoted(p);
    }
    if (c == '{') {
      const size_t open = p;
      p += 1;
      return object(p, open, path, depth + 1);
    }
    if (c == '[') {
      const size_t open = p;
      p += 1;
      return array(p, open, path, depth + 1);
    }
    return quoteless(p, path);
  }

  // JSONObject. `open` is the index of '{', or kNone for a root object without braces.
  Json object(size_t& pos, size_t open, const std::string& path, int depth) {
    const bool braceless = open == kNone;
    Json obj = Json::object();
    std::map<std::string, std::vector<size_t>> seen;
    std::vector<std::string> order;  // keys in first-seen order, so duplicates report in file order
    size_t p = skip_blank(pos);
    if (!braceless && ch(p) == '}') {
      pos = p + 1;
      return obj;
    }
    while (true) {
      if (!braceless && ch(p) == kEof) error_unclosed(p, open, '}');
      size_t key_pos = 0;
      std::string name = key(p, key_pos);
      p = skip_blank(p);
      if (ch(p) != ':') {
        error_at(p, fmt::format("expected ':' after the key \"{}\" but found {}; write \"{}\": value", name, describe(p), name));
      }
      p = skip_blank(p + 1);
      Json v = value(p, child_path(path, name), depth);
      auto& where = seen[name];
      if (where.empty()) order.push_back(name);
      where.push_back(key_pos);
      // Python dict semantics when duplicates are allowed: the last value wins, the key keeps
      // the position of its first occurrence.
      obj[name] = std::move(v);
      p = skip_blank(p);
      if (ch(p) == ',') p = skip_blank(p + 1);
      if (braceless) {
        if (ch(p) == kEof) break;
      } else if (ch(p) == '}') {
        ++p;
        break;
      }
      p = skip_blank(p);
    }
    for (const auto& name : order) {
      const auto& where = seen[name];
      if (where.size() > 1) duplicates_.push_back({name, path, where});
    }
    pos = p;
    return obj;
  }

  // JSONArray; pos is just past '['.
  Json array(size_t& pos, size_t open, const std::string& path, int depth) {
    Json arr = Json::array();
    size_t p = skip_blank(pos);
    if (ch(p) == ']') {
      pos = p + 1;
      return arr;
    }
    while (true) {
      if (ch(p) == kEof) error_unclosed(p, open, ']');
      arr.push_back(value(p, fmt::format("{}[{}]", path, arr.size()), depth));
      p = skip_blank(p);
      if (ch(p) == ',') p = skip_blank(p + 1);
      if (ch(p) == ']') {
        ++p;
        break;
      }
      p = skip_blank(p);
    }
    pos = p;
    return arr;
  }

  // scanKeyName: a quoted key, or everything up to ':' (no whitespace inside, none of {}[],).
  std::string key(size_t& p, size_t& key_pos) {
    p = skip_blank(p);
    key_pos = p;
    if (ch(p) == '"' || ch(p) == '\'') return quoted(p);
    const size_t begin = p;
    size_t first_space = kNone;  // where the first whitespace run starts
    size_t space = kNone;        // hjson-py's `space`: the last character of the first run
    while (true) {
      const int c = ch(p);
      if (c == kEof) {
        error_at(p, fmt::format("the input ends inside the key name \"{}\"; add ':' and a value", python_rstrip(s_.substr(begin, p - begin))));
      }
      if (c == ':') {
        if (p == begin) {
          error_at(p, "found ':' with no key name before it; an empty key must be quoted: \"\": value");
        }
        if (space == kNone) return std::string(s_.substr(begin, p - begin));
        if (space != p - 1) {
          const std::string_view first = s_.substr(begin, first_space - begin);
          const std::string_view rest = python_rstrip(s_.substr(space + 1, p - space - 1));
          error_at(space + 1, fmt::format("expected ':' after the key name \"{}\" but found '{}'; a key "
                                          "without quotes cannot contain whitespace — add the missing ':' or "
                                          "comma, or quote the key",
                                          first, rest.substr(0, 40)));
        }
        return std::string(python_rstrip(s_.substr(begin, p - begin)));
      }
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        if (space == kNone) first_space = p;
        if (space == kNone || space == p - 1) space = p;
      } else if (c == '{' || c == '}' || c == '[' || c == ']' || c == ',') {
        const std::string_view so_far = python_rstrip(s_.substr(begin, p - begin));
        error_at(p, fmt::format("found '{}' where a key name was expected{}; look for a missing "
                                "value or an extra comma or brace, or quote a key that contains "
                                "{{}}[],: or whitespace",
                                static_cast<char>(c), so_far.empty() ? std::string() : fmt::format(" (after \"{}\")", so_far.substr(0, 40))));
      }
      ++p;
    }
  }

  // scanstring: a "double" or 'single' quoted string with JSON escapes (plus \'); p at the quote.
  std::string quoted(size_t& p) {
    const size_t open = p;
    const int quote = ch(p);
    std::string out;
    ++p;
    while (true) {
      const int c = ch(p);
      if (c == kEof) {
        error_at(open, fmt::format("this string is never closed; add the closing {}", static_cast<char>(quote)));
      }
      if (c == quote) {
        ++p;
        return out;
      }
      if (c == '\n' || c == '\r') {
        // hjson-py decodes with strict=True: a raw control character in quotes is an error.
        const auto [line, col] = line_col(open);
        error_at(p, fmt::format("line break inside a quoted string (the string opens at line {}, "
                                "column {}); add the closing quote, write \\n for a line break, "
                                "or use a '''multiline''' string",
                                line, col));
      }
      if (c < 0x20) {
        error_at(p, fmt::format("control character U+{:04X} inside a quoted string; write it as "
                                "the escape {}",
                                c, c == '\t' ? std::string("\\t") : fmt::format("\\u{:04X}", c)));
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++p;
        continue;
      }
      const int e = ch(p + 1);
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\'':
          out += '\'';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          p += 2;  // now at the first hex digit
          char32_t cp = read_hex4(p, p - 2);
          p += 4;
          // A high surrogate followed by \u and a low surrogate is one character (as in Python).
          const std::optional<char32_t> low = ch(p) == '\\' && ch(p + 1) == 'u' ? hex4_at(p + 2) : std::nullopt;
          if (cp >= 0xD800 && cp <= 0xDBFF && low && *low >= 0xDC00 && *low <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (*low - 0xDC00);
            p += 6;
          } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            // Python keeps a lone surrogate in a str, but it has no UTF-8 form; refuse it here.
            error_at(p - 6, fmt::format("\\u{:04X} is half of a UTF-16 surrogate pair with no other "
                                        "half; write the character itself or a complete pair",
                                        static_cast<unsigned>(cp)));
          }
          append_utf8(out, cp);
          continue;
        }
        case kEof:
          error_at(open, fmt::format("this string is never closed; add the closing {}", static_cast<char>(quote)));
        default:
          error_at(p, fmt::format("invalid escape '\\{}' in a string; the escapes are \\\" \\' \\\\ "
                                  "\\/ \\b \\f \\n \\r \\t \\uXXXX — write \\\\ for a backslash",
                                  describe_char(p + 1)));
      }
      p += 2;
    }
  }

  std::optional<char32_t> hex4_at(size_t p) const {
    char32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const int h = hex_value(ch(p + k));
      if (h < 0) return std::nullopt;
      v = (v << 4) | static_cast<char32_t>(h);
    }
    return v;
  }

  char32_t read_hex4(size_t p, size_t escape_pos) const {
    const auto v = hex4_at(p);
    if (!v) error_at(escape_pos, "invalid \\u escape: \\u must be followed by exactly 4 hex digits");
    return *v;
  }

  // mlscanstring: '''multiline''' text. The indentation of the opening ''' is removed from each
  // following line, '\r' is dropped, and one final line break before the closing ''' is removed.
  std::string multiline(size_t& p) {
    const size_t open = p;
    size_t line_start = open;
    while (line_start > 0 && s_[line_start - 1] != '\n') --line_start;
    const int indent = static_cast<int>(count_code_points(line_start, open));
    p = skip_indent(open + 3, -1);
    if (ch(p) == '\n') p = skip_indent(p + 1, indent);
    std::string out;
    int quotes = 0;
    while (true) {
      const int c = ch(p);
      if (c == kEof) error_at(open, "this ''' multiline string is never closed; end it with '''");
      if (c == '\'') {
        ++p;
        if (++quotes == 3) {
          if (!out.empty() && out.back() == '\n') out.pop_back();
          return out;
        }
        continue;
      }
      out.append(static_cast<size_t>(quotes), '\'');
      quotes = 0;
      if (c == '\n') {
        out += '\n';
        p = skip_indent(p + 1, indent);
      } else {
        if (c != '\r') out += static_cast<char>(c);
        ++p;
      }
    }
  }

  // skipIndent: skips up to n of ' ', '\t', '\r' (n < 0: any number).
  size_t skip_indent(size_t p, int n) const {
    while ((ch(p) == ' ' || ch(p) == '\t' || ch(p) == '\r') && n != 0) {
      ++p;
      --n;
    }
    return p;
  }

  // scantfnns: true / false / null / a number when it stands alone before a terminator
  // (, } ] # // /* or end of line), otherwise a string running to the end of the line.
  Json quoteless(size_t& p, const std::string& path) {
    const size_t begin = p;
    const int first = ch(begin);
    if (first == '}' || first == ']' || first == ',' || first == ':') {
      error_at(begin, fmt::format("found '{}' where {} was expected; write the value (a number, "
                                  "\"string\", true, false, null, {{...}} or [...])",
                                  static_cast<char>(first), path.empty() ? std::string("a value") : fmt::format("the value of \"{}\"", path)));
    }
    size_t end = begin;
    while (true) {
      const int c = ch(end);
      const bool eol = c == '\r' || c == '\n' || c == kEof;
      if (eol || c == ',' || c == '}' || c == ']' || c == '#' || (c == '/' && (ch(end + 1) == '/' || ch(end + 1) == '*'))) {
        const std::string_view text = python_strip(s_.substr(begin, end - begin));
        if (first == 'n' && text == "null") return finish(p, end, Json(nullptr));
        if (first == 't' && text == "true") return finish(p, end, Json(true));
        if (first == 'f' && text == "false") return finish(p, end, Json(false));
        if (first == '-' || is_digit(first)) {
          if (auto number = number_between(begin, end)) return finish(p, end, std::move(*number));
        }
        if (eol) return finish(p, end, Json(std::string(text)));
      }
      ++end;
    }
  }

  static Json finish(size_t& p, size_t end, Json v) {
    p = end;
    return v;
  }

  // NUMBER_RE = [\t ]*(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?[\t ]* matched at begin; the
  // value is a number only when the match ends exactly at `end`.
  std::optional<Json> number_between(size_t begin, size_t end) const {
    size_t p = begin;
    while (ch(p) == ' ' || ch(p) == '\t') ++p;
    const size_t start = p;
    if (ch(p) == '-') ++p;
    const size_t int_digits = p;
    if (ch(p) == '0') {
      ++p;
    } else if (is_digit(ch(p))) {
      while (is_digit(ch(p))) ++p;
    } else {
      return std::nullopt;
    }
    const size_t int_end = p;
    size_t frac_begin = kNone;
    if (ch(p) == '.' && is_digit(ch(p + 1))) {
      frac_begin = p + 1;
      p += 2;
      while (is_digit(ch(p))) ++p;
    }
    const size_t frac_end = p;
    bool has_exp = false;
    if (ch(p) == 'e' || ch(p) == 'E') {
      size_t q = p + 1;
      if (ch(q) == '+' || ch(q) == '-') ++q;
      if (is_digit(ch(q))) {
        while (is_digit(ch(q))) ++q;
        p = q;
        has_exp = true;
      }
    }
    const size_t literal_end = p;
    while (ch(p) == ' ' || ch(p) == '\t') ++p;
    if (p != end) return std::nullopt;

    const std::string_view literal = s_.substr(start, literal_end - start);
    if (frac_begin == kNone && !has_exp) {
      // Python int: exact. 64-bit here; beyond that a double, as nlohmann::json::parse does.
      if (literal[0] == '-') {
        std::int64_t v = 0;
        if (std::from_chars(literal.data(), literal.data() + literal.size(), v).ec == std::errc()) {
          return Json(v);
        }
      } else {
        std::uint64_t v = 0;
        if (std::from_chars(literal.data(), literal.data() + literal.size(), v).ec == std::errc()) {
          return Json(v);
        }
      }
    }
    double d = 0.0;
    const auto [ptr, ec] = std::from_chars(literal.data(), literal.data() + literal.size(), d);
    (void)ptr;
    if (ec == std::errc::result_out_of_range) {
      // Python's float() gives inf (and hjson-py then fails in int(inf)) or 0.0 (underflow).
      if (decimal_magnitude(int_digits, int_end, frac_begin, frac_end, has_exp ? frac_end : kNone) > 0) {
        error_at(start, fmt::format("the number {} is too large for a 64-bit float; write a smaller "
                                    "number",
                                    literal));
      }
      d = literal[0] == '-' ? -0.0 : 0.0;
    } else if (ec != std::errc()) {
      error_at(start, fmt::format("cannot read the number {}", literal));
    }
    // hjson-py: `if int(res) == res and abs(res) < 1e10: res = int(res)`.
    if (std::trunc(d) == d && std::fabs(d) < 1e10) return make_integer(static_cast<std::int64_t>(d));
    return Json(d);
  }

  // Decimal exponent of the leading digit (+1), enough to tell overflow (> 0) from underflow.
  long long decimal_magnitude(size_t int_begin, size_t int_end, size_t frac_begin, size_t frac_end, size_t exp_at) const {
    long long mag = 0;
    if (s_[int_begin] != '0') {
      mag = static_cast<long long>(int_end - int_begin);
    } else if (frac_begin != kNone) {
      size_t q = frac_begin;
      while (q < frac_end && s_[q] == '0') ++q;
      mag = -static_cast<long long>(q - frac_begin);
    }
    if (exp_at != kNone) {
      size_t q = exp_at + 1;
      const bool negative = s_[q] == '-';
      if (s_[q] == '+' || s_[q] == '-') ++q;
      long long e = 0;
      while (q < s_.size() && is_digit(ch(q))) {
        e = std::min<long long>(e * 10 + (s_[q] - '0'), 1'000'000'000LL);
        ++q;
      }
      mag += negative ? -e : e;
    }
    return mag;
  }

  // ---- diagnostics ----

  size_t count_code_points(size_t from, size_t to) const {
    size_t n = 0;
    for (size_t i = from; i < to && i < s_.size(); ++i) {
      if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) ++n;
    }
    return n;
  }

  // 1-based line and column (in code points) of byte offset pos.
  std::pair<size_t, size_t> line_col(size_t pos) const {
    pos = std::min(pos, s_.size());
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < pos; ++i) {
      if (s_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return {line, count_code_points(line_start, pos) + 1};
  }

  std::string describe_char(size_t pos) const {
    const int c = ch(pos);
    if (c == kEof) return "end of input";
    if (c < 0x80) return std::string(1, static_cast<char>(c));
    size_t len = 0;
    decode_utf8(s_, pos, len);
    return std::string(s_.substr(pos, len));
  }

  std::string describe(size_t pos) const {
    const int c = ch(pos);
    if (c == kEof) return "the end of the input";
    if (c == '\n' || c == '\r') return "the end of the line";
    if (c < 0x20) return fmt::format("control character U+{:04X}", c);
    return fmt::format("'{}'", describe_char(pos));
  }

  [[noreturn]] void error_unclosed(size_t pos, size_t open, char closer) const {
    const auto [line, col] = line_col(open);
    error_at(pos, fmt::format("the input ends inside the {} that opens at line {}, column {}; add "
                              "the missing '{}'",
                              closer == '}' ? "object" : "array", line, col, closer));
  }

  [[noreturn]] void error_at(size_t pos, const std::string& what) const {
    const auto [line, col] = line_col(pos);
    fail("{}:{}:{}: {}", opts_.source_name, line, col, what);
  }

  // DeepSpeed raises ValueError("Duplicate keys in DeepSpeed config: [...]") at the first object
  // holding duplicates; we list every duplicate of the whole config at once, with its location.
  [[noreturn]] void report_duplicates() const {
    std::vector<const Duplicate*> sorted;
    for (const auto& d : duplicates_) sorted.push_back(&d);
    std::sort(sorted.begin(), sorted.end(), [](const Duplicate* a, const Duplicate* b) { return a->occurrences[1] < b->occurrences[1]; });
    std::string message;
    for (const Duplicate* d : sorted) {
      const auto [line, col] = line_col(d->occurrences[1]);
      std::vector<size_t> other_lines;
      for (size_t k = 0; k < d->occurrences.size(); ++k) {
        if (k != 1) other_lines.push_back(line_col(d->occurrences[k]).first);
      }
      const std::string where = d->object_path.empty() ? std::string("the top-level object") : fmt::format("object at \"{}\"", d->object_path);
      if (!message.empty()) message += '\n';
      message += fmt::format(
          "{}:{}:{}: duplicate key \"{}\" (also at line{} {}) in {}; DeepSpeed "
          "rejects duplicate keys — keep one",
          opts_.source_name, line, col, d->key, other_lines.size() > 1 ? "s" : "", fmt::join(other_lines, ", "), where);
    }
    throw Error(message);
  }

  std::string_view s_;
  const HjsonOptions& opts_;
  std::vector<Duplicate> duplicates_;
};

}  // namespace

nlohmann::ordered_json parse_hjson(std::string_view text, const HjsonOptions& opts) { return Parser(text, opts).parse(); }

}  // namespace dstrain
