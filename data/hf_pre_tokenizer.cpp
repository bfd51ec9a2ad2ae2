#include "data/hf_pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/tokenizer_json.h"
#include "formats/json_text.h"
#include "data/utf8.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/quoted_excerpt.h"

namespace dstrain {
namespace {

constexpr const char* kSupported = "Split (Isolated or Removed), ByteLevel, Digits, Metaspace, Sequence";

// JavaScript's \s (Unicode Zs, TAB..CR, U+2028/9, U+FEFF; not U+0085), spelled out for PCRE2 whose \s
// differs in those two.
constexpr std::string_view kJsSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

// GPT-2's pattern as transformers.js's ByteLevel pre-tokenizer writes it.
constexpr std::string_view kByteLevelPattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct Pcre2CodeDeleter {
  void operator()(pcre2_code* code) const noexcept { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
  void operator()(pcre2_match_data* data) const noexcept { pcre2_match_data_free(data); }
};

class Regex {
 public:
  // `pattern`: as the tokenizer file gives it; `rewritten`: for PCRE2 (js_regex_for_pcre2).
  Regex(const std::string& pattern, const std::string& rewritten, bool literal, const std::string& where) : pattern_(pattern), where_(where) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    const std::uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(), options, &error_code, &error_offset, nullptr));
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error_code, message.data(), message.size());
      fail("{}: PCRE2 cannot compile the pattern {} (as rewritten for PCRE2: {}) at offset {}: {}", where, quoted_excerpt(pattern),
           quoted_excerpt(rewritten), error_offset, reinterpret_cast<const char*>(message.data()));
    }
    if (pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE) != 0) log_debug("PCRE2 JIT is not available; {} runs interpreted", where);
  }
  // Calls f(begin, end) for every non-empty match, left to right (text is valid UTF-8).
  template <typename F>
  void for_each_match(std::string_view text, F&& f) const {
    const std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> match(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (!match) fail("out of memory creating PCRE2 match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    for (PCRE2_SIZE offset = 0; offset < text.size();) {
      const int rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) match_failed(rc, text, offset);
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      if (ovector[1] > ovector[0]) {
        f(ovector[0], ovector[1]);
        offset = ovector[1];
      } else {
        // An empty match: JavaScript's matchAll steps one character on (the "u" flag: a code point).
        offset = ovector[0] + 1;
        while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
      }
    }
  }

 private:
  // A match that PCRE2 gave up on. Its limits (match steps, backtracking depth, heap) stop a pattern
  // that backtracks exponentially on some text, as (a+)+b does on "aaa…ac"; the tokenizer file
  // holds the pattern, so the message names both, and where in which text it happened.
  [[noreturn]] void match_failed(int rc, std::string_view text, std::size_t offset) const {
    std::string why;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) {
      why = "the pattern backtracks too much on this text (PCRE2's limit of match steps, depth or memory was reached)";
    } else {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      why = fmt::format("PCRE2 error {}: {}", rc, reinterpret_cast<const char*>(message.data()));
    }
    fail(
        "{}: the pre-tokenizer pattern {} cannot split a {}-byte piece of text at byte {} (there: {}): {}. The tokenizer file's "
        "pattern needs fixing (a nested repeat such as (a+)+ matches what a+ matches, without the backtracking), or "
        "split the document into smaller ones",
        where_, quoted_excerpt(pattern_), text.size(), offset, quoted_excerpt(text.substr(offset), 40), why);
  }

  std::unique_ptr<pcre2_code, Pcre2CodeDeleter> code_;
  std::string pattern_, where_;
};

}  // namespace

std::string js_regex_for_pcre2(std::string_view pattern) {
  std::string s(pattern);
  // transformers.js (createPattern): unneeded escapes of # & ~ dropped, and two patterns JavaScript
  // cannot compile rewritten; the first is the case-insensitive group of Llama 3's and Qwen's split.
  for (const char c : {'#', '&', '~'}) replace_all(s, std::string{'\\', c}, std::string{c});
  replace_all(s, "(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");
  replace_all(s, " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+", " ?[^\\s.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c]+");
  // Then JavaScript's classes spelled out, inside and outside brackets.
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\' && i + 1 < s.size()) {
      const char e = s[i + 1];
      const auto cls = [&](std::string_view members, bool negated) {
        if (in_class) {
          if (negated) fail("the pattern {:?} uses \\{} inside a character class, which dstrain cannot rewrite for PCRE2", std::string(pattern), e);
          out += members;
        } else {
          out += negated ? "[^" : "[";
          out += members;
          out += "]";
        }
      };
      switch (e) {
        case 's':
          cls(kJsSpace, false);
          break;
        case 'S':
          cls(kJsSpace, true);
          break;
        case 'd':
          cls("0-9", false);
          break;
        case 'D':
          cls("0-9", true);
          break;
        case 'w':
          cls("A-Za-z0-9_", false);
          break;
        case 'W':
          cls("A-Za-z0-9_", true);
          break;
        default:
          out += c;
          out += e;
          break;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < s.size() && s[i + 1] == '^') out += s[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    if (!in_class && c == '.') {
      out += "[^\\n\\r\\x{2028}\\x{2029}]";  // JavaScript's '.' without the s flag
      continue;
    }
    out += c;
  }
  return out;
}

struct HfPreTokenizer::Step {
  enum class Kind { split, byte_level, digits, metaspace } kind;
  std::unique_ptr<Regex> regex;   // split; byte_level with use_regex
  bool removed = false;           // split: drop the matches (Removed) instead of keeping them (Isolated)
  bool add_prefix_space = false;  // byte_level
  bool individual_digits = false;
  std::string replacement;  // metaspace
  enum class Prepend { always, first, never } prepend = Prepend::always;
  bool split_words = true;  // metaspace
};

HfPreTokenizer::HfPreTokenizer() = default;
HfPreTokenizer::HfPreTokenizer(HfPreTokenizer&&) noexcept = default;
HfPreTokenizer& HfPreTokenizer::operator=(HfPreTokenizer&&) noexcept = default;
HfPreTokenizer::~HfPreTokenizer() = default;

void HfPreTokenizer::parse_into(const nlohmann::json& config, const std::string& where, HfPreTokenizer& out, int depth) {
  // Real tokenizers nest a Sequence once or twice; a crafted file nesting 50,000 deep would exhaust
  // the stack (and the error paths' memory), so the depth is bounded.
  if (depth > kMaxTokenizerNesting) {
    fail("{}: pre-tokenizer Sequences nest more than {} deep; no tokenizer needs that — this tokenizer.json is damaged or crafted",
         where.substr(0, 200), kMaxTokenizerNesting);
  }
  if (config.is_null()) return;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    fail("{} should be null or an object with a \"type\"", where);
  }
  if (out.byte_level_) {
    fail(
        "{} follows a ByteLevel pre-tokenizer; dstrain needs ByteLevel to be the last step (it then works on the "
        "bytes)",
        where);
  }
  const std::string type = config["type"].get<std::string>();
  auto step = std::make_unique<Step>();
  if (type == "Sequence") {
    const auto list = config.find("pretokenizers");
    if (list == config.end() || !list->is_array()) fail("{}.pretokenizers should be a list", where);
    for (std::size_t i = 0; i < list->size(); ++i) parse_into((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", out, depth + 1);
    return;
  }
  if (type == "Split") {
    step->kind = Step::Kind::split;
    const auto pattern = config.find("pattern");
    if (pattern != config.end() && pattern->is_object() && pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      const std::string regex = (*pattern)["Regex"].get<std::string>();
      step->regex = std::make_unique<Regex>(regex, js_regex_for_pcre2(regex), false, where + ".pattern.Regex");
    } else if (pattern != config.end() && pattern->is_object() && pattern->contains("String") && (*pattern)["String"].is_string()) {
      const std::string literal = (*pattern)["String"].get<std::string>();
      step->regex = std::make_unique<Regex>(literal, literal, true, where + ".pattern.String");
    } else {
      fail("{}.pattern should be {{\"Regex\": ...}} or {{\"String\": ...}}", where);
    }
    const std::string behavior = tokenizer_json::string_or(config, "behavior", "Isolated", where);
    if (behavior != "Isolated" && behavior != "Removed") {
      fail("{}.behavior is \"{}\"; dstrain implements Isolated and Removed (supported pre-tokenizers: {})", where, behavior, kSupported);
    }
    step->removed = behavior == "Removed";
    if (tokenizer_json::bool_or(config, "invert", false, where)) fail("{}.invert is true; dstrain implements Split with invert false only", where);
  } else if (type == "ByteLevel") {
    step->kind = Step::Kind::byte_level;
    // Hugging Face's defaults: add_prefix_space true, use_regex true.
    step->add_prefix_space = tokenizer_json::bool_or(config, "add_prefix_space", true, where);
    if (tokenizer_json::bool_or(config, "use_regex", true, where)) {
      step->regex = std::make_unique<Regex>(std::string(kByteLevelPattern), js_regex_for_pcre2(kByteLevelPattern), false,
                                            where + " (ByteLevel's GPT-2 pattern)");
    }
    out.byte_level_ = true;
  } else if (type == "Digits") {
    step->kind = Step::Kind::digits;
    step->individual_digits = tokenizer_json::bool_or(config, "individual_digits", false, where);
  } else if (type == "Metaspace") {
    step->kind = Step::Kind::metaspace;
    step->replacement = tokenizer_json::string_or(config, "replacement", "\u2581", where);
    if (step->replacement.empty()) fail("{}.replacement is empty", where);
    if (config.contains("prepend_scheme") && !config["prepend_scheme"].is_null()) {
      const std::string scheme = config["prepend_scheme"].is_string() ? config["prepend_scheme"].get<std::string>() : "";
      if (scheme == "always")
        step->prepend = Step::Prepend::always;
      else if (scheme == "first")
        step->prepend = Step::Prepend::first;
      else if (scheme == "never")
        step->prepend = Step::Prepend::never;
      else
        fail("{}.prepend_scheme is {}; use \"always\", \"first\" or \"never\"", where, json_excerpt(config["prepend_scheme"]));
    } else {
      step->prepend = tokenizer_json::bool_or(config, "add_prefix_space", true, where) ? Step::Prepend::always : Step::Prepend::never;
    }
    step->split_words = tokenizer_json::bool_or(config, "split", true, where);
  } else {
    fail(
        "{}.type is \"{}\", which dstrain does not implement; supported pre-tokenizers: {}. Tokenising without it "
        "would give other ids than the model was trained with",
        where, type, kSupported);
  }
  out.steps_.push_back(std::move(step));
}

HfPreTokenizer HfPreTokenizer::parse(const nlohmann::json& config, std::string_view where) {
  HfPreTokenizer p;
  parse_into(config, std::string(where), p);
  return p;
}

void HfPreTokenizer::split(std::string_view section, bool first_section, std::vector<std::string>& pieces) const {
  std::vector<std::string> current{std::string(section)}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (std::size_t p = 0; p < current.size(); ++p) {
      std::string piece = std::move(current[p]);
      switch (step->kind) {
        case Step::Kind::split: {
          std::size_t last = 0;
          step->regex->for_each_match(piece, [&](std::size_t begin, std::size_t end) {
            if (begin > last) next.push_back(piece.substr(last, begin - last));
            if (!step->removed) next.push_back(piece.substr(begin, end - begin));
            last = end;
          });
          if (last < piece.size()) next.push_back(piece.substr(last));
          break;
        }
        case Step::Kind::byte_level: {
          if (step->add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
          if (!step->regex) {
            next.push_back(std::move(piece));
            break;
          }
          step->regex->for_each_match(piece, [&](std::size_t begin, std::size_t end) { next.push_back(piece.substr(begin, end - begin)); });
          break;
        }
        case Step::Kind::digits: {
          std::size_t start = 0;
          const auto digit = [](char c) { return c >= '0' && c <= '9'; };
          for (std::size_t i = 0; i < piece.size(); ++i) {
            const bool boundary = i > start && (digit(piece[i]) != digit(piece[i - 1]) || (step->individual_digits && digit(piece[i])));
            if (boundary) {
              next.push_back(piece.substr(start, i - start));
              start = i;
            }
          }
          if (start < piece.size()) next.push_back(piece.substr(start));
          break;
        }
        case Step::Kind::metaspace: {
          std::string replaced;
          for (const char c : piece) {
            if (c == ' ')
              replaced += step->replacement;
            else
              replaced += c;
          }
          const bool prepend = step->prepend == Step::Prepend::always || (step->prepend == Step::Prepend::first && first_section && p == 0);
          if (prepend && replaced.compare(0, step->replacement.size(), step->replacement) != 0) replaced.insert(0, step->replacement);
          if (!step->split_words) {
            next.push_back(std::move(replaced));
            break;
          }
          // Each replacement starts a new piece (Hugging Face's MergedWithNext).
          std::size_t start = 0;
          for (std::size_t at = replaced.find(step->replacement, 1); at != std::string::npos; at = replaced.find(step->replacement, at + 1)) {
            if (at > start) next.push_back(replaced.substr(start, at - start));
            start = at;
          }
          if (start < replaced.size()) next.push_back(replaced.substr(start));
          break;
        }
      }
    }
    current.swap(next);
  }
  for (auto& piece : current) {
    if (!piece.empty()) pieces.push_back(std::move(piece));
  }
}

}  // namespace dstrain
