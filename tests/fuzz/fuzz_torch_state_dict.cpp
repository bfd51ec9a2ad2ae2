// A torch.save zip (`--init-from pytorch_model.bin`, DeepSpeed's mp_rank_00_model_states.pt): the
// archive and its pickle read and checked, then every floating-point tensor read as fp32.
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.h"
#include "ops/error.h"
#include "formats/torch_state_dict.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = dstrain::fuzz::input_file(data, size, ".pt");
  try {
    const dstrain::TorchStateDict sd(path);
    for (const auto& [name, t] : sd.tensors()) {
      if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "F64") (void)sd.read_fp32(name);
    }
  } catch (const dstrain::Error&) {
  }
  return 0;
}
