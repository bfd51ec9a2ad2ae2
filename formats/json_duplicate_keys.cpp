#include "formats/json_duplicate_keys.h"

namespace dstrain {

nlohmann::json::parser_callback_t DuplicateKeyFinder::callback() {
  keys_.clear();
  duplicate_.clear();
  return [this](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    if (event == nlohmann::json::parse_event_t::object_start) {
      if (keys_.size() <= d) keys_.resize(d + 1);
      keys_[d].clear();
    } else if (event == nlohmann::json::parse_event_t::key && d >= 1 && keys_.size() >= d) {
      // A key event comes at the depth inside the object, one more than its object_start's.
      if (!keys_[d - 1].insert(parsed.get<std::string>()).second && duplicate_.empty()) duplicate_ = parsed.get<std::string>();
    }
    return true;
  };
}

}  // namespace dstrain
