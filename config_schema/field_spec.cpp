#include "config_schema/field_spec.h"

namespace dstrain::config {

namespace {
FieldSpec make(std::string key, FieldKind kind, Json def, std::string description) {
  FieldSpec f;
  f.key = std::move(key);
  f.kind = kind;
  f.default_value = std::move(def);
  f.nullable = f.default_value.is_null();  // a None default means DeepSpeed declares it Optional
  f.description = std::move(description);
  return f;
}
}  // namespace

FieldSpec bool_field(std::string key, bool def, std::string description) {
  return make(std::move(key), FieldKind::boolean, def, std::move(description));
}
FieldSpec int_field(std::string key, Json def, std::string description) {
  return make(std::move(key), FieldKind::integer, std::move(def), std::move(description));
}
FieldSpec number_field(std::string key, Json def, std::string description) {
  return make(std::move(key), FieldKind::number, std::move(def), std::move(description));
}
FieldSpec string_field(std::string key, Json def, std::string description) {
  return make(std::move(key), FieldKind::string, std::move(def), std::move(description));
}
FieldSpec object_field(std::string key, std::string description) { return make(std::move(key), FieldKind::object, nullptr, std::move(description)); }
FieldSpec array_field(std::string key, Json def, std::string description) {
  return make(std::move(key), FieldKind::array, std::move(def), std::move(description));
}
const FieldSpec* SectionSpec::find(const std::string& key) const {
  for (const auto& f : fields) {
    if (f.key == key) return &f;
    for (const auto& a : f.aliases)
      if (a == key) return &f;
  }
  return nullptr;
}

SectionSpec make_section(std::string path, Regime regime, std::string description, std::vector<FieldSpec> fields) {
  SectionSpec s;
  s.path = std::move(path);
  s.regime = regime;
  s.description = std::move(description);
  s.fields = std::move(fields);
  for (auto& f : s.fields) {
    f.section = s.path;
    f.regime = regime;
  }
  return s;
}

std::vector<FieldSpec> describe_fields() {
  std::vector<FieldSpec> out;
  for (const auto& s : all_sections()) out.insert(out.end(), s.fields.begin(), s.fields.end());
  return out;
}

const char* kind_name(FieldKind kind) {
  switch (kind) {
    case FieldKind::boolean:
      return "boolean";
    case FieldKind::integer:
      return "integer";
    case FieldKind::number:
      return "number";
    case FieldKind::string:
      return "string";
    case FieldKind::object:
      return "object";
    case FieldKind::array:
      return "array";
    case FieldKind::any:
      return "any";
  }
  return "any";
}

}  // namespace dstrain::config
