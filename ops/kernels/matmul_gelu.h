// The MLP's first linear layer and its GELU as one op, so the GPU can do the GELU in the GEMM's
// epilogue (cuBLASLt GELU_AUX_BIAS forward, DGELU backward) instead of separate passes over the
// (BT, 4C) activations: forward saves one read and one write of them, backward a zero fill, a
// read-modify-write and two reads. The CPU reference is the composition of matmul_forward /
// matmul_backward and gelu_forward / gelu_backward (ops/kernels/matmul.h, gelu.h), so the results
// on the CPU are exactly those of the separate ops.
#pragma once

#include "ops/tensor.h"

namespace dstrain {

// pre = inp · weightᵀ + bias;  out = gelu(pre)  (GELU, tanh approximation, as gelu_forward)
//   inp (BT, C), weight (OC, C), bias (OC) or empty, pre and out (BT, OC): storage dtype S.
//   scratch: fp32, >= matmul_scratch_elems(S, C) elements (may be empty for fp32).
// The GPU may compute out from the unrounded fp32 pre-activation (the epilogue's input), where the
// CPU rounds pre to S first: within the per-dtype tolerances of the kernel tests.
void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, Tensor scratch);

// The backward of `out = gelu(pre)` feeding a matmul `y = out · weightᵀ + bias`, given dy:
//   dweight += dyᵀ · out;  dbias += column sums of dy;  dpre = gelu'(pre) ⊙ (dy · weight)
// dpre is WRITTEN (not accumulated, unlike every other gradient): it is a fresh activation
// gradient. Shapes: dy (BT, OC), out and pre and dpre (BT, C), weight and dweight (OC, C),
// dbias (OC) or empty; storage dtype S.
//   dout_scratch: (BT, C) S, holds d(out) on backends that do not fuse it (the CPU); its contents
//   are undefined afterwards.  scratch: fp32, >= matmul_scratch_elems(S, C) elements.
void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dy, Tensor out, Tensor pre, Tensor weight, Tensor dout_scratch,
                          Tensor scratch);

}  // namespace dstrain
