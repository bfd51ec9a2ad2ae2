// Samples at the val interval, printed as llm.c and nanoGPT print them: text decoded with the
// run's tokenizer, made printable, between "---" lines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/data/tokenizer.h"
#include "engine/generate.h"

namespace dstrain {

// The run's tokenizer for printing samples: `name` when given, else GPT-2's when the model's
// vocabulary holds its 50257 tokens, else bytes. nullptr (samples print as token ids) when it does
// not load (GPT-2's encoder files missing from the cache); `warning` then says why — a sample is
// never worth failing a run.
std::unique_ptr<Tokenizer> sample_tokenizer(const std::string& name, std::int64_t vocab, std::string* warning);

// `bytes` with every byte that does not start a valid UTF-8 sequence replaced by U+FFFD, as
// nanoGPT's decode(errors="replace") prints: a barely trained byte-level model emits lone high
// bytes, which would otherwise reach the terminal or log as invalid UTF-8.
std::string printable_utf8(std::string_view bytes);

// Generates one sample and returns its block:
//   step S/N | sample (K tokens, top-k k, temperature t, seed s):
//   ---
//   <text, or the token ids without a tokenizer>
//   ---
std::string generate_sample_block(Generator& generator, const Tokenizer* tokenizer, const SamplingOptions& options, std::int64_t step,
                                  std::int64_t steps);

}  // namespace dstrain
