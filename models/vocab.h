// The padded vocabulary every built-in family stores: the embedding (and an untied LM head) keep
// V rounded up to a multiple of 128 rows, as llm.c does, so that the vocabulary GEMMs run on
// aligned shapes; the padding rows stay zero and no token id reaches them.
#pragma once

#include <cstdint>

namespace dstrain {

inline constexpr std::int64_t kVocabPadMultiple = 128;

// V rounded up to a multiple of 128.
std::int64_t padded_vocab(std::int64_t vocab_size);

}  // namespace dstrain
