// Case tables for the mixture-of-experts kernels (ops/kernels/moe.h), shared with the CUDA tests in
// tests/gpu/: routing settings, plans, the token-movement shapes, per-dtype tolerances, and the
// input generators (logits with exact ties, expert choices, int32 / fp64 buffers).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "ops/kernels/moe.h"

namespace dstrain::test {

struct MoeRouteCase {
  const char* name;
  std::int64_t N, E;
  MoeRouting r;
  bool aux;  // moe_route_backward with an aux_grad
};
inline constexpr MoeRouteCase kMoeRouteCases[] = {
    {"softmax_top2_renorm", 37, 8, {.top_k = 2}, true},
    {"softmax_top1_raw", 29, 8, {.top_k = 1, .renormalize = false}, false},
    {"softmax_top1_renorm", 11, 6, {.top_k = 1}, true},
    {"softmax_top3_renorm_scaled", 23, 16, {.top_k = 3, .scale = 2.5f}, false},
    {"softmax_top3_raw_scaled", 23, 16, {.top_k = 3, .renormalize = false, .scale = 1.75f}, true},
    {"sigmoid_top2_renorm", 31, 8, {.top_k = 2, .sigmoid = true}, false},
    {"sigmoid_top1_raw", 17, 8, {.top_k = 1, .sigmoid = true, .renormalize = false}, true},
    {"sigmoid_top3_renorm_scaled", 19, 12, {.top_k = 3, .sigmoid = true, .scale = 2.5f}, true},
    // Group-limited: 4 groups, 2 eligible per token (DeepSeek-V2 with softmax, V3 with sigmoid).
    {"group_softmax_top3", 41, 16, {.top_k = 3, .n_group = 4, .topk_group = 2}, true},
    {"group_sigmoid_top3_scaled", 41, 16, {.top_k = 3, .sigmoid = true, .scale = 2.5f, .n_group = 4, .topk_group = 2}, false},
    {"group_sigmoid_top1_raw", 19, 32, {.top_k = 1, .sigmoid = true, .renormalize = false, .n_group = 4, .topk_group = 2}, true},
    {"group_softmax_top2_raw", 21, 8, {.top_k = 2, .renormalize = false, .n_group = 4, .topk_group = 2}, false},
    {"wide_softmax_top8", 9, 160, {.top_k = 8}, true},
};

// Routing outputs are fp32 roundings of double values: scores and weights to a few ulps, d(logits)
// against central differences of a double reference (see test_moe.cpp).
inline constexpr Tol kMoeRouteTol{1e-7, 1e-6};
inline constexpr Tol kMoeRouteGradTol{2e-6, 1e-4};
// moe_aux_stats: prob_sum is a double sum of N terms.
inline constexpr Tol kMoeProbSumTol{1e-12, 1e-12};

// Plans: `pattern` picks how the experts are chosen (see moe_plan_experts).
enum class MoePlanPattern { random, skewed, one_expert, gap };
struct MoePlanCase {
  const char* name;
  std::int64_t N, k, E, capacity;
  MoePlanPattern pattern;
};
inline constexpr MoePlanCase kMoePlanCases[] = {
    {"dropless", 40, 2, 6, -1, MoePlanPattern::random},
    {"dropless_top3", 33, 3, 8, -1, MoePlanPattern::random},
    {"capacity_skewed", 40, 2, 6, 9, MoePlanPattern::skewed},
    {"capacity_top1", 25, 1, 4, 5, MoePlanPattern::skewed},
    {"capacity_zero", 7, 2, 4, 0, MoePlanPattern::random},
    {"expert_without_tokens", 30, 2, 6, -1, MoePlanPattern::gap},
    {"expert_without_tokens_capacity", 30, 2, 6, 7, MoePlanPattern::gap},
    {"all_to_one", 12, 1, 5, -1, MoePlanPattern::one_expert},
    {"all_to_one_capacity", 12, 2, 5, 4, MoePlanPattern::one_expert},
    {"many_chunks", 1000, 2, 16, 100, MoePlanPattern::skewed},
    {"many_chunks_dropless", 777, 3, 64, -1, MoePlanPattern::random},
};

// Token movement: N tokens of width C, k choices among E experts, the plan's capacity.
struct MoeMoveCase {
  const char* name;
  std::int64_t N, C, k, E, capacity;
};
inline constexpr MoeMoveCase kMoeMoveCases[] = {
    {"one", 1, 1, 1, 1, -1},
    {"dropless", 13, 24, 2, 4, -1},
    {"dropping", 29, 37, 2, 4, 9},
    {"top3_wide", 11, 300, 3, 6, -1},
};
// One rounding of an fp32 sum (combine, gated add, d(rows)) to the storage dtype.
inline constexpr DTypeTols kMoeMoveTols{{1e-6, 1e-5}, {1e-3, 1e-3}, {8e-3, 8e-3}};
// d(weight), d(logit) of a gated add: a dot product in double rounded to fp32 (or to the storage dtype).
inline constexpr DTypeTols kMoeDotTols{{1e-5, 1e-5}, {1e-3, 1e-3}, {8e-3, 8e-3}};

// Random logits (N, E) in [-3, 3]; every third token copies some of its logits onto neighbours
// (exact ties) and token 1 is all equal, so the tie rule is exercised in every case.
inline std::vector<float> moe_logits(std::mt19937_64& rng, std::int64_t N, std::int64_t E) {
  std::uniform_real_distribution<double> d(-3, 3);
  std::vector<float> l(static_cast<std::size_t>(N * E));
  for (float& x : l) x = static_cast<float>(d(rng));
  for (std::int64_t t = 0; t < N; ++t) {
    float* row = l.data() + t * E;
    if (t == 1) {
      for (std::int64_t e = 0; e < E; ++e) row[e] = 0.5f;
    } else if (t % 3 == 0) {
      for (std::int64_t e = 1; e < E; e += 3) row[e] = row[e - 1];
      if (E >= 4) row[E - 1] = row[0];
    }
  }
  return l;
}

// Expert choices (N, k) for a plan. random: k distinct experts per token; skewed: experts 0 and 1
// take most first choices; one_expert: every choice is expert E / 2; gap: expert 2 never chosen.
inline std::vector<std::int32_t> moe_plan_experts(std::mt19937_64& rng, std::int64_t N, std::int64_t k, std::int64_t E, MoePlanPattern p) {
  std::vector<std::int32_t> ex(static_cast<std::size_t>(N * k));
  std::uniform_int_distribution<std::int64_t> d(0, E - 1);
  for (std::int64_t t = 0; t < N; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      std::int64_t e = 0;
      if (p == MoePlanPattern::one_expert) {
        e = E / 2;
      } else {
        bool again = true;
        while (again) {
          e = d(rng);
          if (p == MoePlanPattern::skewed && j == 0 && rng() % 4 != 0) e = static_cast<std::int64_t>(rng() % 2);
          if (p == MoePlanPattern::gap && e == 2) continue;
          again = false;
          for (std::int64_t i = 0; i < j; ++i) again = again || ex[static_cast<std::size_t>(t * k + i)] == e;
        }
      }
      ex[static_cast<std::size_t>(t * k + j)] = static_cast<std::int32_t>(e);
    }
  }
  return ex;
}

// Raw buffers of other dtypes (int32, fp64) in a Buf, for the kernels' index and statistics
// tensors (Buf's get/set are for floating storage; these copy the bytes).
template <typename T>
Buf raw_buf(DType t, const std::vector<T>& v) {
  Buf b(t, static_cast<std::int64_t>(v.size()));
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T>
std::vector<T> raw_values(Buf& b) {
  std::vector<T> v(static_cast<std::size_t>(b.size()));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}
inline Buf i32_buf(const std::vector<std::int32_t>& v) { return raw_buf(DType::int32, v); }
inline Buf f32_buf(const std::vector<float>& v) { return raw_buf(DType::fp32, v); }

}  // namespace dstrain::test
