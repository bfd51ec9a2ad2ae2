// Gpt2Tokenizer: GPT-2's byte-level BPE (vocabulary 50257), token for token the same as the npm
// package gpt-3-encoder (its Encoder.js is a port of openai/gpt-2's encoder.py).
//
// encode() splits the text with GPT-2's pre-tokenisation pattern (PCRE2, JIT-compiled once), then
// merges the bytes of each piece by the ranks of vocab.bpe. "<|endoftext|>" inside a text is NOT
// special: it is encoded as the plain characters it is made of, as Encoder.js does; the data
// preparation writes eot_token() between documents itself.
//
// Where Encoder.js departs from encoder.py, we follow Encoder.js (the reference our tests run):
//  - its merge table is keyed by the string "first,second", so a pair whose joined key equals a
//    merge's key (e.g. ("\",", "\"") and the merge ("\"", ",\"")) also merges at that rank (25 such
//    pairs in vocab.bpe; a search of punctuation runs found none that changes the result, but we
//    keep the same keys so that none can);
//  - among pairs of equal rank the last one in the word wins;
//  - JavaScript's \s (Unicode Zs, TAB..CR, U+2028/9, U+FEFF; not U+0085) is the whitespace class;
//  - text that is not valid UTF-8 is first decoded with U+FFFD replacing each maximal invalid
//    subsequence (WHATWG), as node's readFileSync(file, "utf8") does, so decode(encode(x)) == x only
//    for valid UTF-8.
// Letter/number classes come from PCRE2's Unicode tables, which may lag V8's by a Unicode version
// for newly assigned characters.
#pragma once

#include <filesystem>
#include <memory>

#include "data/tokenizer.h"

namespace dstrain {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr std::int32_t kEotToken = 50256;
  static constexpr std::int32_t kVocabSize = 50257;

  // Reads <dir>/encoder.json and <dir>/vocab.bpe. Throws Error naming the file if one is missing or
  // malformed, and saying that scripts/setup.sh fetches them.
  static Gpt2Tokenizer load(const std::filesystem::path& dir);

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer() override;

  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> tokens) const override;
  std::int32_t eot_token() const override { return kEotToken; }
  std::int32_t vocab_size() const override { return kVocabSize; }
  std::string_view name() const override { return "gpt2"; }

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain
