// JSON text from a user's file, parsed with errors a person can read: where the text goes wrong
// (line and column) and what is wrong there, in the project's words — never the JSON library's
// "[json.exception.parse_error.101]" — and numbers beyond what a double holds (1e400) refused as
// such instead of escaping as the library's out_of_range exception. Text nested deeper than
// kMaxJsonNesting is refused before parsing: the parsed value would be copied and destroyed
// recursively.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dstrain {

// The deepest nesting of arrays and objects parse_json_text accepts. The files read with it nest a
// few levels (a tokenizer.json's Sequence of steps: 4); deeper text is refused before parsing.
constexpr std::size_t kMaxJsonNesting = 512;

// Parses `text`; Error "{what} is not valid JSON: {reason} at line L, column C" (or "... holds a
// number out of range ...") otherwise. `what` names the file and its role, e.g. "safetensors file
// 'x' (its header)". `callback`: nlohmann's parser callback (nullptr: none).
nlohmann::json parse_json_text(std::string_view text, std::string_view what, const nlohmann::json::parser_callback_t& callback = nullptr);

// The reason of a JSON library exception, in words: for a parse of `text`, "unexpected '}' at line
// 3, column 7" or "a number out of range (...)"; for reading a parsed value, the library's sentence
// without its "[json.exception...]" tag ("key 'tensors' not found").
std::string json_error_text(const nlohmann::json::exception& e, std::string_view text);

// `value` as JSON text for an error message, cut as excerpt() (ops/quoted_excerpt.h) cuts text. A
// value that nests deeper than kMaxExcerptNesting is described ("a list nested more than 8 deep")
// instead: serialising recurses once per level, and the message needs no more.
constexpr std::size_t kMaxExcerptNesting = 8;
std::string json_excerpt(const nlohmann::json& value);

}  // namespace dstrain
