// Case table for softmax_cross_entropy (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct SoftmaxCrossEntropyCase {
  const char* name;
  std::int64_t BT, V, Vp;
  double logit_range;  // logits uniform in [-range, range]
  int ignore_every;    // every k-th position has target -1 (0: none)
};
inline constexpr SoftmaxCrossEntropyCase kSoftmaxCrossEntropyCases[] = {
    {"V1", 2, 1, 1, 3.0, 0},
    {"padded", 3, 13, 16, 4.0, 0},
    {"ignored", 7, 10, 10, 2.0, 3},
    {"all_ignored", 2, 5, 8, 2.0, 1},
    {"multi_chunk_padded", 4, 1300, 1408, 8.0, 0},  // several 512-column chunks, padding past V
    {"large_logits", 3, 50, 64, 60.0, 0},           // exercises the max subtraction
};
// Loss and dlogits: fp32 math; 16-bit storage rounds the inputs (reference sees them) and the
// dlogits output once.
inline constexpr DTypeTols kSoftmaxCrossEntropyTols{{1e-5, 1e-5}, {1e-4, 2e-3}, {1e-4, 1e-2}};

}  // namespace dstrain::test
