// BpeMerges: a BPE merge table over token ids, and the merge loop of Hugging Face's BPE model.
//
// A word is a sequence of symbols (token ids; a negative id is a symbol outside the vocabulary that
// never merges). Repeatedly the adjacent pair of lowest rank is merged, the leftmost occurrence
// first, until no pair of the table is left. This is the order of Hugging Face tokenizers' BPE
// (priority queue by rank, then position) and of transformers.js (score = rank + position / length).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dstrain {

class BpeMerges {
 public:
  // Adds the merge first + second -> merged at `rank` (lower merges first). A pair given twice keeps
  // its last rank, as transformers.js's Map does.
  void add(std::int32_t first, std::int32_t second, std::int32_t merged, std::int32_t rank);
  // Merges `word` in place.
  void apply(std::vector<std::int32_t>& word) const;
  std::size_t size() const { return merges_.size(); }

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  static std::uint64_t key(std::int32_t first, std::int32_t second) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(first)) << 32) | static_cast<std::uint32_t>(second);
  }
  std::unordered_map<std::uint64_t, Merge> merges_;
};

}  // namespace dstrain
