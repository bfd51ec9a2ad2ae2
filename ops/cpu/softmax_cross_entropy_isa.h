// Softmax cross-entropy's row loops, per ISA (ops/cpu/isa_target.h); private to ops/cpu.
// Why per ISA: each logit costs an exp, and the LM head's logits are B·T·V (GPT-2 d12, B 4, T 256:
// 51M per pass, forward and backward); the baseline build runs the loops 4 wide, AVX-512 16.
// The sums keep 16 lanes in a fixed order (element v goes to lane v mod 16, lanes added pairwise at
// the end), so every ISA — and the scalar build — adds the same numbers in the same order: the loss
// does not depend on the machine's instruction set.
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"

namespace dstrain::cpu {

// log Σ_{v<V} exp(x[v]) of one row of `dtype` logits: a pass in chunks (chunk max, the running sum
// rescaled when the max grows, each chunk's sum of exp in fp32 added to a double total).
DSTRAIN_DECLARE_ISA_VARIANTS(float ce_row_lse(DType dtype, const void* row, std::int64_t V))
// One row's d(loss)/d(logits) · dloss: softmax(x) − onehot(target) for v < V, 0 on the padding
// [V, Vp). `drow` may equal `row` (each element is read before it is written). target < 0: zeros.
DSTRAIN_DECLARE_ISA_VARIANTS(void ce_row_backward(DType dtype, void* drow, const void* row, std::int64_t V, std::int64_t Vp,
                                                  std::int32_t target, float lse, float dloss))

}  // namespace dstrain::cpu
