// GELU's element loops (tanh approximation), per ISA (ops/cpu/isa_target.h); private to ops/cpu.
// Why per ISA: the loops are compute-bound (an exp and a division per element) and the baseline
// build vectorises them 4 wide; AVX-512 runs 16 (bf16 GPT-2 d12: GELU was 7% of a step).
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"

namespace dstrain::cpu {

// out[i] = gelu(inp[i]) for i in [begin, end); out may alias inp.
DSTRAIN_DECLARE_ISA_VARIANTS(void gelu_forward_range(DType dtype, void* out, const void* inp, std::int64_t begin, std::int64_t end))
// dinp[i] += gelu'(inp[i]) * dout[i] for i in [begin, end).
DSTRAIN_DECLARE_ISA_VARIANTS(void gelu_backward_range(DType dtype, void* dinp, const void* inp, const void* dout, std::int64_t begin,
                                                      std::int64_t end))

}  // namespace dstrain::cpu
