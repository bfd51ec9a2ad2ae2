// Reading one config section through its field table: unknown keys, aliases, "auto", and the type
// coercion of the section's regime (docs/config.md §3–§6).
#pragma once

#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/warning.h"

namespace dstrain::config {

// Collects warnings while one config is parsed.
class ParseContext {
 public:
  explicit ParseContext(std::vector<Warning>& warnings) : warnings_(warnings) {}
  void warn(std::string path, std::string message) { warnings_.push_back({std::move(path), std::move(message)}); }

 private:
  std::vector<Warning>& warnings_;
};

// "a" + "." + "b", or "b" when a is empty.
std::string join_path(const std::string& section, const std::string& key);

// A short rendering of a JSON value for messages: strings quoted, long values cut.
std::string show(const Json& value);

// Damerau-free Levenshtein distance; used for "did you mean" suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The closest candidate when it is plausibly a typo of `key`, else "".
std::string closest_key(const std::string& key, const std::vector<std::string>& candidates);

// What a field accepts, for messages: "an integer >= 0", "one of \"none\", \"cpu\", \"nvme\"", ...
std::string expected_text(const FieldSpec& field);

// Coerces `value` for `field` as pydantic lax mode does (regime B); throws Error naming path,
// value and what is valid.
Json coerce_validated(const Json& value, const FieldSpec& field);

// Checks `value` for a regime-A field: DeepSpeed applies no coercion, so values it would crash on
// are errors here, and values it would silently misread (a string "false" for a bool) are
// followed and warned about.
Json check_dict_lookup(const Json& value, const FieldSpec& field, ParseContext& ctx);

// Reads `object` (the section's JSON object) through `spec`: every field of the table appears in
// the result under its canonical key, with its default when absent. Keys listed in
// `handled_elsewhere` are left to the caller (deprecated names, nested sections read separately).
Json read_section(const Json& object, const SectionSpec& spec, ParseContext& ctx, const std::vector<std::string>& handled_elsewhere = {});

// Reports (error in regime B, warning in regime A) keys of `object` not in `known`.
void check_unknown_keys(const Json& object, const std::string& section, Regime regime, const std::vector<std::string>& known, ParseContext& ctx);

// Python truthiness, as DeepSpeed's `if config.get("enabled"):` sees a value.
bool truthy(const Json& value);

}  // namespace dstrain::config
