// Tokenizer: what the data preparation needs from any tokenizer.
//
// Token ids are int32, as the training loop consumes them (llm.c widens its uint16 file tokens to
// int too); token files store them as uint16 or, for vocabularies above 65536, uint32.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain {

// How deep a tokenizer.json's Sequence steps (normalizers, pre-tokenizers, decoders) may nest: real
// files nest once or twice; the bound keeps a crafted file from exhausting the stack.
inline constexpr int kMaxTokenizerNesting = 32;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the tokens of `text` (UTF-8) to `out`. Thread-safe.
  virtual void encode_append(std::string_view text, std::vector<std::int32_t>& out) const = 0;
  // Bytes of the text the tokens stand for. Throws Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const std::int32_t> tokens) const = 0;
  // Appends one document as prepare-data writes it: by default [eot, tokens of the document...], the
  // end-of-text token before each document as llm.c's scripts do; HfTokenizer writes
  // [bos?, tokens..., eos] as its tokenizer_config.json says.
  virtual void encode_document(std::string_view text, std::vector<std::int32_t>& out) const {
    out.push_back(eot_token());
    encode_append(text, out);
  }
  // The end-of-text token: between documents, and where generation stops.
  virtual std::int32_t eot_token() const = 0;
  // The beginning-of-sequence token when this tokenizer starts each document with one (Llama 2/3's
  // tokenizer.json); none for GPT-2's and bytes, whose documents follow an end-of-text token.
  virtual std::optional<std::int32_t> bos_token() const { return std::nullopt; }
  // Number of token ids; every id is < vocab_size().
  virtual std::int32_t vocab_size() const = 0;
  // The name make_tokenizer() accepts for this tokenizer.
  virtual std::string_view name() const = 0;

  std::vector<std::int32_t> encode(std::string_view text) const {
    std::vector<std::int32_t> out;
    encode_append(text, out);
    return out;
  }
};

// "gpt2": GPT-2's byte-level BPE, loaded from gpt2_encoder_dir(cache_dir).
// "bytes": one token per byte (cache_dir unused).
// A path ending in ".json", or a folder holding tokenizer.json: a Hugging Face tokenizer
// (hf_tokenizer.h).
// Throws Error for any other name, listing the accepted ones.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::filesystem::path& cache_dir);

}  // namespace dstrain
