// A DeepSpeed checkpoint folder (`--resume DIR` of a DeepSpeed run, `dstrain export`'s input):
// read_deepspeed_checkpoint over a save_checkpoint folder (ZeRO 0-2 with one or two ranks, ZeRO-3
// with two) or a universal one. The single files are fuzzed through the unpickler already
// (fuzz_torch_state_dict); this target fuzzes what the reader does across them: partitions joined
// over the ranks, paddings, param_shapes and groups, stage 0's group inference, ZeRO-3's per-parameter
// pieces, universal's per-parameter folders.
//
// The input is a layout byte and the folder's files joined by a separator
// (fuzz_deepspeed_files.h); the seeds, corpus/deepspeed_checkpoint/, are the project's writer's
// folders for a model of three small parameters (tests/unit/formats/test_deepspeed_checkpoint_seeds.cpp).
// A dstrain::Error is the expected answer to a bad folder; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "formats/deepspeed_checkpoint.h"
#include "ops/error.h"
#include "tests/fuzz/fuzz_deepspeed_files.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  static const fs::path root = fs::temp_directory_path() / ("dstrain_fuzz_ds_ckpt_" + std::to_string(::getpid()));
  if (!dstrain::fuzz::deepspeed_fuzz_unpack(std::string_view(reinterpret_cast<const char*>(data), size), root)) return 0;
  try {
    const dstrain::DeepSpeedTrainingState st = dstrain::read_deepspeed_checkpoint(root);
    // What the reader hands on must be whole: every name with a shape and values of that size.
    for (const std::string& n : st.names) {
      std::int64_t numel = 1;
      for (const std::int64_t d : st.shapes.at(n)) numel *= d;
      if (st.master.at(n).size() != static_cast<std::size_t>(numel)) __builtin_trap();
    }
  } catch (const dstrain::Error&) {
  }
  return 0;
}
