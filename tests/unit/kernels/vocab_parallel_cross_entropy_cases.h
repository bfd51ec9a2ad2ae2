// Case table for the vocabulary-parallel cross-entropy (ops/kernels/vocab_parallel_cross_entropy.h),
// shared by the CPU test and tests/gpu/test_kernels_gpu.cpp. A case is a whole (BT, Vp) logits
// table, the first V columns real tokens, cut into `ranks` shards as the tensor-parallel
// vocabulary split cuts it (n / W + (r < n % W) consecutive rows each, models/param_split.h): the
// first shard starts at row 0, later ones in the middle, the last holds the padding (valid < rows)
// and, with more shards than real rows reach, none at all (valid == 0).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct VocabParallelCase {
  const char* name;
  std::int64_t BT, V, Vp;  // rows; real and padded vocabulary
  int ranks;               // shards of the Vp columns
  double logit_range;      // logits uniform in [-range, range]
  int ignore_every;        // every k-th position has target -1 (0: none)
};
inline constexpr VocabParallelCase kVocabParallelCases[] = {
    {"one_shard_padded", 3, 9, 12, 1, 3.0, 2},       // the whole vocabulary on one rank: first 0, valid < rows
    {"two_shards", 4, 13, 16, 2, 4.0, 0},            // [0, 8) all real, [8, 16) 5 real + 3 padding
    {"three_uneven_ignored", 7, 100, 128, 3, 3.0, 3},  // 43/43/42 rows: a middle shard, the last 14 real
    {"empty_last_shard", 5, 10, 16, 4, 2.0, 0},      // 4 rows each: the third 2 real, the fourth none
    {"all_ignored", 2, 5, 8, 2, 2.0, 1},
    {"multi_block_rows", 4, 3000, 3072, 2, 8.0, 0},  // shards wider than one 1024-thread block
    {"large_logits", 3, 50, 64, 2, 60.0, 4},         // the max subtraction
};

// Shard r of a case: columns [first, first + rows) of the whole table, the first `valid` real.
struct VocabShardPiece {
  std::int64_t first = 0, rows = 0, valid = 0;
};
inline VocabShardPiece vocab_shard_piece(const VocabParallelCase& c, int r) {
  VocabShardPiece p;
  for (int k = 0; k <= r; ++k) {
    p.first += k > 0 ? p.rows : 0;
    p.rows = c.Vp / c.ranks + (k < c.Vp % c.ranks ? 1 : 0);
  }
  p.valid = std::clamp<std::int64_t>(c.V - p.first, 0, p.rows);
  return p;
}

// lse and losses are fp32 from the (rounded) logits: the fp32 tolerance for every storage dtype;
// dlogits are rounded once to the storage dtype.
inline constexpr DTypeTols kVocabParallelTols{{1e-5, 1e-5}, {1e-4, 2e-3}, {1e-4, 1e-2}};

}  // namespace dstrain::test
