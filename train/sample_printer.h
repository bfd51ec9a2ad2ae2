// Samples at the val interval, printed as llm.c and nanoGPT print them: text decoded with the
// run's tokenizer, made printable, between "---" lines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "data/tokenizer.h"
#include "engine/generate.h"

namespace dstrain {

// The run's tokenizer for printing samples: `name` when given, else the default for the model's
// vocabulary: GPT-2's when it has exactly GPT-2's 50257 tokens, bytes when it has 256. Any other
// vocabulary (a Llama model's 128256, SmolLM's 49152) has no default — decoding it with GPT-2's or
// bytes would print the wrong text — so samples print token ids and `warning` says to give
// --tokenizer. Also nullptr, with `warning`, when the tokenizer does not load (GPT-2's encoder files
// missing from the cache) — a sample is never worth failing a run; and a `warning` (the tokenizer
// kept) when a given tokenizer has more tokens than the model.
std::unique_ptr<Tokenizer> sample_tokenizer(const std::string& name, std::int64_t vocab, std::string* warning);

// `bytes` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD, as
// nanoGPT's decode(errors="replace") prints: a barely trained byte-level model emits lone high
// bytes, which would otherwise reach the terminal or log as invalid UTF-8.
// The token a sample starts from without a prompt: the tokenizer's beginning-of-sequence token
// where its documents start with one (a Llama model saw every document begin with it), else its
// end-of-text token (GPT-2, as llm.c and nanoGPT start); GPT-2's <|endoftext|> without a
// tokenizer. 0 when that id is outside the model's vocabulary.
std::int32_t sample_start_token(const Tokenizer* tokenizer, std::int64_t vocab);

std::string printable_utf8(std::string_view bytes);

// Generates one sample and returns its block:
//   step S/N | sample (K tokens, top-k k, temperature t, seed s):
//   ---
//   <text, or the token ids without a tokenizer>
//   ---
std::string generate_sample_block(Generator& generator, const Tokenizer* tokenizer, const SamplingOptions& options, std::int64_t step,
                                  std::int64_t steps);

}  // namespace dstrain
