#include "data/jsonl_documents.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ops/error.h"
#include "formats/json_duplicate_keys.h"
#include "formats/json_text.h"
#include "ops/quoted_excerpt.h"

namespace dstrain {
namespace {

constexpr std::size_t kMaxKeysShown = 8;

std::string type_name(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "a string";
}

}  // namespace

void read_jsonl_documents(const std::filesystem::path& file, std::string_view text_key, std::vector<std::string>& documents) {
  if (text_key.empty()) fail("the JSONL text key is empty: name the key that holds each document's text (the default is \"text\")");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("cannot open JSONL file {}: check the path", file.string());
  std::string line;
  std::size_t number = 0;
  const std::size_t first = documents.size();
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json object;
    DuplicateKeyFinder duplicates;
    try {
      object = nlohmann::json::parse(line, duplicates.callback());
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not valid JSON ({}): each line of a JSONL file must be one JSON object", file.string(), number, json_error_text(e, line));
    }
    if (!duplicates.duplicate().empty()) {
      fail(
          "{}:{}: the key {} is given twice in the line's object: which value a reader keeps differs (Python's json keeps the "
          "last, other readers the first); keep one",
          file.string(), number, quoted_excerpt(duplicates.duplicate()));
    }
    if (!object.is_object()) {
      fail("{}:{}: the line is {}, not a JSON object: each line must be an object like {{\"{}\": \"...\"}}", file.string(), number, type_name(object),
           text_key);
    }
    const auto it = object.find(text_key);
    if (it == object.end()) {
      std::string keys;
      std::size_t shown = 0;
      for (const auto& [key, value] : object.items()) {
        if (shown == kMaxKeysShown) {
          keys += ", ...";
          break;
        }
        keys += (shown++ == 0 ? "\"" : ", \"") + key + "\"";
      }
      fail("{}:{}: the object has no key \"{}\" (it has {}): give the key that holds the text with --text-key", file.string(), number, text_key,
           keys.empty() ? "no keys" : keys);
    }
    if (!it->is_string()) {
      fail("{}:{}: \"{}\" is {}, not a string: the text of a document must be a JSON string", file.string(), number, text_key, type_name(*it));
    }
    documents.push_back(it->get<std::string>());
  }
  if (in.bad()) fail("cannot read JSONL file {} (after line {}): check that it is a readable file", file.string(), number);
  if (documents.size() == first) fail("JSONL file {} holds no documents (no non-blank lines)", file.string());
  // Every text empty: the file would add only document separators, no text to train on.
  if (std::all_of(documents.begin() + static_cast<std::ptrdiff_t>(first), documents.end(), [](const std::string& d) { return d.empty(); })) {
    fail(
        "JSONL file {}: the \"{}\" of each of its {} documents is empty: there is no text to prepare: drop the file, or name the key that holds the "
        "text (--text-key)",
        file.string(), text_key, documents.size() - first);
  }
}

}  // namespace dstrain
