#include "train/sample_printer.h"

#include <vector>

#include <fmt/format.h>

#include "data/cache_dir.h"
#include "data/gpt2_tokenizer.h"
#include "ops/error.h"

namespace dstrain {

std::unique_ptr<Tokenizer> sample_tokenizer(const std::string& name, std::int64_t vocab, std::string* warning) {
  std::string chosen = name;
  if (chosen.empty()) {
    if (vocab == Gpt2Tokenizer::kVocabSize)
      chosen = "gpt2";
    else if (vocab == 256)
      chosen = "bytes";
    else {
      if (warning != nullptr) {
        *warning = fmt::format(
            "samples print token ids: the model's vocabulary of {} tokens is neither GPT-2's {} nor bytes' 256; give "
            "--tokenizer path/to/tokenizer.json (the one the data was prepared with) to print them as text",
            vocab, Gpt2Tokenizer::kVocabSize);
      }
      return nullptr;
    }
  }
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = make_tokenizer(chosen, resolve_cache_dir());
  } catch (const Error& e) {
    if (warning != nullptr) *warning = fmt::format("samples print token ids: the {} tokenizer did not load ({})", chosen, e.what());
    return nullptr;
  }
  if (tokenizer->vocab_size() > vocab && warning != nullptr) {
    *warning = fmt::format(
        "the {} tokenizer has {} tokens, the model's vocabulary {}: check that --tokenizer is the one the data was "
        "prepared with (samples may decode wrongly)",
        chosen, tokenizer->vocab_size(), vocab);
  }
  return tokenizer;
}

std::int32_t sample_start_token(const Tokenizer* tokenizer, std::int64_t vocab) {
  std::int32_t start = Gpt2Tokenizer::kEotToken;
  if (tokenizer != nullptr) start = tokenizer->bos_token().value_or(tokenizer->eot_token());
  return start < vocab ? start : 0;
}

std::string printable_utf8(std::string_view bytes) {
  std::string out;
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = u[i];
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80)
      len = 1;
    else if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
    }
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = k == 1 ? (u[i + k] >= lo && u[i + k] <= hi) : (u[i + k] >= 0x80 && u[i + k] <= 0xBF);
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

std::string generate_sample_block(Generator& generator, const Tokenizer* tokenizer, const SamplingOptions& options, std::int64_t step,
                                  std::int64_t steps) {
  const std::vector<std::int32_t> out = generator.generate({}, options);
  std::string text;
  if (tokenizer != nullptr) {
    text = printable_utf8(decode_for_print(*tokenizer, out));
  } else {
    for (const std::int32_t id : out) text += fmt::format("{}{}", text.empty() ? "" : " ", id);
  }
  return fmt::format("step {}/{} | sample ({} tokens, top-k {}, temperature {}, seed {}):\n---\n{}\n---", step, steps, options.max_new_tokens,
                     options.top_k, options.temperature, options.seed, text);
}

}  // namespace dstrain
