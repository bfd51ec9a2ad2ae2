// A JSON Lines file (`prepare-data --format jsonl`): every line's JSON, object and text key checked.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/jsonl_documents.h"
#include "fuzz_input_file.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dstrain::fuzz::input_file(data, size, ".jsonl");
  try {
    std::vector<std::string> documents;
    dstrain::read_jsonl_documents(path, "text", documents);
  } catch (const dstrain::Error&) {
  }
  return 0;
}
