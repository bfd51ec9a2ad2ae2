// A Hugging Face config.json (`--model path/config.json`): read as GPT-2 and as the Llama family.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_expand.h"
#include "fuzz_small_stack.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_config.h"
#include "models/llama/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string expanded = dstrain::fuzz::expand_repeats(data, size);  // deep nesting (fuzz_expand.h)
  const std::string_view text(expanded);
  // On a small stack, where a recursion without bound overflows (fuzz_small_stack.h).
  dstrain::fuzz::run_on_small_stack([&] {
    try {
      const dstrain::Gpt2Config c = dstrain::gpt2_config_from_hf_json(text, "fuzz/config.json");
      (void)dstrain::parameter_count_padded(c);
      (void)dstrain::describe(c);
    } catch (const dstrain::Error&) {
    }
    (void)dstrain::is_llama_family_json(text);
    try {
      const dstrain::LlamaConfig c = dstrain::llama_config_from_hf_json(text, "fuzz/config.json");
      (void)dstrain::parameter_count(c);
      (void)dstrain::describe(c);
      (void)dstrain::llama_hf_config_json(c);
    } catch (const dstrain::Error&) {
    }
  });
  return 0;
}
