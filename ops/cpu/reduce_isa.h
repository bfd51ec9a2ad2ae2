// Two reductions over gradients, per ISA (ops/cpu/isa_target.h); private to ops/cpu.
// Why per ISA: both accumulate in double, which the baseline build runs 2 wide and AVX-512 8 wide
// (bf16 GPT-2 d12: the gradient norm and the bias gradients' column sums were ~4% of a step).
// Both keep a fixed order — element i of a range in lane i mod 8, a column's rows in order — so
// every ISA gives the same bits.
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"

namespace dstrain::cpu {

// Over g[begin, end) of `dtype`: *norm_sq = Σ g², *nonfinite = how many are inf or NaN; 8 double
// lanes (element i in lane (i − begin) mod 8), the lanes added in order at the end.
DSTRAIN_DECLARE_ISA_VARIANTS(void sum_squares_range(DType dtype, const void* g, std::int64_t begin, std::int64_t end, double* norm_sq,
                                                    double* nonfinite))
// acc[c] += Σ_{r < rows} x[r · stride + c] for c < cols (cols <= 64), the rows in order.
DSTRAIN_DECLARE_ISA_VARIANTS(void column_sums_range(DType dtype, double* acc, const void* x, std::int64_t rows, std::int64_t stride,
                                                    std::int64_t cols))

}  // namespace dstrain::cpu
