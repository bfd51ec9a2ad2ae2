#include "data/tokenizer_json.h"

#include "formats/json_text.h"
#include "ops/error.h"

namespace dstrain::tokenizer_json {

const nlohmann::json& member_or_null(const nlohmann::json& object, const char* key) {
  static const nlohmann::json null_value;
  if (!object.is_object()) return null_value;
  const auto it = object.find(key);
  return it == object.end() ? null_value : *it;
}

std::string string_or(const nlohmann::json& object, const char* key, const std::string& fallback, const std::string& where) {
  const nlohmann::json& value = member_or_null(object, key);
  if (value.is_null()) return fallback;
  if (!value.is_string()) fail("{}.{} is {}, not a string", where, key, json_excerpt(value));
  return value.get<std::string>();
}

bool bool_or(const nlohmann::json& object, const char* key, bool fallback, const std::string& where) {
  const nlohmann::json& value = member_or_null(object, key);
  if (value.is_null()) return fallback;
  if (!value.is_boolean()) fail("{}.{} is {}, not true or false", where, key, json_excerpt(value));
  return value.get<bool>();
}

std::size_t size_or(const nlohmann::json& object, const char* key, std::size_t fallback, const std::string& where) {
  const nlohmann::json& value = member_or_null(object, key);
  if (value.is_null()) return fallback;
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<std::int64_t>() >= 0)) {
    fail("{}.{} is {}, not a non-negative integer", where, key, json_excerpt(value));
  }
  return value.get<std::size_t>();
}

std::string required_string(const nlohmann::json& object, const char* key, const std::string& where) {
  const nlohmann::json& value = member_or_null(object, key);
  if (!value.is_string()) fail("{}.{} is {}: it should be a string", where, key, value.is_null() ? "missing" : json_excerpt(value));
  return value.get<std::string>();
}

}  // namespace dstrain::tokenizer_json
