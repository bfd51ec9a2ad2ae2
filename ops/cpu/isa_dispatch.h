// Calling the per-ISA element loops (ops/cpu/isa_target.h) from a kernel's entry point:
//
//   // ops/cpu/adamw_isa.h: the loop's signature, declared for the three ISAs
//   DSTRAIN_DECLARE_ISA_VARIANTS(void adamw_range(const AdamWArgs& a, std::int64_t begin, std::int64_t end))
//   // ops/cpu/adamw.cpp: the ISA chosen at run time, the elements split over the threads
//   const auto range = isa_select(scalar::adamw_range, avx2::adamw_range, avx512::adamw_range);
//   for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(args, b, e); });
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

#include "ops/cpu/cpu_common.h"
#include "ops/kernels/cpu_isa.h"

#define DSTRAIN_DECLARE_ISA_VARIANTS(signature) \
  namespace scalar {                            \
  signature;                                    \
  }                                             \
  namespace avx2 {                              \
  signature;                                    \
  }                                             \
  namespace avx512 {                            \
  signature;                                    \
  }

namespace dstrain::cpu {

// The variant for cpu_isa().
template <typename Fn>
Fn* isa_select(Fn* scalar_fn, Fn* avx2_fn, Fn* avx512_fn) {
  switch (cpu_isa()) {
    case CpuIsa::avx512:
      return avx512_fn;
    case CpuIsa::avx2:
      return avx2_fn;
    case CpuIsa::scalar:
      break;
  }
  return scalar_fn;
}

// fn(begin, end) over [0, n) in one contiguous block per OpenMP thread (serial below
// parallel_worth), block starts aligned to 64 elements. For element-wise updates, whose result
// does not depend on the split.
template <typename Fn>
void for_each_block(std::int64_t n, Fn&& fn) {
  if (!parallel_worth(n)) {
    if (n > 0) fn(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const auto threads = static_cast<std::int64_t>(omp_get_num_threads());
    const auto t = static_cast<std::int64_t>(omp_get_thread_num());
    const std::int64_t per = ((n + threads - 1) / threads + 63) / 64 * 64;
    const std::int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) fn(lo, hi);
  }
}

}  // namespace dstrain::cpu
