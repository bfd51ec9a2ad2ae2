#include "data/tokenizer.h"

#include "data/byte_tokenizer.h"
#include "data/cache_dir.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "ops/error.h"

namespace dstrain {

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name, const std::filesystem::path& cache_dir) {
  if (name == "gpt2") return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(gpt2_encoder_dir(cache_dir)));
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  const std::filesystem::path path(name);
  std::error_code error;
  if (path.extension() == ".json" || std::filesystem::is_directory(path, error)) {
    return std::make_unique<HfTokenizer>(HfTokenizer::load(path));
  }
  fail(
      "unknown tokenizer '{}': use 'gpt2' (GPT-2 byte-level BPE, vocab 50257), 'bytes' (one token per byte), or "
      "the path of a Hugging Face tokenizer.json (or of the folder holding it)",
      name);
}

}  // namespace dstrain
