// ByteTokenizer (--tokenizer bytes): one token per byte, vocabulary 256.
//
// The end-of-text token is 255: the byte 0xFF never occurs in UTF-8, so it can separate documents
// without a 257th id and decode() stays the exact inverse of encode(). The price: encode() rejects
// text holding a 0xFF byte (which is then not UTF-8) instead of silently merging documents.
#pragma once

#include "data/tokenizer.h"

namespace dstrain {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr std::int32_t kEotToken = 0xFF;

  // Throws Error naming the offset of a 0xFF byte in `text`.
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override;
  std::string decode(std::span<const std::int32_t> tokens) const override;
  std::int32_t eot_token() const override { return kEotToken; }
  std::int32_t vocab_size() const override { return 256; }
  std::string_view name() const override { return "bytes"; }
};

}  // namespace dstrain
