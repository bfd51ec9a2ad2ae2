// HfPreTokenizer: the "pre_tokenizer" of a Hugging Face tokenizer.json, which cuts each normalised
// text section into the pieces BPE then works on one by one.
//
// Supported types:
//  - Split {pattern: {Regex} or {String}, behavior: Isolated or Removed, invert: false}: Llama 3's
//    and Qwen's pattern. Regexes run in PCRE2 with JavaScript's meaning of \s \S \d \w and '.', and
//    with transformers.js's rewrite of the case-insensitive group (?i:'s|'t|...) to ASCII cases, so
//    that pieces are those of the transformers.js tokenizers our tests compare with.
//  - ByteLevel {add_prefix_space, use_regex}: GPT-2's pattern (when use_regex), then the pieces'
//    bytes are what BPE starts from (byte_level()). Must be the last step.
//  - Digits {individual_digits}: runs of ASCII digits (or single digits) apart from the rest.
//  - Metaspace {replacement, prepend_scheme always/first/never (or add_prefix_space), split}: spaces
//    become the replacement ("▁"), which is prepended as the scheme says, and with split (Hugging
//    Face's default) each replacement starts a new piece.
//  - Sequence {pretokenizers} of these.
// Anything else is refused at load with the key path and this list.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dstrain {

class HfPreTokenizer {
 public:
  static HfPreTokenizer parse(const nlohmann::json& config, std::string_view where);
  HfPreTokenizer(HfPreTokenizer&&) noexcept;
  HfPreTokenizer& operator=(HfPreTokenizer&&) noexcept;
  ~HfPreTokenizer();

  // Appends the pieces of `section`; `first_section`: the section starts the text (Metaspace "first").
  void split(std::string_view section, bool first_section, std::vector<std::string>& pieces) const;
  // Whether a ByteLevel step ends the chain: then BPE starts from the pieces' bytes, else from their
  // UTF-8 characters.
  bool byte_level() const { return byte_level_; }

 private:
  HfPreTokenizer();
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
  static void parse_into(const nlohmann::json& config, const std::string& where, HfPreTokenizer& out, int depth = 0);
};

// `pattern` (Hugging Face / JavaScript syntax) rewritten for PCRE2 so that it matches what
// JavaScript's RegExp with the "u" flag matches; exposed for the tests.
std::string js_regex_for_pcre2(std::string_view pattern);

}  // namespace dstrain
