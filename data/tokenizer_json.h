// Typed reads of a tokenizer.json's members, refusing a wrong type by file, key and value.
//
// Why not nlohmann's value(): it returns a copy (its copy constructor recurses once per nesting
// level, and a crafted file nests a Sequence's steps hundreds deep before the parsers' depth limit,
// kMaxTokenizerNesting, can refuse it), and on a wrong type it throws its own type_error, which
// names neither the file nor the key.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace dstrain::tokenizer_json {

// The member `key` of `object`, or null when absent or when `object` is not an object; a reference.
const nlohmann::json& member_or_null(const nlohmann::json& object, const char* key);

// The member as a string, bool or non-negative integer; `fallback` when absent or null, an error
// naming `where`.`key` and the value otherwise.
std::string string_or(const nlohmann::json& object, const char* key, const std::string& fallback, const std::string& where);
bool bool_or(const nlohmann::json& object, const char* key, bool fallback, const std::string& where);
std::size_t size_or(const nlohmann::json& object, const char* key, std::size_t fallback, const std::string& where);
// A string member that must be there.
std::string required_string(const nlohmann::json& object, const char* key, const std::string& where);

}  // namespace dstrain::tokenizer_json
