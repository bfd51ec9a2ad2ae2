#include "formats/torch_state_dict.h"

#include "formats/torch_pickle.h"
#include "formats/torch_zip_reader.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string_view>
#include <utility>

#include "ops/dtype.h"
#include "ops/error.h"

namespace dstrain {
namespace {

// ---- the restricted unpickler ----

struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Value {
  Value() = default;
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  // Frees nested containers with a worklist instead of recursion: a crafted pickle nesting 200,000
  // lists would otherwise overflow the stack in the chain of destructors.
  ~Value();

  enum Kind { none, boolean, integer, real, str, bytes, tuple, list, dict, global, tensor, storage, mark, object } kind = none;
  std::int64_t i = 0;
  double f = 0;
  std::string s;                                     // str, bytes, global "module.name", storage key
  std::string s2;                                    // storage dtype
  std::vector<ValuePtr> items;                       // tuple, list; object: its constructor args
  ValuePtr state;                                    // object: what BUILD gave it
  std::vector<std::pair<ValuePtr, ValuePtr>> pairs;  // dict
  TorchTensorInfo t;
};

Value::~Value() {
  std::vector<ValuePtr> pending;
  const auto take = [&pending](Value& v) {
    for (ValuePtr& c : v.items)
      if (c && c.use_count() == 1) pending.push_back(std::move(c));
    for (auto& [k, x] : v.pairs) {
      if (k && k.use_count() == 1) pending.push_back(std::move(k));
      if (x && x.use_count() == 1) pending.push_back(std::move(x));
    }
    if (v.state && v.state.use_count() == 1) pending.push_back(std::move(v.state));
    v.items.clear();
    v.pairs.clear();
    v.state.reset();
  };
  take(*this);
  while (!pending.empty()) {
    ValuePtr last = std::move(pending.back());
    pending.pop_back();
    take(*last);  // its children join the list; `last` then goes with no children of its own
  }
}

// Every Value the unpickler of this thread made, while a CycleBreaker is alive: a pickle can make a
// container hold itself (its memo, then APPEND / SETITEM), a cycle of shared_ptrs that would never
// be freed; the breaker empties every container once the tensors have been read out.
thread_local std::vector<std::weak_ptr<Value>>* g_made = nullptr;

struct CycleBreaker {
  std::vector<std::weak_ptr<Value>> made;
  CycleBreaker() { g_made = &made; }
  ~CycleBreaker() {
    g_made = nullptr;
    std::vector<ValuePtr> alive;  // held while emptied, then freed (the worklist destructor)
    for (const std::weak_ptr<Value>& w : made)
      if (ValuePtr v = w.lock()) alive.push_back(std::move(v));
    std::vector<ValuePtr> children;
    for (const ValuePtr& v : alive) {
      for (ValuePtr& c : v->items) children.push_back(std::move(c));
      for (auto& [k, x] : v->pairs) {
        children.push_back(std::move(k));
        children.push_back(std::move(x));
      }
      children.push_back(std::move(v->state));
      v->items.clear();
      v->pairs.clear();
      v->state.reset();
    }
  }
  CycleBreaker(const CycleBreaker&) = delete;
  CycleBreaker& operator=(const CycleBreaker&) = delete;
};

ValuePtr make(Value::Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  if (g_made != nullptr) g_made->push_back(v);
  return v;
}

// The storage type's element dtype, or "" for a global that is not a storage type.
std::string storage_dtype(const std::string& g) {
  static const std::map<std::string, std::string> m = {{"torch.FloatStorage", "F32"},     {"torch.HalfStorage", "F16"},
                                                       {"torch.BFloat16Storage", "BF16"}, {"torch.DoubleStorage", "F64"},
                                                       {"torch.LongStorage", "I64"},      {"torch.IntStorage", "I32"},
                                                       {"torch.ShortStorage", "I16"},     {"torch.CharStorage", "I8"},
                                                       {"torch.ByteStorage", "U8"},       {"torch.BoolStorage", "BOOL"}};
  const auto it = m.find(g);
  return it == m.end() ? std::string() : it->second;
}

bool allowed_global(const std::string& g) {
  return g == "collections.OrderedDict" || g == "torch._utils._rebuild_tensor_v2" || g == "torch._utils._rebuild_parameter" || g == "torch.Size" ||
         g == "builtins.set" || g == "__builtin__.set" || g == "builtins.frozenset" || !storage_dtype(g).empty();
}

// The classes read as inert objects when a TorchPickle reads the file (formats/torch_pickle.h): what
// DeepSpeed's checkpoint code pickles besides plain data. Never imported, created or called.
bool inert_object_global(const std::string& g) {
  return g == "deepspeed.runtime.fp16.loss_scaler.LossScaler" || g == "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler" ||
         g == "deepspeed.runtime.zero.config.ZeroStageEnum" || g == "deepspeed.utils.tensor_fragment.fragment_address" ||
         g == "deepspeed.checkpoint.universal_checkpoint.SubparamShape" || g == "torch.float16" || g == "torch.bfloat16" || g == "torch.float32";
}

std::size_t elem_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64") return 8;
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16") return 2;
  return 1;
}

class Unpickler {
 public:
  // `objects`: also read the inert_object_global classes and _codecs.encode (TorchPickle).
  Unpickler(const std::string& data, const std::string& file, bool objects = false) : d_(data), file_(file), objects_(objects) {}

  ValuePtr run() {
    for (;;) {
      const unsigned char op = byte();
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          take(8);
          break;  // FRAME
        case '.':
          return pop();  // STOP
        case '(':
          push(make(Value::mark));
          break;
        case 'N':
          push(make(Value::none));
          break;
        case 0x88:
        case 0x89: {  // NEWTRUE / NEWFALSE
          auto v = make(Value::boolean);
          v->i = op == 0x88;
          push(v);
          break;
        }
        case 'J':
          push_int(static_cast<std::int32_t>(uint(4)));
          break;
        case 'K':
          push_int(static_cast<std::int64_t>(uint(1)));
          break;
        case 'M':
          push_int(static_cast<std::int64_t>(uint(2)));
          break;
        case 0x8a: {  // LONG1: little-endian two's complement
          const std::size_t n = byte();
          if (n > 8) fail("torch file '{}': integer of {} bytes in the pickle; dstrain reads at most 64-bit integers", file_, n);
          std::uint64_t u = n > 0 ? uint(static_cast<int>(n)) : 0;
          if (n > 0 && n < 8 && (u >> (8 * n - 1)) != 0) u |= ~std::uint64_t{0} << (8 * n);
          push_int(static_cast<std::int64_t>(u));
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          std::uint64_t u = 0;
          for (int k = 0; k < 8; ++k) u = (u << 8) | byte();
          auto v = make(Value::real);
          std::memcpy(&v->f, &u, 8);
          push(v);
          break;
        }
        case 'X':
          push_str(Value::str, uint(4));
          break;  // BINUNICODE
        case 0x8c:
          push_str(Value::str, byte());
          break;  // SHORT_BINUNICODE
        case 0x8d:
          push_str(Value::str, uint(8));
          break;  // BINUNICODE8
        case 'T':
          push_str(Value::str, uint(4));
          break;  // BINSTRING (Python 2)
        case 'U':
          push_str(Value::str, byte());
          break;  // SHORT_BINSTRING
        case 'B':
          push_str(Value::bytes, uint(4));
          break;  // BINBYTES
        case 'C':
          push_str(Value::bytes, byte());
          break;  // SHORT_BINBYTES
        case 0x8e:
          push_str(Value::bytes, uint(8));
          break;  // BINBYTES8
        case '}':
          push(make(Value::dict));
          break;
        case ']':
          push(make(Value::list));
          break;
        case ')':
          push(make(Value::tuple));
          break;
        case 't': {
          auto v = make(Value::tuple);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          const int n = op - 0x84;
          auto v = make(Value::tuple);
          v->items.resize(static_cast<std::size_t>(n));
          for (int k = n - 1; k >= 0; --k) v->items[static_cast<std::size_t>(k)] = pop();
          push(v);
          break;
        }
        case 'l': {  // LIST
          auto v = make(Value::list);
          v->items = pop_mark();
          push(v);
          break;
        }
        case 'd': {  // DICT
          auto v = make(Value::dict);
          const auto items = pop_mark();
          for (std::size_t k = 0; k + 1 < items.size(); k += 2) v->pairs.emplace_back(items[k], items[k + 1]);
          push(v);
          break;
        }
        case 'a': {  // APPEND
          ValuePtr x = pop();
          container(top(), Value::list)->items.push_back(x);
          break;
        }
        case 'e': {  // APPENDS
          auto items = pop_mark();
          auto& l = container(top(), Value::list)->items;
          l.insert(l.end(), items.begin(), items.end());
          break;
        }
        case 's': {  // SETITEM
          ValuePtr v = pop(), k = pop();
          container(top(), Value::dict)->pairs.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          const auto items = pop_mark();
          auto& p = container(top(), Value::dict)->pairs;
          for (std::size_t k = 0; k + 1 < items.size(); k += 2) p.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'q':
          memo_[uint(1)] = top();
          break;  // BINPUT
        case 'r':
          memo_[uint(4)] = top();
          break;  // LONG_BINPUT
        case 0x94:
          memo_[memo_.size()] = top();
          break;  // MEMOIZE
        case 'h':
          push(memo(uint(1)));
          break;  // BINGET
        case 'j':
          push(memo(uint(4)));
          break;     // LONG_BINGET
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          push(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          ValuePtr name = pop(), module = pop();
          if (name->kind != Value::str || module->kind != Value::str) bad("STACK_GLOBAL without strings");
          push(global(module->s, name->s));
          break;
        }
        case 'Q': {  // BINPERSID: ('storage', type, key, location, numel)
          ValuePtr pid = pop();
          if (pid->kind != Value::tuple || pid->items.size() < 5 || pid->items[0]->s != "storage" || pid->items[1]->kind != Value::global) {
            bad("a persistent id that is not a torch storage");
          }
          auto v = make(Value::storage);
          v->s = pid->items[2]->s;
          v->s2 = storage_dtype(pid->items[1]->s);
          push(v);
          break;
        }
        case 'R': {  // REDUCE
          ValuePtr args = pop(), fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 'b': {  // BUILD: an OrderedDict's attributes (_metadata), dropped; an inert object's state, kept
          ValuePtr st = pop();
          if (top()->kind == Value::object) {
            top()->state = st;
            break;
          }
          if (top()->kind != Value::dict && top()->kind != Value::tensor) bad("BUILD on something other than a dict or a tensor");
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args) — only an inert object of an allowed class
          ValuePtr args = pop(), cls = pop();
          if (!objects_ || cls->kind != Value::global || !inert_object_global(cls->s) || args->kind != Value::tuple) {
            bad("an object creation (NEWOBJ) of something other than an allowed class");
          }
          auto v = make(Value::object);
          v->s = cls->s;
          v->items = args->items;
          push(v);
          break;
        }
        case '0':
          pop();
          break;  // POP
        case '2':
          push(top());
          break;  // DUP
        case '1':
          pop_mark();
          break;  // POP_MARK
        default:
          fail(
              "torch file '{}': the pickle uses opcode 0x{:02x} at byte {}, which dstrain does not run (it reads only tensors and plain "
              "containers: no objects, no code)",
              file_, op, at_ - 1);
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("torch file '{}': the pickle has {} at byte {}; it is not a plain state dict", file_, what, at_);
  }
  unsigned char byte() {
    if (at_ >= d_.size()) fail("torch file '{}': the pickle ends without STOP (truncated)", file_);
    return static_cast<unsigned char>(d_[at_++]);
  }
  std::uint64_t uint(int n) {
    std::uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<std::uint64_t>(byte()) << (8 * k);
    return v;
  }
  void take(std::uint64_t n) {
    if (n > d_.size() - at_) fail("torch file '{}': the pickle is truncated", file_);
    at_ += n;
  }
  std::string line() {
    const std::size_t e = d_.find('\n', at_);
    if (e == std::string::npos) bad("an unterminated GLOBAL");
    std::string s = d_.substr(at_, e - at_);
    at_ = e + 1;
    return s;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  void push_int(std::int64_t x) {
    auto v = make(Value::integer);
    v->i = x;
    push(v);
  }
  void push_str(Value::Kind k, std::uint64_t n) {
    const std::size_t from = at_;
    take(n);
    auto v = make(k);
    v->s = d_.substr(from, n);
    push(v);
  }
  ValuePtr pop() {
    if (stack_.empty() || stack_.back()->kind == Value::mark) bad("a pop from an empty stack");
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack_.empty()) bad("an empty stack");
    return stack_.back();
  }
  std::vector<ValuePtr> pop_mark() {
    std::size_t k = stack_.size();
    while (k > 0 && stack_[k - 1]->kind != Value::mark) --k;
    if (k == 0) bad("a missing MARK");
    std::vector<ValuePtr> items(stack_.begin() + static_cast<std::ptrdiff_t>(k), stack_.end());
    stack_.resize(k - 1);
    return items;
  }
  ValuePtr container(const ValuePtr& v, Value::Kind k) {
    if (v->kind != k) bad(k == Value::list ? "APPEND to something other than a list" : "SETITEM on something other than a dict");
    return v;
  }
  ValuePtr memo(std::uint64_t k) {
    const auto it = memo_.find(k);
    if (it == memo_.end()) bad("a reference to an unknown memo entry");
    return it->second;
  }
  ValuePtr global(const std::string& module, const std::string& name) {
    const std::string g = module + "." + name;
    if (!allowed_global(g) && !(objects_ && (inert_object_global(g) || g == "_codecs.encode" || g == "builtins.getattr" || g == "__builtin__.getattr"))) {
      fail(
          "torch file '{}': the pickle asks for '{}', which dstrain refuses: it would run code (torch.load would import and call it); "
          "dstrain reads only tensors and plain containers — save the model's state_dict() instead",
          file_, g);
    }
    auto v = make(Value::global);
    v->s = g;
    return v;
  }
  static std::vector<std::int64_t> ints(const ValuePtr& v) {
    std::vector<std::int64_t> out;
    for (const ValuePtr& x : v->items) out.push_back(x->i);
    return out;
  }
  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args) {
    if (fn->kind != Value::global || args->kind != Value::tuple) bad("a call of something that is not an allowed function");
    const std::string& g = fn->s;
    if (g == "collections.OrderedDict") {
      // Python's pickler: OrderedDict() and its items by SETITEMS; a writer may also pass the
      // items as the argument, OrderedDict([(key, value), ...]) (formats/deepspeed_save_parts.h).
      auto v = make(Value::dict);
      if (!args->items.empty()) {
        const ValuePtr& arg = args->items[0];
        if (args->items.size() != 1 || (arg->kind != Value::list && arg->kind != Value::tuple)) bad("an OrderedDict built from something other than a list of pairs");
        for (const ValuePtr& kv : arg->items) {
          if (kv->kind != Value::tuple || kv->items.size() != 2) bad("an OrderedDict built from something other than (key, value) pairs");
          v->pairs.emplace_back(kv->items[0], kv->items[1]);
        }
      }
      return v;
    }
    if (g == "torch.Size") {
      auto v = make(Value::tuple);
      if (!args->items.empty()) v->items = args->items[0]->items;
      return v;
    }
    if (g == "builtins.set" || g == "__builtin__.set" || g == "builtins.frozenset") {
      auto v = make(Value::list);
      if (!args->items.empty()) v->items = args->items[0]->items;
      return v;
    }
    if (g == "torch._utils._rebuild_parameter") {
      if (args->items.empty() || args->items[0]->kind != Value::tensor) bad("_rebuild_parameter without a tensor");
      return args->items[0];
    }
    if (g == "torch._utils._rebuild_tensor_v2") {
      if (args->items.size() < 4 || args->items[0]->kind != Value::storage) bad("_rebuild_tensor_v2 without a storage");
      auto v = make(Value::tensor);
      v->t.storage_key = args->items[0]->s;
      v->t.dtype = args->items[0]->s2;
      v->t.storage_offset = args->items[1]->i;
      v->t.shape = ints(args->items[2]);
      v->t.stride = ints(args->items[3]);
      if (v->t.shape.size() != v->t.stride.size()) bad("a tensor whose shape and stride differ in length");
      return v;
    }
    if (objects_ && inert_object_global(g)) {  // an enum member: ZeroStageEnum(2); recorded, not called
      auto v = make(Value::object);
      v->s = g;
      v->items = args->items;
      return v;
    }
    if (objects_ && (g == "builtins.getattr" || g == "__builtin__.getattr")) {
      // An enum member as Python >= 3.12 pickles it: getattr(ZeroStageEnum, 'gradients') — an
      // attribute of an allowed class, recorded as that class's object with the member's name.
      if (args->items.size() != 2 || args->items[0]->kind != Value::global || !inert_object_global(args->items[0]->s) ||
          args->items[1]->kind != Value::str) {
        bad("a getattr other than a member of an allowed class");
      }
      auto v = make(Value::object);
      v->s = args->items[0]->s;
      v->items = {args->items[1]};
      return v;
    }
    if (objects_ && g == "_codecs.encode") {  // bytes under protocol 2: encode(str, 'latin1')
      if (args->items.size() != 2 || args->items[0]->kind != Value::str || args->items[1]->kind != Value::str ||
          (args->items[1]->s != "latin1" && args->items[1]->s != "latin-1")) {
        bad("a _codecs.encode call other than encode(str, 'latin1')");
      }
      auto v = make(Value::bytes);
      const std::string& u = args->items[0]->s;  // UTF-8 of code points < 256
      for (std::size_t k = 0; k < u.size(); ++k) {
        const auto c = static_cast<unsigned char>(u[k]);
        if (c < 0x80) {
          v->s += static_cast<char>(c);
        } else if ((c == 0xC2 || c == 0xC3) && k + 1 < u.size()) {
          v->s += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(u[++k]) & 0x3F));
        } else {
          bad("a _codecs.encode of a string outside latin1");
        }
      }
      return v;
    }
    bad("a call of " + g + " as a function");
  }

  const std::string& d_;
  std::string file_;
  std::size_t at_ = 0;
  bool objects_ = false;
  std::vector<ValuePtr> stack_;
  std::map<std::uint64_t, ValuePtr> memo_;
};

void collect(const ValuePtr& v, const std::string& prefix, std::map<std::string, TorchTensorInfo>& out, int depth) {
  if (depth > 64) return;
  if (v->kind == Value::tensor) {
    out[prefix] = v->t;
    return;
  }
  if (v->kind != Value::dict) return;
  for (const auto& [k, x] : v->pairs) {
    if (k->kind != Value::str) continue;
    collect(x, prefix.empty() ? k->s : prefix + "." + k->s, out, depth + 1);
  }
}

// A torch.save archive: its entries, the pickle's entry and the archive's folder prefix.
struct TorchArchive {
  std::string bytes;                                   // the whole file
  std::map<std::string, std::string_view> entries;     // views into `bytes`
  std::string pkl, archive;
};

TorchArchive open_archive(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("torch file '{}' cannot be read: {}", file, std::strerror(errno));
  // One read into a string of the file's size (a stringstream would copy it twice more).
  const std::streamoff size = in.tellg();
  if (size < 0) fail("torch file '{}' cannot be read: its size is unknown", file);
  TorchArchive a;
  std::string& z = a.bytes;
  z.assign(static_cast<std::size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(z.data(), size)) fail("torch file '{}' cannot be read: {}", file, std::strerror(errno));
  a.entries = read_stored_zip(z, file);
  for (const auto& [name, bytes] : a.entries) {
    if (name.ends_with("/data.pkl") || name == "data.pkl") {
      a.pkl = name;
      a.archive = name.substr(0, name.size() - std::string("data.pkl").size());
    }
  }
  if (a.pkl.empty()) fail("torch file '{}': the zip holds no data.pkl; it is not a torch.save file", file);
  if (const auto bo = a.entries.find(a.archive + "byteorder"); bo != a.entries.end() && bo->second != "little") {
    fail("torch file '{}': saved with byte order '{}'; dstrain reads little-endian files", file, bo->second);
  }
  return a;  // moving `bytes` (never short enough to live inside the string) keeps the views valid
}

// The storage bytes of tensor `name`, checked to hold every element the tensor's view reaches.
std::string_view check_tensor(const TorchArchive& a, const TorchTensorInfo& t, const std::string& file, const std::string& name) {
  if (t.dtype.empty()) fail("torch file '{}': tensor '{}' has a storage type dstrain does not know", file, name);
  const auto it = a.entries.find(a.archive + "data/" + t.storage_key);
  if (it == a.entries.end()) fail("torch file '{}': tensor '{}' needs storage '{}', which the archive lacks (truncated?)", file, name, t.storage_key);
  // The last element the strides reach must lie inside the storage, computed without wrapping: a
  // crafted stride of 2^62 once wrapped the sum back into range and the read went outside it.
  std::int64_t last = t.storage_offset;
  bool empty = false, overflow = false;
  for (std::size_t k = 0; k < t.shape.size(); ++k) {
    if (t.shape[k] < 0 || t.stride[k] < 0) fail("torch file '{}': tensor '{}' has a negative size or stride", file, name);
    if (t.shape[k] == 0) empty = true;
    std::int64_t reach = 0;
    overflow =
        overflow || __builtin_mul_overflow(t.shape[k] == 0 ? 0 : t.shape[k] - 1, t.stride[k], &reach) || __builtin_add_overflow(last, reach, &last);
  }
  std::int64_t numel = 1;
  for (const std::int64_t d : t.shape) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  if (overflow) fail("torch file '{}': tensor '{}' has a shape and strides whose extent overflows 64 bits (corrupt or crafted)", file, name);
  const auto elems = static_cast<std::int64_t>(it->second.size() / elem_size(t.dtype));
  if (!empty && (t.storage_offset < 0 || last >= elems)) {
    fail("torch file '{}': tensor '{}' reaches element {} of a storage of {} elements (truncated or corrupt)", file, name, last, elems);
  }
  return it->second;
}

}  // namespace

bool TorchStateDict::looks_like(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  in.read(m, 4);
  return in.gcount() == 4 && m[0] == 'P' && m[1] == 'K' && m[2] == 3 && m[3] == 4;
}

TorchStateDict::TorchStateDict(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  TorchArchive a = open_archive(path);
  const CycleBreaker breaker;  // declared before the values: runs after they are dropped
  const std::string pkl(a.entries.at(a.pkl));
  Unpickler u(pkl, file);
  const ValuePtr root = u.run();
  if (root->kind != Value::dict) fail("torch file '{}': the saved object is not a dict (a state dict); save model.state_dict()", file);
  collect(root, "", tensors_, 0);
  if (tensors_.empty()) fail("torch file '{}': no tensors in the saved dict", file);
  for (const auto& [name, t] : tensors_) {
    const std::string_view bytes = check_tensor(a, t, file, name);
    if (!storages_.contains(t.storage_key)) storages_.emplace(t.storage_key, std::string(bytes));  // a shared storage copied once
  }
}

std::vector<float> TorchStateDict::read_fp32(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("torch file '{}' has no tensor '{}'", path_.string(), name);
  const TorchTensorInfo& t = it->second;
  const std::string& s = storages_.at(t.storage_key);
  std::int64_t n = 1;
  for (std::int64_t d : t.shape) n *= d;  // checked not to overflow when the file was opened
  std::vector<float> out(static_cast<std::size_t>(n));
  const std::size_t es = elem_size(t.dtype);
  const int kind = t.dtype == "F32" ? 0 : t.dtype == "F16" ? 1 : t.dtype == "BF16" ? 2 : t.dtype == "F64" ? 3 : -1;
  if (kind < 0) fail("torch file '{}': tensor '{}' is {}; weights must be a floating type (F32, F16, BF16, F64)", path_.string(), name, t.dtype);
  const auto load = [&](std::int64_t e) -> float {
    const char* p = s.data() + static_cast<std::size_t>(e) * es;
    switch (kind) {
      case 0: {
        float f;
        std::memcpy(&f, p, 4);
        return f;
      }
      case 1: {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        return fp16_bits_to_fp32(h);
      }
      case 2: {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_bits_to_fp32(h);
      }
      default: {
        double d;
        std::memcpy(&d, p, 8);
        return static_cast<float>(d);
      }
    }
  };
  // Row-major walk over the shape, following the strides (a saved view may be non-contiguous).
  std::vector<std::int64_t> idx(t.shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t e = t.storage_offset;
    for (std::size_t d = 0; d < idx.size(); ++d) e += idx[d] * t.stride[d];
    out[static_cast<std::size_t>(k)] = load(e);
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// ---- TorchPickle (formats/torch_pickle.h; TorchValue's accessors are in torch_pickle.cpp) ----

namespace {

// The unpickler's graph as a tree. A memo reference makes a shared node, copied at each use: the
// node budget bounds what a crafted chain of references could multiply, and the depth bound keeps
// the recursion (here and in the tree's destructor) short.
struct TreeBuilder {
  const TorchArchive& archive;
  const std::string& file;
  std::map<std::string, std::string_view>& storages;
  std::size_t budget = 1u << 20;

  static std::string key_text(const TorchValue& k) {
    if (k.kind == TorchValue::Kind::string) return k.s;
    if (k.kind == TorchValue::Kind::integer) return std::to_string(k.i);
    return "?";
  }

  // DeepSpeed's and torch's files nest under 10 levels (optimizer_state_dict > base_optimizer_state >
  // state > 0 > exp_avg); the bound keeps this recursion within a small reader thread's stack (256 KiB
  // under the fuzzer, where ASan's frames of this function are a few KiB each: 100 levels overflowed).
  static constexpr int kMaxDepth = 32;

  TorchValue build(const ValuePtr& v, const std::string& where, int depth) {
    if (depth > kMaxDepth) fail("torch file '{}': the saved object nests deeper than {} levels at '{}'", file, kMaxDepth, where);
    if (budget == 0) fail("torch file '{}': the saved object has more than {} values (shared references multiplied?)", file, 1u << 20);
    --budget;
    TorchValue out;
    out.file = file;
    out.where = where;
    const auto child = [&](const std::string& k) { return where.empty() ? k : where + "." + k; };
    switch (v->kind) {
      case Value::none: out.kind = TorchValue::Kind::none; break;
      case Value::boolean: out.kind = TorchValue::Kind::boolean, out.b = v->i != 0; break;
      case Value::integer: out.kind = TorchValue::Kind::integer, out.i = v->i; break;
      case Value::real: out.kind = TorchValue::Kind::real, out.f = v->f; break;
      case Value::str: out.kind = TorchValue::Kind::string, out.s = v->s; break;
      case Value::bytes: out.kind = TorchValue::Kind::bytes, out.s = v->s; break;
      case Value::tuple:
      case Value::list:
        out.kind = v->kind == Value::tuple ? TorchValue::Kind::tuple : TorchValue::Kind::list;
        for (std::size_t k = 0; k < v->items.size(); ++k) out.items.push_back(build(v->items[k], child(std::to_string(k)), depth + 1));
        break;
      case Value::dict:
        out.kind = TorchValue::Kind::dict;
        for (const auto& [k, x] : v->pairs) {
          TorchValue key = build(k, child("<key>"), depth + 1);
          TorchValue val = build(x, child(key_text(key)), depth + 1);
          out.pairs.emplace_back(std::move(key), std::move(val));
        }
        break;
      case Value::tensor:
        out.kind = TorchValue::Kind::tensor;
        out.tensor = v->t;
        storages.emplace(v->t.storage_key, check_tensor(archive, v->t, file, where));  // a view into the archive's bytes
        break;
      case Value::global:  // a bare allowed global: torch.float16 as a value
      case Value::object:
        out.kind = TorchValue::Kind::object;
        out.s = v->s;
        for (std::size_t k = 0; k < v->items.size(); ++k) out.items.push_back(build(v->items[k], child("<arg" + std::to_string(k) + ">"), depth + 1));
        if (v->state) out.state = std::make_shared<TorchValue>(build(v->state, child("<state>"), depth + 1));
        break;
      case Value::storage:
      case Value::mark:
        fail("torch file '{}': '{}' is a bare storage or mark, not a value; the pickle is not a torch.save object", file, where);
    }
    return out;
  }
};

}  // namespace

TorchPickle::TorchPickle(const std::filesystem::path& path) : path_(path) {
  const std::string file = path.string();
  TorchArchive a = open_archive(path);
  const CycleBreaker breaker;
  const std::string pkl(a.entries.at(a.pkl));
  Unpickler u(pkl, file, /*objects=*/true);
  const ValuePtr root = u.run();
  TreeBuilder tb{a, file, storages_};
  root_ = tb.build(root, "", 0);
  // The storages view a.bytes; a move keeps its heap buffer (never short enough to live inside
  // the string: a zip is at least 22 bytes) where it is.
  bytes_ = std::move(a.bytes);
}

std::vector<double> TorchPickle::read_f64(const TorchValue& v) const {
  const TorchTensorInfo& t = v.as_tensor();
  const auto it = storages_.find(t.storage_key);
  if (it == storages_.end()) v.fail_here(" is a tensor of another file");
  const std::string_view s = it->second;
  std::int64_t n = 1;
  for (std::int64_t d : t.shape) n *= d;  // checked not to overflow when the file was opened
  std::vector<double> out(static_cast<std::size_t>(n));
  const std::size_t es = elem_size(t.dtype);
  const std::string& dt = t.dtype;
  const auto load = [&](std::int64_t e) -> double {
    const char* p = s.data() + static_cast<std::size_t>(e) * es;
    if (dt == "F32") {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    if (dt == "F16" || dt == "BF16") {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return dt == "F16" ? fp16_bits_to_fp32(h) : bf16_bits_to_fp32(h);
    }
    if (dt == "F64" || dt == "I64") {
      std::int64_t x;
      double d;
      std::memcpy(&x, p, 8);
      std::memcpy(&d, p, 8);
      return dt == "F64" ? d : static_cast<double>(x);
    }
    if (dt == "I32") {
      std::int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    if (dt == "I16") {
      std::int16_t x;
      std::memcpy(&x, p, 2);
      return x;
    }
    if (dt == "I8") return static_cast<signed char>(*p);
    return static_cast<unsigned char>(*p);  // U8, BOOL
  };
  std::vector<std::int64_t> idx(t.shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    std::int64_t e = t.storage_offset;
    for (std::size_t d = 0; d < idx.size(); ++d) e += idx[d] * t.stride[d];
    out[static_cast<std::size_t>(k)] = load(e);
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<float> TorchPickle::read_fp32(const TorchValue& v) const {
  const TorchTensorInfo& t = v.as_tensor();
  const std::string& dt = t.dtype;
  if (dt != "F32" && dt != "F16" && dt != "BF16" && dt != "F64") v.fail_here(" is a " + dt + " tensor; a floating type (F32, F16, BF16, F64) was expected");
  // A contiguous F32 / F16 / BF16 tensor — every tensor DeepSpeed saves: one block copy or one
  // conversion (ops' convert) instead of an element-wise walk through doubles; the walk is for views.
  bool contiguous = true;
  std::int64_t n = 1;
  for (std::size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != n) contiguous = false;
    n *= t.shape[d];
  }
  const auto it = storages_.find(t.storage_key);
  if (contiguous && dt != "F64" && it != storages_.end()) {
    const DType from = dt == "F32" ? DType::fp32 : dt == "F16" ? DType::fp16 : DType::bf16;
    std::vector<float> out(static_cast<std::size_t>(n));
    if (out.empty()) return out;  // an empty tensor's storage may be empty too (no data pointer to copy from)
    // In bounds: every tensor was checked to lie inside its storage when the file was opened.
    const char* src = it->second.data() + static_cast<std::size_t>(t.storage_offset) * dtype_size(from);
    if (from == DType::fp32) {
      std::memcpy(out.data(), src, out.size() * sizeof(float));
    } else if (reinterpret_cast<std::uintptr_t>(src) % alignof(std::uint16_t) == 0) {
      convert(src, from, out.data(), DType::fp32, out.size());
    } else {
      // torch.save aligns each storage to 64 bytes; a file that does not (hand-made or damaged)
      // is read through an aligned copy rather than through a misaligned 16-bit load.
      std::vector<std::uint16_t> aligned(out.size());
      std::memcpy(aligned.data(), src, aligned.size() * sizeof(std::uint16_t));
      convert(aligned.data(), from, out.data(), DType::fp32, out.size());
    }
    return out;
  }
  const std::vector<double> d = read_f64(v);
  return std::vector<float>(d.begin(), d.end());
}

}  // namespace dstrain
