// Softmax cross-entropy's row loops for one ISA (ops/cpu/softmax_cross_entropy_isa.h; this file is
// compiled once per ISA).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/softmax_cross_entropy_isa.h"
#include "ops/cpu/isa_target.h"

DSTRAIN_ISA_BEGIN
namespace dstrain::cpu::DSTRAIN_ISA_NS {
namespace {

constexpr std::int64_t kChunk = 512;  // a multiple of kLanes
constexpr int kLanes = 16;

// Σ exp(x[v] − m) over n elements, lane v mod 16, the lanes added pairwise.
template <typename T>
float sum_exp(const T* __restrict x, std::int64_t n, float m) {
  float lane[kLanes] = {};
  std::int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lane[l] += cpu::fast_exp(cpu::load(x[v + l]) - m);
  }
  for (int l = 0; v < n; ++v, ++l) lane[l] += cpu::fast_exp(cpu::load(x[v]) - m);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int l = 0; l < width; ++l) lane[l] += lane[l + width];
  return lane[0];
}

template <typename T>
float row_lse(const T* __restrict x, std::int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
  double sum = 0.0;
  for (std::int64_t v0 = 0; v0 < V; v0 += kChunk) {
    const std::int64_t n = std::min(kChunk, V - v0);
    float cm = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : cm)
    for (std::int64_t v = 0; v < n; ++v) cm = std::max(cm, cpu::load(x[v0 + v]));
    if (cm > m) {
      sum *= std::exp(static_cast<double>(m) - static_cast<double>(cm));  // 0 when m = -inf
      m = cm;
    }
    sum += static_cast<double>(sum_exp(x + v0, n, m));
  }
  return m + static_cast<float>(std::log(sum));
}

template <typename T>
void row_backward(T* d, const T* x, std::int64_t V, std::int64_t Vp, std::int32_t t, float l, float dloss) {
  if (t < 0) {
    for (std::int64_t v = 0; v < Vp; ++v) d[v] = cpu::store<T>(0.0f);
    return;
  }
  const float xt = cpu::load(x[t]);  // read before the row is overwritten
  // d may alias x element for element: each iteration reads x[v] before writing d[v].
#pragma omp simd
  for (std::int64_t v = 0; v < V; ++v) d[v] = cpu::store<T>(cpu::fast_exp(cpu::load(x[v]) - l) * dloss);
  for (std::int64_t v = V; v < Vp; ++v) d[v] = cpu::store<T>(0.0f);
  d[t] = cpu::store<T>((cpu::fast_exp(xt - l) - 1.0f) * dloss);  // the one-hot term, rounded once
}

}  // namespace

float ce_row_lse(DType dtype, const void* row, std::int64_t V) {
  switch (dtype) {
    case DType::fp32:
      return row_lse(static_cast<const float*>(row), V);
    case DType::bf16:
      return row_lse(static_cast<const bf16_t*>(row), V);
    case DType::fp16:
      return row_lse(static_cast<const fp16_t*>(row), V);
    default:
      return 0.0f;  // not a storage dtype: the kernel refused it (require_floating)
  }
}

void ce_row_backward(DType dtype, void* drow, const void* row, std::int64_t V, std::int64_t Vp, std::int32_t target, float lse, float dloss) {
  switch (dtype) {
    case DType::fp32:
      return row_backward(static_cast<float*>(drow), static_cast<const float*>(row), V, Vp, target, lse, dloss);
    case DType::bf16:
      return row_backward(static_cast<bf16_t*>(drow), static_cast<const bf16_t*>(row), V, Vp, target, lse, dloss);
    case DType::fp16:
      return row_backward(static_cast<fp16_t*>(drow), static_cast<const fp16_t*>(row), V, Vp, target, lse, dloss);
    default:
      return;  // not a storage dtype: the kernel refused it (require_same_dtype)
  }
}

}  // namespace dstrain::cpu::DSTRAIN_ISA_NS
DSTRAIN_ISA_END
