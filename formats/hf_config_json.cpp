#include "formats/hf_config_json.h"

#include <fstream>
#include <sstream>

#include "ops/error.h"
#include "formats/json_duplicate_keys.h"
#include "formats/json_text.h"

namespace dstrain {

nlohmann::json parse_hf_config_json(std::string_view json_text, std::string_view source, std::string_view what) {
  nlohmann::json j;
  DuplicateKeyFinder duplicates;
  try {
    j = nlohmann::json::parse(json_text, duplicates.callback());
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number such as 1e400
    fail("model config '{}' is not valid JSON ({}); give {}", source, json_error_text(e, json_text), what);
  }
  if (!duplicates.duplicate().empty()) fail("model config '{}': key '{}' is given twice; keep one", source, duplicates.duplicate());
  if (!j.is_object()) fail("model config '{}' must be a JSON object ({})", source, what);
  return j;
}

std::filesystem::path model_config_path(std::string_view spec, std::string_view descriptor, std::string_view forms) {
  const std::filesystem::path p{std::string(spec)};
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) {
    auto inner = p / "config.json";
    if (std::filesystem::is_regular_file(inner, ec)) return inner;
    fail("model spec '{}' is a folder without a config.json; give the config.json itself or a folder holding one", spec);
  }
  if (std::filesystem::is_regular_file(p, ec)) return p;
  fail("model spec '{}' is neither {} nor an existing file; accepted forms: {}", spec, descriptor, forms);
}

std::string read_model_config_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot open the model config '{}'; check the path and its permissions", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace dstrain
