// The whole object a torch.save file holds, as an inert value tree — for files that are more than a
// state dict: DeepSpeed's *_optim_states.pt (optimizer_state_dict with its loss scaler object, the
// flat fp32 partitions, group paddings) and *_model_states.pt (param_shapes, lr_scheduler, counters).
//
// The same restricted unpickler as TorchStateDict (formats/torch_state_dict.h): nothing is imported,
// called or executed. Besides the plain containers and tensors, a closed list of classes that
// DeepSpeed's and torch's saving code put into these files is read as an *object* — the global's
// "module.qualname", the arguments it was built with and the state BUILD gave it — never created:
//   deepspeed.runtime.fp16.loss_scaler.LossScaler / DynamicLossScaler   (optimizer_state_dict.loss_scaler)
//   deepspeed.runtime.zero.config.ZeroStageEnum                         (optimizer_state_dict.zero_stage)
//   deepspeed.utils.tensor_fragment.fragment_address                    (param_slice_mappings values)
//   deepspeed.checkpoint.universal_checkpoint.SubparamShape             (a universal checkpoint's sub_param_shape)
//   torch.float16 / torch.bfloat16 / torch.float32                      (DynamicLossScaler.dtype)
// and _codecs.encode(str, 'latin1'), protocol 2's spelling of a bytes value, is read as the bytes.
// Any other global is refused with an Error naming it and the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/torch_state_dict.h"

namespace dstrain {

struct TorchValuePair;

class TorchValue {
 public:
  enum class Kind { none, boolean, integer, real, string, bytes, list, tuple, dict, tensor, object };

  Kind kind = Kind::none;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;                                          // string, bytes; object: "module.qualname"
  std::vector<TorchValue> items;                          // list, tuple; object: constructor args
  std::vector<TorchValuePair> pairs;                      // dict, in the saved order
  TorchTensorInfo tensor;                                 // tensor
  std::shared_ptr<TorchValue> state;                      // object: the state BUILD gave it (null if none)
  std::string file;                                       // the file it was read from (for errors)
  std::string where;                                      // its path in the file: "optimizer_state_dict.base_optimizer_state"

  const char* kind_name() const;
  bool is_none() const { return kind == Kind::none; }
  bool is_dict() const { return kind == Kind::dict; }
  bool is_sequence() const { return kind == Kind::list || kind == Kind::tuple; }
  bool is_tensor() const { return kind == Kind::tensor; }
  bool is_object() const { return kind == Kind::object; }

  // Typed reads; Error naming the file, the path and what was found on a wrong kind.
  bool as_bool() const;
  std::int64_t as_int() const;  // integer or boolean
  double as_double() const;     // real, integer or boolean
  const std::string& as_string() const;
  const TorchTensorInfo& as_tensor() const;
  // An object's global ("deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"); Error if not an object.
  const std::string& object_name() const;

  // Dict entry by string (or integer) key; Error naming the file and path when missing or not a dict.
  const TorchValue& at(const std::string& key) const;
  const TorchValue& at(std::int64_t key) const;
  // List / tuple element; Error when out of range or not a sequence.
  const TorchValue& operator[](std::size_t k) const;
  // The entry, or null when missing (Error when this is not a dict).
  const TorchValue* find(const std::string& key) const;
  const TorchValue* find(std::int64_t key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  // Number of elements of a list / tuple / dict.
  std::size_t size() const;

  [[noreturn]] void fail_here(const std::string& what) const;
};

// One key and value of a dict (std::pair would need TorchValue complete inside its own definition).
struct TorchValuePair {
  TorchValue first;
  TorchValue second;
  TorchValuePair(TorchValue key, TorchValue value) : first(std::move(key)), second(std::move(value)) {}
};

class TorchPickle {
 public:
  // Reads the archive and the whole pickle into a value tree; every tensor is checked to lie inside
  // its storage. Error naming the file and the cause (truncated, not torch.save, refused global).
  explicit TorchPickle(const std::filesystem::path& path);
  // The storages are views into the file's bytes, which a move keeps in place and a copy would not.
  TorchPickle(TorchPickle&&) = default;
  TorchPickle& operator=(TorchPickle&&) = default;
  TorchPickle(const TorchPickle&) = delete;
  TorchPickle& operator=(const TorchPickle&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const TorchValue& root() const { return root_; }

  // A tensor's elements in row-major order, widened: floats (F32 / F16 / BF16 / F64) to fp32;
  // read_f64 takes any dtype (integers and bool too). Error naming the file otherwise.
  std::vector<float> read_fp32(const TorchValue& tensor) const;
  std::vector<double> read_f64(const TorchValue& tensor) const;

 private:
  std::filesystem::path path_;
  TorchValue root_;
  std::string bytes_;                                 // the whole file, read once
  std::map<std::string, std::string_view> storages_;  // key -> its bytes inside bytes_
};

}  // namespace dstrain
