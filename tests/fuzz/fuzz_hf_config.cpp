// A Hugging Face GPT-2 config.json (`--model path/config.json`).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ops/error.h"
#include "ops/transformer/gpt2_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const dstrain::Gpt2Config c = dstrain::gpt2_config_from_hf_json(text, "fuzz/config.json");
    (void)dstrain::parameter_count_padded(c);
    (void)dstrain::describe(c);
  } catch (const dstrain::Error&) {
  }
  return 0;
}
