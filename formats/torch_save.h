// Files that torch.load reads, written without Python — the other direction of the restricted
// unpickler (formats/torch_pickle.h): a TorchValue tree (dicts, lists, tuples, numbers, strings,
// bytes, None, tensors, and the objects DeepSpeed's checkpoints hold) saved as torch.save saves it.
//
// The container is torch.save's (PyTorch >= 1.6): a zip archive, every entry stored (not
// compressed) and its data 64-byte aligned as torch's writer aligns it (formats/torch_zip_writer.h),
// holding, in this order, <archive>/data.pkl (a protocol-2 pickle of the object),
// <archive>/byteorder ("little"), <archive>/data/<key> (each tensor storage's raw little-endian
// bytes, in the keys' string order: "0", "1", "10", "2", ...) and <archive>/version ("3\n");
// <archive> is the file name without its last extension, as torch.save names it. PyTorch 1.13
// writes no byteorder entry (and ignores one); 2.x writes it where it is here, after data.pkl.
// Storage keys are numbered "0", "1", ... in the order the pickle first reaches each storage, as
// torch's persistent_id numbers them — whatever order tensor() was called in — and a storage that
// `root` does not reach is not written.
//
// The pickle spells each value as torch's pickler does, so that torch.load (and DeepSpeed's
// load_checkpoint, which torch.loads these files) gets the same Python objects:
//   tensor  torch._utils._rebuild_tensor_v2(persistent_id(('storage', torch.<T>Storage, key, 'cpu',
//           numel)), offset, size, stride, False, collections.OrderedDict())
//   object  with constructor args (TorchValue::items non-empty): GLOBAL, args tuple, REDUCE — an
//           enum member such as deepspeed.runtime.zero.config.ZeroStageEnum(2); then BUILD of its
//           state when it has one
//           without args but with a state: GLOBAL, (), NEWOBJ, BUILD(state) — copyreg.__newobj__,
//           as a plain class instance (DynamicLossScaler, fragment_address) pickles
//           without args and without state: the bare GLOBAL — torch.float16 as a value
//   bytes   _codecs.encode(str, 'latin1') (protocol 2's spelling; also for b'', which Python spells
//           __builtin__.bytes() and the reader refuses — torch.load gets b'' from either)
// Nothing is memoised (no BINPUT / BINGET, which torch's pickler adds for every value): each value
// is written where it occurs. Two tensors share a storage when the caller passes the same
// TorchValue from tensor() twice, or a view of it (its shape, stride and storage_offset changed to
// stay inside the storage): the persistent ids name the same key, the bytes are written once, and
// torch.load gives both tensors one storage.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/torch_pickle.h"

namespace dstrain {

class TorchSaveWriter {
 public:
  // A contiguous tensor of `dtype` (safetensors-style: "F32", "F16", "BF16", "F64", "I64", "I32",
  // "I16", "I8", "U8", "BOOL") and `shape`, whose storage is `bytes` (little-endian, numel x element
  // size bytes; Error otherwise). Each call adds one storage; the returned value refers to it by a
  // storage_key of the writer's own, unique in the process (the file's keys are given at save()).
  TorchValue tensor(const std::string& dtype, std::vector<std::int64_t> shape, std::string bytes);
  // The same from fp32 values, rounded to nearest-even for "F16" / "BF16" (as torch's .half() /
  // .bfloat16() round), kept for "F32".
  TorchValue tensor_from_fp32(const std::string& dtype, std::vector<std::int64_t> shape, const std::vector<float>& values);

  // Writes `root` as torch.save(root, path) does — to a temporary beside it (ops/atomic_file.h:
  // "<path>.tmp.<pid>.<n>"), fsynced, then renamed over `path` — so that a crash never leaves a
  // half-written file under the final name. Error naming the path for an I/O failure (disk full:
  // the temporary file is removed) and for a value this writer cannot spell (a tensor from another
  // writer or read from a file, a view outside its storage, a dict key that is not a string,
  // integer, or tuple of them, a string that is not UTF-8, an object name that is not
  // "module.qualname").
  void save(const std::filesystem::path& path, const TorchValue& root) const;

  // Helpers for building trees.
  static TorchValue none();
  static TorchValue boolean(bool b);
  static TorchValue integer(std::int64_t i);
  static TorchValue real(double f);
  static TorchValue string(std::string s);  // UTF-8 text (Python str)
  static TorchValue bytes(std::string b);   // raw bytes (Python bytes)
  static TorchValue list(std::vector<TorchValue> items);
  static TorchValue tuple(std::vector<TorchValue> items);
  static TorchValue dict(std::vector<TorchValuePair> pairs);
  // An object of global `name` ("module.qualname", split at its last dot into GLOBAL's module and
  // name): see the header comment for how args and state are spelled.
  static TorchValue object(std::string name, std::vector<TorchValue> args, std::optional<TorchValue> state);

 private:
  static std::string next_marker();

  std::map<std::string, std::string> storages_;  // key -> bytes
  std::map<std::string, std::string> storage_dtypes_;
  // Stamped into the `file` of every tensor value this writer makes ("<TorchSaveWriter 3>"): how
  // save() tells its own tensors from those read from a file, whose keys could be anything.
  std::string marker_ = next_marker();
};

}  // namespace dstrain
