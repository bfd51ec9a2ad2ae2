// AddedTokens: the "added_tokens" of a Hugging Face tokenizer.json (special tokens such as <s>,
// <|end_of_text|>, <|im_start|>, and non-special ones such as Qwen's <think>). Text is first cut at
// every occurrence of one of them, the longest at the leftmost position, before normalisation and
// pre-tokenisation, as Hugging Face tokenizers and transformers.js do; each occurrence becomes its id.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dstrain {

class AddedTokens {
 public:
  struct Section {
    std::string_view text;  // the section's bytes (an added token's content when id >= 0)
    std::int32_t id;        // the added token's id, or -1 for text between added tokens
  };

  void add(std::string content, std::int32_t id);
  // Cuts `text` into sections; empty text sections are left out.
  std::vector<Section> split(std::string_view text) const;
  // The id of an added token with exactly this content, or -1.
  std::int32_t find(std::string_view content) const;
  bool empty() const { return by_content_.empty(); }

 private:
  // For each first byte, the contents starting with it, longest first.
  std::vector<std::vector<std::pair<std::string, std::int32_t>>> by_first_byte_ = std::vector<std::vector<std::pair<std::string, std::int32_t>>>(256);
  std::unordered_map<std::string, std::int32_t> by_content_;
};

}  // namespace dstrain
