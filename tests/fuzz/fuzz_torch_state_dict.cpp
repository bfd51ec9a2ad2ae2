// A torch.save zip (`--init-from pytorch_model.bin`, DeepSpeed's mp_rank_00_model_states.pt): the
// archive and its pickle read and checked, then every floating-point tensor read as fp32.
//
// Two kinds of input. Most are the file itself. One that begins with "PKL!" is a pickle program
// (repeat markers expanded, fuzz_expand.h) that this target wraps into a torch archive with one
// storage "0" of 16 floats: mutations then change opcodes, nesting and the sizes and strides given
// to _rebuild_tensor_v2 instead of the zip's offsets (the seeds in corpus/torch_state_dict/*.pkl).
//
// Each input is also read whole as a value tree (TorchPickle, formats/torch_pickle.h: the reader of
// DeepSpeed's optimizer files, which also reads DeepSpeed's loss scaler, ZeroStageEnum and
// fragment_address as inert objects): the tree is walked, every tensor read, and the typed
// accessors asked for what DeepSpeed's reader asks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_expand.h"
#include "fuzz_small_stack.h"
#include "fuzz_input_file.h"
#include "fuzz_stored_zip.h"
#include "ops/error.h"
#include "formats/torch_pickle.h"
#include "formats/torch_state_dict.h"

namespace {

// Every node visited (a bounded depth: the tree itself is at most 100 deep), tensors read, and the
// accessors DeepSpeed's reader uses tried on each — an Error is a fine answer, anything else a bug.
void walk(const dstrain::TorchPickle& p, const dstrain::TorchValue& v) {
  const auto quietly = [](auto&& f) {
    try {
      f();
    } catch (const dstrain::Error&) {
    }
  };
  quietly([&] { (void)v.as_int(); });
  quietly([&] { (void)v.as_double(); });
  quietly([&] { (void)v.at("optimizer_state_dict"); });
  quietly([&] { (void)v.at(std::int64_t{0}); });
  quietly([&] { (void)v[0]; });
  if (v.is_tensor()) quietly([&] { (void)p.read_f64(v); });
  for (const dstrain::TorchValue& x : v.items) walk(p, x);
  for (const auto& [k, x] : v.pairs) walk(p, x);
  if (v.state) walk(p, *v.state);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string archive;
  if (dstrain::fuzz::strip_mode(in, "PKL!")) {
    const std::string storage(16 * sizeof(float), '\x01');
    archive =
        dstrain::fuzz::stored_zip({{"archive/data.pkl", dstrain::fuzz::expand_repeats(in)}, {"archive/data/0", storage}, {"archive/version", "3\n"}});
    data = reinterpret_cast<const std::uint8_t*>(archive.data());
    size = archive.size();
  }
  const auto path = dstrain::fuzz::input_file(data, size, ".pt");
  // On a small stack, where a recursion without bound overflows (fuzz_small_stack.h).
  dstrain::fuzz::run_on_small_stack([&] {
    try {
      const dstrain::TorchStateDict sd(path);
      for (const auto& [name, t] : sd.tensors()) {
        if (t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "F64") (void)sd.read_fp32(name);
      }
    } catch (const dstrain::Error&) {
    }
    try {
      const dstrain::TorchPickle tree(path);
      walk(tree, tree.root());
    } catch (const dstrain::Error&) {
    }
  });
  return 0;
}
