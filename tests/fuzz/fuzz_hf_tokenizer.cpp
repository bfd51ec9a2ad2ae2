// A Hugging Face tokenizer.json (`prepare-data --tokenizer`, `train --tokenizer`): loaded with a fixed
// tokenizer_config.json beside it, then a text of every kind (scripts, digits, whitespace runs, special
// tokens, invalid UTF-8) encoded and decoded.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_expand.h"
#include "fuzz_small_stack.h"
#include "data/hf_tokenizer.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A private folder: the config must lie beside the tokenizer.json.
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("dstrain_fuzz_hf_tokenizer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::ofstream(d / "tokenizer_config.json") << R"({"add_bos_token": true, "bos_token": "<s>", "eos_token": "</s>"})";
    return d;
  }();
  // Repeat markers expanded (fuzz_expand.h): the Sequence steps of the seeds nest as deep as a count says.
  const std::string text = dstrain::fuzz::expand_repeats(data, size);
  std::ofstream(dir / "tokenizer.json", std::ios::binary | std::ios::trunc).write(text.data(), static_cast<std::streamsize>(text.size()));
  // On a small stack, where a recursion without bound overflows (fuzz_small_stack.h).
  dstrain::fuzz::run_on_small_stack([&] {
    try {
      const dstrain::HfTokenizer tokenizer = dstrain::HfTokenizer::load(dir / "tokenizer.json");
      std::vector<std::int32_t> ids;
      tokenizer.encode_document("Hello  world\n\n 12345 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 <s></s> \xff\xfe x", ids);
      (void)tokenizer.decode(ids);
    } catch (const dstrain::Error&) {
    }
  });
  return 0;
}
