// HfDecoder: the "decoder" of a Hugging Face tokenizer.json, which turns the tokens of an id
// sequence back into text (the samples printed during training use it).
//
// Supported types: ByteLevel (the vocabulary's byte alphabet back to bytes), ByteFallback (<0xXX>
// tokens to their byte), Replace {pattern: {String}, content}, Fuse, Strip {content, start, stop},
// Metaspace {replacement, prepend_scheme / add_prefix_space}, and Sequence {decoders} of these;
// anything else is refused at load with the key path and this list. Bytes come out as they are:
// where transformers.js would put U+FFFD for bytes that are not UTF-8, this keeps them, so that
// decode(encode(text)) == text for valid UTF-8 text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dstrain {

class HfDecoder {
 public:
  static HfDecoder parse(const nlohmann::json& config, std::string_view where);
  // `tokens`: each token's vocabulary string, except that a byte-level vocabulary's strings are
  // already bytes (HfTokenizer stores them so); added tokens as their content.
  std::string decode(std::vector<std::string> tokens) const;
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { byte_level, byte_fallback, replace, fuse, strip, metaspace };
  struct Step {
    Kind kind;
    std::string pattern;              // replace: what is replaced; strip: the character; metaspace: the replacement
    std::string content;              // replace: the replacement
    std::size_t start = 0, stop = 0;  // strip
    bool strip_first_space = false;   // metaspace
  };
  static void parse_into(const nlohmann::json& config, const std::string& where, HfDecoder& out, int depth = 0);
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace dstrain
