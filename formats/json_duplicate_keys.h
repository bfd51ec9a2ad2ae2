// Keys given twice in one JSON object. nlohmann's parser keeps the last value silently, Python's
// json too, while other readers keep the first: a file that holds both is ambiguous, so the readers
// of users' JSON (config.json, JSONL documents) refuse it, naming the key.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dstrain {

class DuplicateKeyFinder {
 public:
  // A parser callback (for nlohmann::json::parse or parse_json_text) that records the first key
  // given twice in one object, at any depth; it keeps every value. Valid while this object lives.
  nlohmann::json::parser_callback_t callback();
  // The first duplicate key of the text parsed with callback(); "" when there was none.
  const std::string& duplicate() const { return duplicate_; }

 private:
  std::vector<std::set<std::string>> keys_;  // per open object, by depth
  std::string duplicate_;
};

}  // namespace dstrain
