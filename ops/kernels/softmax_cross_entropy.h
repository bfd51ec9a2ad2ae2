// Fused softmax + cross-entropy over the (padded) vocabulary, as llm.c's fused_classifier: the
// probabilities are never stored. The forward pass computes each row's max and sum in one pass
// (online rescaling) and keeps only lse = log sum exp (one fp32 per position); the backward pass
// recomputes softmax on the fly from lse and writes dlogits, which may overwrite the logits.
//
// Padding: logits are (BT, Vp) with the real vocabulary V <= Vp in the first V columns (GPT-2:
// V = 50257, Vp = 50304); columns V.. Vp-1 never contribute and get zero gradient.
// Ignored positions: a target of -1 contributes no loss and gets an all-zero dlogits row.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// losses[i] = lse_i - logits[i, targets[i]] (0 for ignored positions); returns the mean over the
// non-ignored positions (0 if all are ignored), summed in double in position order.
//   logits:  (BT, Vp) or (B, T, Vp), storage dtype S (fp32 / fp16 / bf16)
//   targets: (BT) or (B, T) int32, each -1 or in [0, V)
//   losses:  (BT) / (B, T) fp32;  lse: (BT) / (B, T) fp32 (saved for backward)
// Scratch: none.
float softmax_cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, std::int64_t V);

// dlogits[i, v] = (softmax(logits[i])[v] - [v == targets[i]]) * dloss for v < V,
//                 0 for v >= V and for ignored rows.
//   dlogits: the shape and dtype of logits; may be the same memory as logits (in place).
//   dloss: d(total loss)/d(losses[i]), e.g. 1 / (number of non-ignored positions).
// Scratch: none.
void softmax_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t V);

// Forward and backward in one pass over the logits (llm.c's fused classifier), for training, where
// dloss is known before the loss: the forward's losses, lse and mean, and the logits OVERWRITTEN
// with dlogits as softmax_cross_entropy_backward writes them. The CPU composes the two ops (the
// same results); the GPU reads each row once from memory (online max and sum), then again from
// cache as it writes the gradient, instead of three times.
float softmax_cross_entropy_forward_backward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, float dloss, std::int64_t V);

}  // namespace dstrain
