// PyTorch state dicts written by torch.save (the zip container of PyTorch >= 1.6): Hugging Face's
// pytorch_model.bin, DeepSpeed's mp_rank_00_model_states.pt ("module": the state dict) and
// zero_to_fp32's output — read without Python and without running any of the file's code.
//
// A torch.save file is a zip archive (stored, not compressed) holding <archive>/data.pkl, a pickle
// of the object, and <archive>/data/<key>, the raw bytes of each tensor storage (little-endian).
// The pickle is interpreted by a small machine that knows only the opcodes of plain data (dicts,
// lists, tuples, strings, numbers, booleans, None) and builds only these callables:
//   collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter,
//   torch.Size, builtins.set / frozenset, and the storage types torch.FloatStorage etc. as
//   persistent ids ('storage', type, key, location, numel).
// Anything else — any other global (os.system, builtins.eval, a class of the saving program), a
// NEWOBJ, an INST/OBJ — is refused with an Error naming it, before anything of it runs (unlike
// torch.load, which imports and calls whatever the file names).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace dstrain {

struct TorchTensorInfo {
  std::string dtype;  // safetensors-style: "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> stride;  // in elements
  std::int64_t storage_offset = 0;   // in elements
  std::string storage_key;           // the storage's file <archive>/data/<key>
};

class TorchStateDict {
 public:
  // Reads and checks the archive and the pickle. Every tensor reachable through nested dicts is
  // named by its keys joined with '.' ("module.transformer.h.0.ln_1.weight"); other values (step
  // counters, config dicts, lists) are read and dropped. Error naming the file and the cause: not a
  // zip of torch.save (e.g. the legacy pre-1.6 format), a compressed entry, a missing storage, a
  // tensor outside its storage, a refused global.
  explicit TorchStateDict(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TorchTensorInfo>& tensors() const { return tensors_; }
  // The tensor's elements in row-major order as fp32 (F32 / F16 / BF16 / F64). Error otherwise.
  std::vector<float> read_fp32(const std::string& name) const;

  // True when the file starts like a zip archive (torch.save) — how --init-from tells it from a
  // safetensors file.
  static bool looks_like(const std::filesystem::path& path);

 private:
  std::filesystem::path path_;
  std::map<std::string, TorchTensorInfo> tensors_;
  std::map<std::string, std::string> storages_;  // key -> bytes
};

}  // namespace dstrain
