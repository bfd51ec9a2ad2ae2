#include "models/vocab.h"

namespace dstrain {

std::int64_t padded_vocab(std::int64_t vocab_size) { return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple; }

}  // namespace dstrain
