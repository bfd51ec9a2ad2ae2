// Reading a Hugging Face config.json: JSON with every key given at most once. A key given twice
// in one object is an error, as in a ds_config: which of the two values a reader keeps differs
// between readers (Python's json keeps the last).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dstrain {

// Parses `json_text`; Error naming `source` for invalid JSON, a duplicate key or a non-object.
// `what` names the expected file in the messages, e.g. "a Hugging Face GPT-2 config.json".
nlohmann::json parse_hf_config_json(std::string_view json_text, std::string_view source, std::string_view what);

// The text of a model config file; Error naming the path when it cannot be read.
std::string read_model_config_file(const std::filesystem::path& path);

// The config.json a model spec that is not a descriptor names: the file itself, or the
// config.json inside a folder (as Hugging Face checkpoints come). Error naming the spec otherwise:
// "neither <descriptor> nor an existing file; accepted forms: <forms>".
std::filesystem::path model_config_path(std::string_view spec, std::string_view descriptor, std::string_view forms);

}  // namespace dstrain
