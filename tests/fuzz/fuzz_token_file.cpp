// An llm.c token file (`--data`, `--val-data`): open (header checks), then read every token.
#include <cstddef>
#include <cstdint>

#include "data/token_file.h"
#include "fuzz_input_file.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dstrain::fuzz::input_file(data, size, ".bin");
  try {
    const dstrain::TokenFile f = dstrain::TokenFile::open(path);
    (void)f.read_all();
  } catch (const dstrain::Error&) {
  }
  return 0;
}
