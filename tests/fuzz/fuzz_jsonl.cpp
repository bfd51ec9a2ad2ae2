// A JSON Lines file (`prepare-data --format jsonl`): every line's JSON, object and text key checked.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_expand.h"
#include "fuzz_small_stack.h"
#include "data/jsonl_documents.h"
#include "fuzz_input_file.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = dstrain::fuzz::expand_repeats(data, size);  // deep nesting (fuzz_expand.h)
  const auto path = dstrain::fuzz::input_file(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), ".jsonl");
  // On a small stack, where a recursion without bound overflows (fuzz_small_stack.h).
  dstrain::fuzz::run_on_small_stack([&] {
    try {
      std::vector<std::string> documents;
      dstrain::read_jsonl_documents(path, "text", documents);
    } catch (const dstrain::Error&) {
    }
  });
  return 0;
}
