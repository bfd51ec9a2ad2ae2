// SwiGLU's element loops, per ISA (ops/cpu/isa_target.h); private to ops/cpu. Compute-bound as
// GELU's (an exp and a division per element), so compiled per ISA as gelu_isa.h is.
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"

namespace dstrain::cpu {

// out[i] = silu(gate[i]) * up[i] for i in [begin, end); out may alias gate or up.
DSTRAIN_DECLARE_ISA_VARIANTS(void swiglu_forward_range(DType dtype, void* out, const void* gate, const void* up, std::int64_t begin,
                                                       std::int64_t end))
// dgate[i] += d(out)/d(gate)·dout[i], dup[i] += d(out)/d(up)·dout[i] for i in [begin, end).
DSTRAIN_DECLARE_ISA_VARIANTS(void swiglu_backward_range(DType dtype, void* dgate, void* dup, const void* dout, const void* gate, const void* up,
                                                        std::int64_t begin, std::int64_t end))

}  // namespace dstrain::cpu
