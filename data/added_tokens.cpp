#include "data/added_tokens.h"

#include <algorithm>

namespace dstrain {

void AddedTokens::add(std::string content, std::int32_t id) {
  if (content.empty()) return;  // an empty token can never be found in text
  by_content_[content] = id;
  auto& bucket = by_first_byte_[static_cast<unsigned char>(content[0])];
  const auto same = std::find_if(bucket.begin(), bucket.end(), [&](const auto& e) { return e.first == content; });
  if (same != bucket.end()) {
    same->second = id;
    return;
  }
  bucket.emplace_back(std::move(content), id);
  std::stable_sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<AddedTokens::Section> AddedTokens::split(std::string_view text) const {
  std::vector<Section> sections;
  std::size_t start = 0;  // of the current text section
  for (std::size_t i = 0; i < text.size();) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[i])];
    const std::pair<std::string, std::int32_t>* found = nullptr;
    for (const auto& entry : bucket) {
      if (text.substr(i, entry.first.size()) == entry.first) {
        found = &entry;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back({text.substr(start, i - start), -1});
    sections.push_back({text.substr(i, found->first.size()), found->second});
    i += found->first.size();
    start = i;
  }
  if (start < text.size()) sections.push_back({text.substr(start), -1});
  return sections;
}

std::int32_t AddedTokens::find(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : it->second;
}

}  // namespace dstrain
