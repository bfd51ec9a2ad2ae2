// Gradient reductions for one ISA (ops/cpu/reduce_isa.h; this file is compiled once per ISA).
#include <bit>
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/reduce_isa.h"
#include "ops/cpu/isa_target.h"

DSTRAIN_ISA_BEGIN
namespace dstrain::cpu::DSTRAIN_ISA_NS {
namespace {

constexpr int kLanes = 8;

// inf or NaN: all exponent bits set. Branch-free so the loop vectorises.
inline double nonfinite_bit(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0; }

template <typename G>
void sum_squares(const G* __restrict g, std::int64_t begin, std::int64_t end, double* norm_sq, double* nonfinite) {
  double sq[kLanes] = {}, nf[kLanes] = {};
  std::int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
#pragma omp simd
    for (int k = 0; k < kLanes; ++k) {
      const float x = cpu::load(g[i + k]);
      const double d = static_cast<double>(x);
      sq[k] += d * d;
      nf[k] += nonfinite_bit(x);
    }
  }
  for (int k = 0; i < end; ++i, ++k) {
    const float x = cpu::load(g[i]);
    const double d = static_cast<double>(x);
    sq[k] += d * d;
    nf[k] += nonfinite_bit(x);
  }
  double s = 0.0, n = 0.0;
  for (int k = 0; k < kLanes; ++k) {
    s += sq[k];
    n += nf[k];
  }
  *norm_sq = s;
  *nonfinite = n;
}

template <typename T>
void column_sums(double* __restrict acc, const T* __restrict x, std::int64_t rows, std::int64_t stride, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* __restrict row = x + r * stride;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c) acc[c] += static_cast<double>(cpu::load(row[c]));
  }
}

}  // namespace

void sum_squares_range(DType dtype, const void* g, std::int64_t begin, std::int64_t end, double* norm_sq, double* nonfinite) {
  switch (dtype) {
    case DType::fp32:
      return sum_squares(static_cast<const float*>(g), begin, end, norm_sq, nonfinite);
    case DType::bf16:
      return sum_squares(static_cast<const bf16_t*>(g), begin, end, norm_sq, nonfinite);
    case DType::fp16:
      return sum_squares(static_cast<const fp16_t*>(g), begin, end, norm_sq, nonfinite);
    default:
      *norm_sq = *nonfinite = 0.0;  // not a storage dtype: the kernel refused it (require_floating)
      return;
  }
}

void column_sums_range(DType dtype, double* acc, const void* x, std::int64_t rows, std::int64_t stride, std::int64_t cols) {
  switch (dtype) {
    case DType::fp32:
      return column_sums(acc, static_cast<const float*>(x), rows, stride, cols);
    case DType::bf16:
      return column_sums(acc, static_cast<const bf16_t*>(x), rows, stride, cols);
    case DType::fp16:
      return column_sums(acc, static_cast<const fp16_t*>(x), rows, stride, cols);
    default:
      return;  // not a storage dtype: the kernel refused it
  }
}

}  // namespace dstrain::cpu::DSTRAIN_ISA_NS
DSTRAIN_ISA_END
