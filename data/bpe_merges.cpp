#include "data/bpe_merges.h"

#include <queue>

namespace dstrain {

void BpeMerges::add(std::int32_t first, std::int32_t second, std::int32_t merged, std::int32_t rank) {
  merges_[key(first, second)] = Merge{rank, merged};
}

void BpeMerges::apply(std::vector<std::int32_t>& word) const {
  if (word.size() < 2) return;
  // A heap of candidate pairs ordered by (rank, position of the left symbol) over a linked list of
  // symbols: O(n log n), which matters when a whole text section is one piece (Llama 2's files have
  // no pre-tokenizer). A popped pair is stale when either symbol has changed since it was pushed.
  const std::size_t n = word.size();
  std::vector<std::int32_t> id(word);
  std::vector<std::size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i - 1;  // wraps for i = 0: "none"
    next[i] = i + 1;  // n: "none"
  }
  struct Candidate {
    std::int32_t rank;
    std::size_t left;
    std::int32_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](std::size_t left) {
    if (left >= n || next[left] >= n) return;
    const std::int32_t a = id[left], b = id[next[left]];
    if (a < 0 || b < 0) return;
    const auto it = merges_.find(key(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b, it->second.merged});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || id[c.left] != c.left_id) continue;
    const std::size_t right = next[c.left];
    if (right >= n || id[right] != c.right_id) continue;
    id[c.left] = c.merged;
    alive[right] = false;
    next[c.left] = next[right];
    if (next[right] < n) prev[next[right]] = c.left;
    if (prev[c.left] < n) push(prev[c.left]);
    push(c.left);
  }
  word.clear();
  for (std::size_t i = 0; i < n; i = next[i]) word.push_back(id[i]);
}

}  // namespace dstrain
