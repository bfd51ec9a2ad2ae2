// Case table for attention (shared with the future CUDA tests in tests/gpu/).
#pragma once

#include <cstdint>

#include "kernel_test_util.h"

namespace dstrain::test {

struct AttentionCase {
  const char* name;
  std::int64_t B, T, C, NH;
  float dropout_p;
};
inline constexpr AttentionCase kAttentionCases[] = {
    {"T1", 1, 1, 8, 2, 0.0f},        {"NH1", 2, 5, 6, 1, 0.0f},
    {"HS_odd", 1, 7, 15, 3, 0.0f},                                           // HS = 5: C not a multiple of 8
    {"gpt2ish", 2, 33, 64, 4, 0.0f}, {"crosses_chunk", 1, 70, 32, 2, 0.0f},  // T > 64: several online-softmax chunks
    {"dropout", 2, 19, 24, 3, 0.2f}, {"HS_max", 1, 35, 128, 1, 0.1f},        // the largest head size, several query and key blocks
};
// Grouped KV heads (Llama, Mistral, Qwen): query head h reads KV head h / (NH / NKV); qkv rows
// are (NH + 2·NKV)·HS wide. NKV = 1 (multi-query), some, and all (= multi-head, through the
// grouped layout's code path with G = 1).
struct GqaAttentionCase {
  const char* name;
  std::int64_t B, T, NH, NKV, HS;
  float dropout_p;
};
inline constexpr GqaAttentionCase kGqaAttentionCases[] = {
    {"mqa_T1", 1, 1, 4, 1, 8, 0.0f},           {"mqa", 2, 9, 3, 1, 6, 0.0f},
    {"kv2_of_4", 2, 21, 4, 2, 8, 0.0f},        {"kv3_of_9_smollm", 1, 37, 9, 3, 16, 0.0f},  // SmolLM-135M's grouping, several key blocks
    {"kv2_of_6_HS_odd", 1, 11, 6, 2, 5, 0.0f}, {"kv_all", 2, 13, 4, 4, 8, 0.0f},
    {"kv2_dropout", 2, 19, 4, 2, 6, 0.2f},     {"kv1_HS_max", 1, 35, 2, 1, 128, 0.1f},
};

// Outputs are convex combinations of v (|v| <= 1); gradients are O(1). 16-bit: the reference sees
// the rounded qkv, the kernel rounds each output once.
inline constexpr DTypeTols kAttentionTols{{2e-5, 1e-4}, {2e-3, 4e-3}, {1.5e-2, 2e-2}};

}  // namespace dstrain::test
