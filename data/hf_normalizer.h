// HfNormalizer: the "normalizer" of a Hugging Face tokenizer.json, applied to each text section
// (between added tokens) before pre-tokenisation.
//
// Supported types: NFC, NFD, NFKC, NFKD (ICU), Prepend {prepend} (added in front of a non-empty
// section: Llama 2's "▁"), Replace {pattern: {String}, content} (every occurrence: Llama 2's " " ->
// "▁"), and Sequence {normalizers} of these. Any other type, or a Replace with a Regex pattern, is
// refused at load with the key path and this list: tokenising differently from the model's own
// tokenizer would silently train on other ids.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dstrain {

class HfNormalizer {
 public:
  // Parses `config` (null: no normalisation). `where` names the file and key for errors.
  static HfNormalizer parse(const nlohmann::json& config, std::string_view where);
  std::string apply(std::string_view text) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { nfc, nfd, nfkc, nfkd, prepend, replace };
  struct Step {
    Kind kind;
    std::string pattern;  // prepend: the text; replace: what is replaced
    std::string content;  // replace: the replacement
  };
  static void parse_into(const nlohmann::json& config, const std::string& where, std::vector<Step>& steps, int depth = 0);
  std::vector<Step> steps_;
};

}  // namespace dstrain
