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
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "formats/deepspeed_checkpoint.h"
#include "ops/error.h"
#include "tests/fuzz/fuzz_deepspeed_files.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace fs = std::filesystem;
  static const fs::path root = fs::temp_directory_path() / ("dstrain_fuzz_ds_ckpt_" + std::to_string(::getpid()));
  if (!dstrain::fuzz::deepspeed_fuzz_unpack(std::string_view(reinterpret_cast<const char*>(data), size), root)) return 0;
  // `--resume DIR` asks this first (it reads `latest` and looks for the tag's files); a bool, never a throw.
  (void)dstrain::is_deepspeed_checkpoint(root);
  try {
    const dstrain::DeepSpeedTrainingState st = dstrain::read_deepspeed_checkpoint(root);
    // What the reader hands on must be whole (its callers index by these sizes): every name once,
    // with a shape, and its master, module weights and optimizer states of that many values; every
    // group member a name.
    std::set<std::string> names;
    for (const std::string& n : st.names) {
      if (!names.insert(n).second) __builtin_trap();
      std::int64_t numel = 1;
      for (const std::int64_t d : st.shapes.at(n)) numel *= d;
      const auto whole = [numel](const std::vector<float>& v) { return v.size() == static_cast<std::size_t>(numel); };
      if (!whole(st.master.at(n)) || !whole(st.module.at(n))) __builtin_trap();
      for (const auto& [key, per_name] : st.optimizer_states)
        if (const auto it = per_name.find(n); it != per_name.end() && !whole(it->second)) __builtin_trap();
    }
    for (const dstrain::DeepSpeedParamGroup& g : st.groups)
      for (const std::string& n : g.names)
        if (!names.contains(n)) __builtin_trap();
  } catch (const dstrain::Error&) {
  }
  return 0;
}
