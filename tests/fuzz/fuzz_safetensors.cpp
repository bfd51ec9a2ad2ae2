// A safetensors file (`--init-from`, consolidated weights): map and validate, then read every
// floating-point entry as fp32.
//
// An input that begins with "HDR!" is the JSON header alone (repeat markers expanded,
// fuzz_expand.h): this target writes its length prefix and 64 bytes of data after it, so that
// mutations reach the numbers in the header (offsets, shapes) rather than the prefix.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_expand.h"
#include "fuzz_small_stack.h"
#include "fuzz_input_file.h"
#include "ops/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string file;
  if (dstrain::fuzz::strip_mode(in, "HDR!")) {
    const std::string header = dstrain::fuzz::expand_repeats(in);
    for (int i = 0; i < 8; ++i) file.push_back(static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i) & 0xFF));
    file += header;
    file.append(64, '\0');
    data = reinterpret_cast<const std::uint8_t*>(file.data());
    size = file.size();
  }
  const auto path = dstrain::fuzz::input_file(data, size, ".safetensors");
  // On a small stack, where a recursion without bound overflows (fuzz_small_stack.h).
  dstrain::fuzz::run_on_small_stack([&] {
    try {
      const dstrain::SafetensorsFile f(path);
      for (const dstrain::SafetensorsEntry& e : f.entries()) {
        (void)f.bytes(e);
        if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16") (void)f.read_fp32(e);
      }
    } catch (const dstrain::Error&) {
    }
  });
  return 0;
}
