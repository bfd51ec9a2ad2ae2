// Field tables: the single description of every ds_config key dstrain reads.
//
// Each section of the config is described by a SectionSpec (its path, its parsing regime and its
// fields). The parser reads values through these tables, and describe_fields() hands the same
// tables to the JSON-schema agreement test, so the schema file, the parser and the documentation
// cannot drift apart silently.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dstrain::config {

using Json = nlohmann::ordered_json;

// DeepSpeed parses a section either with plain dict lookups (regime A: no coercion, unknown keys
// ignored — we warn) or with a pydantic model (regime B: lax coercion, unknown keys rejected).
// See docs/config.md §3.
enum class Regime { dict_lookup, validated };

enum class FieldKind { boolean, integer, number, string, object, array, any };

// One key of one section.
struct FieldSpec {
  std::string section;  // dotted path of the section ("" = top level)
  std::string key;      // canonical spelling: DeepSpeed's pydantic field name
  FieldKind kind = FieldKind::any;
  Regime regime = Regime::dict_lookup;   // regime of the section it belongs to
  Json default_value;                    // null = DeepSpeed's None
  bool nullable = false;                 // an explicit null is a valid value (Optional in DeepSpeed)
  std::vector<std::string> aliases;      // other accepted spellings of the same key
  std::vector<std::string> enum_values;  // for strings (or integers, written as strings)
  bool enum_case_insensitive = false;
  std::optional<double> minimum;  // inclusive
  std::optional<double> maximum;  // inclusive
  std::string description;
  std::string replaced_by;  // deprecated key: the key it maps to (not written to output)

  std::string path() const { return section.empty() ? key : section + "." + key; }

  // Builder helpers so that the tables read as one line per key.
  FieldSpec&& alias(std::string name) && {
    aliases.push_back(std::move(name));
    return std::move(*this);
  }
  FieldSpec&& optional() && {
    nullable = true;
    return std::move(*this);
  }
  // A None default for a typed field (DeepSpeed's Optional[...] = None); implies optional().
  FieldSpec&& default_none() && {
    default_value = nullptr;
    nullable = true;
    return std::move(*this);
  }
  FieldSpec&& deprecated_for(std::string replacement) && {
    replaced_by = std::move(replacement);
    return std::move(*this);
  }
  FieldSpec&& min(double v) && {
    minimum = v;
    return std::move(*this);
  }
  FieldSpec&& max(double v) && {
    maximum = v;
    return std::move(*this);
  }
  FieldSpec&& one_of(std::vector<std::string> v, bool case_insensitive = false) && {
    enum_values = std::move(v);
    enum_case_insensitive = case_insensitive;
    return std::move(*this);
  }
};

FieldSpec bool_field(std::string key, bool def, std::string description);
FieldSpec int_field(std::string key, Json def, std::string description);
FieldSpec number_field(std::string key, Json def, std::string description);
FieldSpec string_field(std::string key, Json def, std::string description);
FieldSpec object_field(std::string key, std::string description);
FieldSpec array_field(std::string key, Json def, std::string description);

// A section: a JSON object whose keys are described by `fields`.
struct SectionSpec {
  std::string path;  // "" = top level
  Regime regime = Regime::dict_lookup;
  std::vector<FieldSpec> fields;
  std::string description;

  const FieldSpec* find(const std::string& key) const;  // by canonical key or alias
};

// Builds a section, stamping section path and regime into every field.
SectionSpec make_section(std::string path, Regime regime, std::string description, std::vector<FieldSpec> fields);

// Every section dstrain reads with a field table, in config order.
const std::vector<SectionSpec>& all_sections();

// All fields of all_sections(), flattened: what the JSON schema must agree with.
std::vector<FieldSpec> describe_fields();

const char* kind_name(FieldKind kind);

}  // namespace dstrain::config
