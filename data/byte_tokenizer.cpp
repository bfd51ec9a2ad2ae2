#include "data/byte_tokenizer.h"

#include "ops/error.h"

namespace dstrain {

void ByteTokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  out.reserve(out.size() + text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == kEotToken) {
      fail(
          "byte 0xFF at offset {} of the text: the bytes tokenizer reserves it as the end-of-text token, and "
          "it never occurs in UTF-8; convert the input to UTF-8 or use --tokenizer gpt2",
          i);
    }
    out.push_back(byte);
  }
}

std::string ByteTokenizer::decode(std::span<const std::int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t token = tokens[i];
    if (token < 0 || token > 0xFF) {
      fail("token {} at position {} is not a byte: the bytes tokenizer has ids 0..255", token, i);
    }
    text.push_back(static_cast<char>(token));
  }
  return text;
}

}  // namespace dstrain
