// TorchValue's typed accessors (formats/torch_pickle.h): reads of a value tree that name the file
// and the path on a wrong kind or a missing key. The tree itself is built by the unpickler in
// torch_state_dict.cpp.
#include "formats/torch_pickle.h"

#include <string>

#include "ops/error.h"

namespace dstrain {

const char* TorchValue::kind_name() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "a bool";
    case Kind::integer: return "an int";
    case Kind::real: return "a float";
    case Kind::string: return "a string";
    case Kind::bytes: return "bytes";
    case Kind::list: return "a list";
    case Kind::tuple: return "a tuple";
    case Kind::dict: return "a dict";
    case Kind::tensor: return "a tensor";
    case Kind::object: return "an object";
  }
  return "?";
}

void TorchValue::fail_here(const std::string& what) const {
  fail("torch file '{}': {}{}", file, where.empty() ? std::string("the saved object") : "'" + where + "'", what);
}

bool TorchValue::as_bool() const {
  if (kind != Kind::boolean) fail_here(std::string(" is ") + kind_name() + ", not a bool");
  return b;
}
std::int64_t TorchValue::as_int() const {
  if (kind == Kind::boolean) return b ? 1 : 0;
  if (kind != Kind::integer) fail_here(std::string(" is ") + kind_name() + ", not an int");
  return i;
}
double TorchValue::as_double() const {
  if (kind == Kind::real) return f;
  if (kind == Kind::integer) return static_cast<double>(i);
  if (kind == Kind::boolean) return b ? 1 : 0;
  fail_here(std::string(" is ") + kind_name() + ", not a number");
}
const std::string& TorchValue::as_string() const {
  if (kind != Kind::string) fail_here(std::string(" is ") + kind_name() + ", not a string");
  return s;
}
const TorchTensorInfo& TorchValue::as_tensor() const {
  if (kind != Kind::tensor) fail_here(std::string(" is ") + kind_name() + ", not a tensor");
  return tensor;
}
const std::string& TorchValue::object_name() const {
  if (kind != Kind::object) fail_here(std::string(" is ") + kind_name() + ", not an object");
  return s;
}
const TorchValue* TorchValue::find(const std::string& key) const {
  if (kind != Kind::dict) fail_here(std::string(" is ") + kind_name() + ", not a dict (looking for key '" + key + "')");
  for (const auto& [k, v] : pairs)
    if (k.kind == Kind::string && k.s == key) return &v;
  return nullptr;
}
const TorchValue* TorchValue::find(std::int64_t key) const {
  if (kind != Kind::dict) fail_here(std::string(" is ") + kind_name() + ", not a dict (looking for key " + std::to_string(key) + ")");
  for (const auto& [k, v] : pairs)
    if (k.kind == Kind::integer && k.i == key) return &v;
  return nullptr;
}
const TorchValue& TorchValue::at(const std::string& key) const {
  const TorchValue* v = find(key);
  if (v == nullptr) fail_here(" has no key '" + key + "'");
  return *v;
}
const TorchValue& TorchValue::at(std::int64_t key) const {
  const TorchValue* v = find(key);
  if (v == nullptr) fail_here(" has no key " + std::to_string(key));
  return *v;
}
const TorchValue& TorchValue::operator[](std::size_t k) const {
  if (!is_sequence()) fail_here(std::string(" is ") + kind_name() + ", not a list");
  if (k >= items.size()) fail_here(" has " + std::to_string(items.size()) + " elements; element " + std::to_string(k) + " is missing");
  return items[k];
}
std::size_t TorchValue::size() const {
  if (kind == Kind::dict) return pairs.size();
  if (!is_sequence()) fail_here(std::string(" is ") + kind_name() + ", not a list or dict");
  return items.size();
}

}  // namespace dstrain
