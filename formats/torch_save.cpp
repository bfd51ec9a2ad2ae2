// TorchSaveWriter (formats/torch_save.h): the protocol-2 pickle torch.save writes, spelled with the
// opcodes the restricted unpickler in torch_state_dict.cpp runs, and the atomic write of the zip.
#include "formats/torch_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "formats/torch_zip_writer.h"
#include "ops/atomic_file.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "ops/utf8_char.h"

namespace dstrain {
namespace {

struct StorageType {
  const char* dtype;
  const char* global;  // the name after "torch\n" in GLOBAL
  std::size_t size;
};
constexpr StorageType kStorageTypes[] = {
    {"F32", "FloatStorage", 4}, {"F16", "HalfStorage", 2}, {"BF16", "BFloat16Storage", 2}, {"F64", "DoubleStorage", 8}, {"I64", "LongStorage", 8},
    {"I32", "IntStorage", 4},   {"I16", "ShortStorage", 2}, {"I8", "CharStorage", 1},        {"U8", "ByteStorage", 1},    {"BOOL", "BoolStorage", 1}};

const StorageType* storage_type(const std::string& dtype) {
  for (const StorageType& t : kStorageTypes)
    if (dtype == t.dtype) return &t;
  return nullptr;
}

// torch's PyTorchStreamWriter names the archive after the file: the last path component without
// its last extension ("mp_rank_00_model_states.pt" -> "mp_rank_00_model_states").
std::string archive_name(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  const std::size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// The pickle of one save(): the opcodes Python's pickle.Pickler (protocol 2) chooses for each
// value, without its memo. `where` is the value's path in the tree, for errors.
class Pickler {
 public:
  Pickler(const std::string& marker, const std::map<std::string, std::string>& storages, const std::map<std::string, std::string>& dtypes,
          const std::string& file)
      : marker_(marker), storages_(storages), dtypes_(dtypes), file_(file) {}

  std::string run(const TorchValue& root) {
    out_ = "\x80\x02";  // PROTO 2
    value(root, "", 0);
    out_ += '.';  // STOP
    return std::move(out_);
  }

  // Writer key -> key in the file, in the order the pickle first reached each storage.
  const std::map<std::string, std::string>& keys() const { return keys_; }

 private:
  // Far deeper than any checkpoint (the reader stops at 32 levels): a bound on this recursion only.
  static constexpr int kMaxDepth = 1000;

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("torch.save file '{}': {} {}", file_, where.empty() ? std::string("the saved object") : "'" + where + "'", what);
  }
  static std::string child(const std::string& where, const std::string& k) { return where.empty() ? k : where + "." + k; }

  void le(std::uint64_t v, int n) {
    for (int k = 0; k < n; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xFFu);
  }
  void global(const std::string& module, const std::string& name) { out_ += 'c' + module + '\n' + name + '\n'; }
  void unicode(const std::string& s, const std::string& where) {
    for (std::size_t k = 0; k < s.size();) {
      const std::size_t n = utf8_char_length(s, k);
      if (n == 0) bad(where, fmt::format("is a string that is not UTF-8 (byte {}); Python's strings are text: save bytes as bytes", k));
      k += n;
    }
    if (s.size() > 0xFFFFFFFFu) bad(where, "is a string of 4 GiB or more; protocol 2 cannot hold it");
    out_ += 'X';  // BINUNICODE
    le(s.size(), 4);
    out_ += s;
  }
  // Python's save_long: BININT1 / BININT2 for small non-negative values, BININT for 32-bit ones,
  // else LONG1 with the fewest two's-complement bytes.
  void integer(std::int64_t i) {
    if (i >= 0 && i <= 0xFF) {
      out_ += 'K';
      le(static_cast<std::uint64_t>(i), 1);
    } else if (i >= 0 && i <= 0xFFFF) {
      out_ += 'M';
      le(static_cast<std::uint64_t>(i), 2);
    } else if (i >= INT32_MIN && i <= INT32_MAX) {
      out_ += 'J';
      le(static_cast<std::uint32_t>(static_cast<std::int32_t>(i)), 4);
    } else {
      int n = 1;
      while (n < 8 && !(i >= -(std::int64_t{1} << (8 * n - 1)) && i < (std::int64_t{1} << (8 * n - 1)))) ++n;
      out_ += '\x8a';  // LONG1
      out_ += static_cast<char>(n);
      le(static_cast<std::uint64_t>(i), n);
    }
  }
  void real(double f) {
    std::uint64_t u;
    std::memcpy(&u, &f, 8);
    out_ += 'G';  // BINFLOAT, big-endian
    for (int k = 7; k >= 0; --k) out_ += static_cast<char>((u >> (8 * k)) & 0xFFu);
  }
  // A tuple as save_tuple spells it under protocol 2: (), TUPLE1..3, or MARK ... TUPLE.
  template <typename Each>
  void tuple(std::size_t n, Each each) {
    if (n == 0) {
      out_ += ')';
      return;
    }
    if (n > 3) out_ += '(';
    for (std::size_t k = 0; k < n; ++k) each(k);
    out_ += n == 1 ? '\x85' : n == 2 ? '\x86' : n == 3 ? '\x87' : 't';
  }
  // Python's _batch_appends / _batch_setitems: batches of 1000, MARK ... APPENDS (SETITEMS) for
  // more than one element, a lone APPEND (SETITEM) for one.
  template <typename Each>
  void batches(std::size_t n, char one, char many, Each each) {
    for (std::size_t from = 0; from < n; from += 1000) {
      const std::size_t to = std::min(n, from + 1000);
      if (to - from > 1) out_ += '(';
      for (std::size_t k = from; k < to; ++k) each(k);
      out_ += to - from > 1 ? many : one;
    }
  }
  // What Python can hash and torch's checkpoints use: strings, integers, tuples of them.
  static bool valid_key(const TorchValue& k) {
    if (k.kind == TorchValue::Kind::string || k.kind == TorchValue::Kind::integer) return true;
    if (k.kind != TorchValue::Kind::tuple) return false;
    for (const TorchValue& x : k.items)
      if (!valid_key(x)) return false;
    return true;
  }
  void key(const TorchValue& k, const std::string& where, int depth) {
    if (!valid_key(k)) bad(where, fmt::format("has a key that is {}; keys are strings, integers or tuples of them", k.kind_name()));
    value(k, child(where, "<key>"), depth + 1);
  }
  static std::string key_text(const TorchValue& k) {
    if (k.kind == TorchValue::Kind::string) return k.s;
    if (k.kind == TorchValue::Kind::integer) return std::to_string(k.i);
    return "<tuple>";
  }

  void tensor(const TorchValue& v, const std::string& where) {
    const TorchTensorInfo& t = v.tensor;
    const auto st = storages_.find(t.storage_key);
    if (v.file != marker_ || st == storages_.end()) {
      bad(where, "is a tensor this TorchSaveWriter did not make (another writer's, or one read from a file): make it with this writer's tensor()");
    }
    if (dtypes_.at(t.storage_key) != t.dtype) bad(where, fmt::format("is a {} tensor of a {} storage", t.dtype, dtypes_.at(t.storage_key)));
    if (t.shape.size() != t.stride.size()) bad(where, "is a tensor whose shape and stride differ in length");
    // Its view must stay inside the storage, computed without wrapping (as the reader checks).
    const StorageType& type = *storage_type(t.dtype);
    const auto elems = static_cast<std::int64_t>(st->second.size() / type.size);
    std::int64_t last = t.storage_offset, reach = 0;
    bool empty = false, overflow = t.storage_offset < 0;
    for (std::size_t k = 0; k < t.shape.size(); ++k) {
      if (t.shape[k] < 0 || t.stride[k] < 0) bad(where, "is a tensor with a negative size or stride");
      empty = empty || t.shape[k] == 0;
      overflow = overflow || __builtin_mul_overflow(t.shape[k] == 0 ? 0 : t.shape[k] - 1, t.stride[k], &reach) ||
                 __builtin_add_overflow(last, reach, &last);
    }
    if (overflow || (!empty && last >= elems)) {
      bad(where, fmt::format("is a tensor view that reaches past its storage of {} elements (offset {}, shape and stride of {} dimensions)", elems,
                             t.storage_offset, t.shape.size()));
    }
    const auto [it, added] = keys_.emplace(t.storage_key, std::to_string(keys_.size()));
    // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks)
    global("torch._utils", "_rebuild_tensor_v2");
    out_ += '(';
    out_ += '(';  // the persistent id ('storage', torch.<T>Storage, key, 'cpu', numel), then BINPERSID
    unicode("storage", where);
    global("torch", type.global);
    unicode(it->second, where);
    unicode("cpu", where);
    integer(elems);
    out_ += "tQ";
    integer(t.storage_offset);
    tuple(t.shape.size(), [&](std::size_t k) { integer(t.shape[k]); });
    tuple(t.stride.size(), [&](std::size_t k) { integer(t.stride[k]); });
    out_ += '\x89';  // requires_grad False
    global("collections", "OrderedDict");
    out_ += ")R";  // OrderedDict(): no backward hooks
    out_ += "tR";
  }

  void object(const TorchValue& v, const std::string& where, int depth) {
    const std::size_t dot = v.s.rfind('.');
    const auto word = [](const std::string& s, bool dots) {
      if (s.empty()) return false;
      for (const char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (dots && c == '.'))) return false;
      return true;
    };
    if (dot == std::string::npos || !word(v.s.substr(0, dot), true) || !word(v.s.substr(dot + 1), false)) {
      bad(where, fmt::format("is an object of '{}', which is not a global's \"module.qualname\"", v.s));
    }
    global(v.s.substr(0, dot), v.s.substr(dot + 1));
    if (!v.items.empty()) {  // cls(*args): an enum member
      tuple(v.items.size(), [&](std::size_t k) { value(v.items[k], child(where, "<arg" + std::to_string(k) + ">"), depth + 1); });
      out_ += 'R';
    } else if (v.state) {  // copyreg.__newobj__: cls.__new__(cls), then its __dict__
      out_ += ")\x81";
    } else {
      return;  // the bare global: torch.float16
    }
    if (v.state) {
      value(*v.state, child(where, "<state>"), depth + 1);
      out_ += 'b';  // BUILD
    }
  }

  void value(const TorchValue& v, const std::string& where, int depth) {
    if (depth > kMaxDepth) bad(where, fmt::format("nests deeper than {} levels", kMaxDepth));
    switch (v.kind) {
      case TorchValue::Kind::none: out_ += 'N'; break;
      case TorchValue::Kind::boolean: out_ += v.b ? '\x88' : '\x89'; break;
      case TorchValue::Kind::integer: integer(v.i); break;
      case TorchValue::Kind::real: real(v.f); break;
      case TorchValue::Kind::string: unicode(v.s, where); break;
      case TorchValue::Kind::bytes: {  // _codecs.encode(<the bytes as latin-1 text>, 'latin1')
        std::string text;
        for (const char c : v.s) {
          const auto u = static_cast<unsigned char>(c);
          if (u < 0x80) {
            text += c;
          } else {
            text += static_cast<char>(0xC0 | (u >> 6));
            text += static_cast<char>(0x80 | (u & 0x3F));
          }
        }
        global("_codecs", "encode");
        unicode(text, where);
        unicode("latin1", where);
        out_ += "\x86R";
        break;
      }
      case TorchValue::Kind::list:
        out_ += ']';
        batches(v.items.size(), 'a', 'e', [&](std::size_t k) { value(v.items[k], child(where, std::to_string(k)), depth + 1); });
        break;
      case TorchValue::Kind::tuple:
        tuple(v.items.size(), [&](std::size_t k) { value(v.items[k], child(where, std::to_string(k)), depth + 1); });
        break;
      case TorchValue::Kind::dict:
        out_ += '}';
        batches(v.pairs.size(), 's', 'u', [&](std::size_t k) {
          key(v.pairs[k].first, where, depth);
          value(v.pairs[k].second, child(where, key_text(v.pairs[k].first)), depth + 1);
        });
        break;
      case TorchValue::Kind::tensor: tensor(v, where); break;
      case TorchValue::Kind::object: object(v, where, depth); break;
    }
  }

  const std::string& marker_;
  const std::map<std::string, std::string>& storages_;
  const std::map<std::string, std::string>& dtypes_;
  const std::string& file_;
  std::string out_;
  std::map<std::string, std::string> keys_;
};

}  // namespace

std::string TorchSaveWriter::next_marker() {
  static std::atomic<std::uint64_t> count{0};
  return fmt::format("<TorchSaveWriter {}>", count.fetch_add(1) + 1);
}

TorchValue TorchSaveWriter::tensor(const std::string& dtype, std::vector<std::int64_t> shape, std::string bytes) {
  const StorageType* type = storage_type(dtype);
  if (type == nullptr) fail("TorchSaveWriter: tensor dtype '{}' is not one of F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL", dtype);
  std::int64_t numel = 1;
  for (const std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) fail("TorchSaveWriter: tensor shape [{}] has a negative or too large size", fmt::join(shape, ", "));
  }
  if (static_cast<std::uint64_t>(numel) > bytes.size() / type->size || bytes.size() != static_cast<std::size_t>(numel) * type->size) {
    fail("TorchSaveWriter: a {} tensor of shape [{}] needs {} x {} bytes; {} bytes were given", dtype, fmt::join(shape, ", "), numel, type->size,
         bytes.size());
  }
  // A name no other writer's storage has (copies of a writer share the storages made before the copy,
  // not those made after); the file's keys "0", "1", ... are given at save().
  static std::atomic<std::uint64_t> made{0};
  const std::string key = fmt::format("w{}", made.fetch_add(1));
  storages_[key] = std::move(bytes);
  storage_dtypes_[key] = dtype;
  TorchValue v;
  v.kind = TorchValue::Kind::tensor;
  v.file = marker_;
  v.tensor.dtype = dtype;
  v.tensor.stride.assign(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 1;) v.tensor.stride[k - 1] = v.tensor.stride[k] * shape[k];
  v.tensor.shape = std::move(shape);
  v.tensor.storage_key = key;
  return v;
}

TorchValue TorchSaveWriter::tensor_from_fp32(const std::string& dtype, std::vector<std::int64_t> shape, const std::vector<float>& values) {
  std::string bytes;
  if (dtype == "F32") {
    bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  } else if (dtype == "F16" || dtype == "BF16") {
    // ops' block conversion: round to nearest even, as torch's .half() / .bfloat16() round.
    bytes.resize(values.size() * 2);
    convert(values.data(), DType::fp32, bytes.data(), dtype == "F16" ? DType::fp16 : DType::bf16, values.size());
  } else {
    fail("TorchSaveWriter: tensor_from_fp32 makes F32, F16 or BF16 tensors, not '{}'", dtype);
  }
  return tensor(dtype, std::move(shape), std::move(bytes));  // checks the count against the shape
}

void TorchSaveWriter::save(const std::filesystem::path& path, const TorchValue& root) const {
  const std::string file = path.string();
  // The whole pickle first: a value that cannot be spelled fails before any file exists.
  Pickler pickler(marker_, storages_, storage_dtypes_, file);
  const std::string pkl = pickler.run(root);
  std::map<std::string, const std::string*> data;  // file key -> bytes, in the keys' string order as torch writes them
  for (const auto& [key, as] : pickler.keys()) data[as] = &storages_.at(key);

  check_replaceable(path, "the torch.save file");
  remove_stale_temp_files(path);
  const std::filesystem::path tmp = temp_path_for(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create '{}' (to write torch.save file '{}'): {}", tmp.string(), file, write_errno_text(errno));
  const auto give_up = [&](const std::string& what, int error) {
    if (fd >= 0) ::close(fd);
    fd = -1;
    ::unlink(tmp.c_str());
    fail("{} torch.save file '{}' failed: {} (an existing file there is untouched)", what, file, write_errno_text(error));
  };
  try {
    TorchZipWriter zip([&](const char* p, std::size_t n) {
      while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) give_up("writing", w < 0 ? errno : EIO);
        p += w;
        n -= static_cast<std::size_t>(w);
      }
    });
    const std::string prefix = archive_name(path) + "/";
    zip.add(prefix + "data.pkl", pkl);
    zip.add(prefix + "byteorder", "little");
    for (const auto& [key, bytes] : data) zip.add(prefix + "data/" + key, *bytes);
    zip.add(prefix + "version", "3\n");
    zip.finish();
  } catch (const std::exception& e) {  // an Error, or bad_alloc while building a header
    if (fd < 0) throw;  // give_up's own Error: the temporary is gone
    ::close(fd);
    ::unlink(tmp.c_str());
    fail("writing torch.save file '{}' failed: {}", file, e.what());
  }
  if (::fsync(fd) != 0) give_up("flushing", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) give_up("closing", errno);
  commit_temp_file(tmp, path, "the torch.save file");
}

TorchValue TorchSaveWriter::none() { return TorchValue{}; }
TorchValue TorchSaveWriter::boolean(bool b) {
  TorchValue v;
  v.kind = TorchValue::Kind::boolean;
  v.b = b;
  return v;
}
TorchValue TorchSaveWriter::integer(std::int64_t i) {
  TorchValue v;
  v.kind = TorchValue::Kind::integer;
  v.i = i;
  return v;
}
TorchValue TorchSaveWriter::real(double f) {
  TorchValue v;
  v.kind = TorchValue::Kind::real;
  v.f = f;
  return v;
}
TorchValue TorchSaveWriter::string(std::string s) {
  TorchValue v;
  v.kind = TorchValue::Kind::string;
  v.s = std::move(s);
  return v;
}
TorchValue TorchSaveWriter::bytes(std::string b) {
  TorchValue v;
  v.kind = TorchValue::Kind::bytes;
  v.s = std::move(b);
  return v;
}
TorchValue TorchSaveWriter::list(std::vector<TorchValue> items) {
  TorchValue v;
  v.kind = TorchValue::Kind::list;
  v.items = std::move(items);
  return v;
}
TorchValue TorchSaveWriter::tuple(std::vector<TorchValue> items) {
  TorchValue v;
  v.kind = TorchValue::Kind::tuple;
  v.items = std::move(items);
  return v;
}
TorchValue TorchSaveWriter::dict(std::vector<TorchValuePair> pairs) {
  TorchValue v;
  v.kind = TorchValue::Kind::dict;
  v.pairs = std::move(pairs);
  return v;
}
TorchValue TorchSaveWriter::object(std::string name, std::vector<TorchValue> args, std::optional<TorchValue> state) {
  TorchValue v;
  v.kind = TorchValue::Kind::object;
  v.s = std::move(name);
  v.items = std::move(args);
  if (state) v.state = std::make_shared<TorchValue>(std::move(*state));
  return v;
}

}  // namespace dstrain
