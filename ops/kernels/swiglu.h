// SwiGLU, the gated MLP activation of Llama, Mistral and Qwen (`hidden_act: silu`):
// out = silu(gate) * up, with silu(x) = x * sigmoid(x), gate = x·W_gate^T and up = x·W_up^T.
#pragma once

#include "ops/tensor.h"

namespace dstrain {

// out = silu(gate) * up.   gate, up, out: same shape (e.g. (B, T, I)) and storage dtype.
// out may alias gate or up (elementwise). Scratch: none.
void swiglu_forward(Tensor out, Tensor gate, Tensor up);

// dgate += dout * up * silu'(gate), dup += dout * silu(gate), with
// silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x))).
//   dgate, dup, dout, gate, up: same shape and dtype. dgate and dup must not alias each other or
//   any input (they accumulate). Scratch: none.
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);

}  // namespace dstrain
