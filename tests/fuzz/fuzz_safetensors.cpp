// A safetensors file (`--init-from`, consolidated weights): map and validate, then read every
// floating-point entry as fp32.
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.h"
#include "ops/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dstrain::fuzz::input_file(data, size, ".safetensors");
  try {
    const dstrain::SafetensorsFile f(path);
    for (const dstrain::SafetensorsEntry& e : f.entries()) {
      (void)f.bytes(e);
      if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") (void)f.read_fp32(e);
    }
  } catch (const dstrain::Error&) {
  }
  return 0;
}
