// Private helpers of the layer implementations: argument count checks, dropout keys, the heads' loss.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "ops/error.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/tensor.h"
#include "models/layer.h"

namespace dstrain::layer_args {

inline void expect_count(const std::string& layer, const char* what, std::span<const Tensor> got, std::size_t want) {
  if (got.size() != want) {
    fail("layer '{}': {} has {} tensors but the layer declares {}; pass them in the order of the layer's specs", layer, what, got.size(), want);
  }
}

// The dropout of call site k of a layer: off when not training or p == 0.
inline DropoutParams dropout(float p, const RngKey& base, std::uint32_t k, bool train) {
  DropoutParams d;
  d.p = train ? p : 0.0f;
  d.rng = base;
  d.rng.site = base.site + k;
  return d;
}

// A head's loss: the mean cross-entropy of logits (B, T, Vp) over the non-ignored targets, so
// each position's loss has weight 1 / n. When training fuses the loss gradient
// (a.fuse_loss_grad), the logits become their gradient in the same pass and backward starts
// from them; otherwise head_loss_backward turns them into it.
inline float head_loss_forward(const ForwardArgs& a, Tensor lse, Tensor logits, std::int64_t vocab) {
  if (!a.fuse_loss_grad) return softmax_cross_entropy_forward(a.output, lse, logits, a.batch.targets, vocab);
  const std::int64_t n = count_targets(a.batch);
  const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
  return softmax_cross_entropy_forward_backward(a.output, lse, logits, a.batch.targets, dloss, vocab);
}

// logits -> d(loss)/d(logits) in place, unless the forward did it (a.loss_grad_done).
inline void head_loss_backward(const BackwardArgs& a, Tensor lse, Tensor logits, std::int64_t vocab) {
  if (a.loss_grad_done) return;
  const std::int64_t n = count_targets(a.batch);
  const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
  softmax_cross_entropy_backward(logits, logits, lse, a.batch.targets, dloss, vocab);
}

}  // namespace dstrain::layer_args
