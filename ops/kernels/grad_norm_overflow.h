// The fused gradient check of the optimizer step: one pass over a flat gradient buffer giving
// the sum of squares (for the global L2 norm) and the count of inf/NaN elements (the fp16 / bf16
// overflow flag), designed so that the results of all partitions combine with ONE all-reduce SUM
// of two doubles (docs/precision.md §6; DeepSpeed needs two collectives, an overflow MAX and a norm SUM).
//
//   norm_sq   = Σ_i g_i²      each g_i widened to fp32 (exact), squared and summed in double
//   nonfinite = #{i : g_i is ±inf or NaN}
//
// Why double: the square of any finite fp32 value is exact in double and cannot overflow it
// (max 2^256 < DBL_MAX), so a finite gradient never reads as an overflow through its norm, and the
// sum keeps ~2^-53 relative error per addition where fp32 (even Kahan) would lose the small tail
// of a 10^9-element buffer. When nonfinite > 0, norm_sq is inf/NaN and meaningless: the step is
// skipped (fp16) or the norm is reported as -1, as DeepSpeed does.
//
// Determinism: the buffer is cut into blocks whose boundaries depend only on n (never on the
// thread count); each block is summed with 8 interleaved accumulators in a fixed order and the
// block sums are added in block order. Same bits for any number of threads.
#pragma once

#include <cmath>

#include "ops/tensor.h"

namespace dstrain {

// Per-partition result. Both fields add under an all-reduce SUM (send it as double[2]).
struct GradNormOverflow {
  double norm_sq = 0.0;
  double nonfinite = 0.0;  // a count, exact up to 2^53 elements

  bool overflow() const { return nonfinite != 0.0; }
  double norm() const { return std::sqrt(norm_sq); }
  GradNormOverflow& operator+=(const GradNormOverflow& o) {
    norm_sq += o.norm_sq;
    nonfinite += o.nonfinite;
    return *this;
  }
};

//   grads: fp32 / fp16 / bf16, any shape (a flat partition is 1-D); may be empty-shaped (n = 0)
// Scratch: none (the block partials live on the stack).
GradNormOverflow grad_norm_overflow(Tensor grads);

// The divisor DeepSpeed un-scales and clips with (docs/precision.md §7): with the
// norm of the SCALED gradients N_s = sqrt(norm_sq), the loss scale S and gradient_clipping c:
//   clip = (N_s / S + 1e-6) / c;  divisor = clip * S  if c > 0 and clip > 1,  else S.
// Pass grad_scale = 1 / divisor to the optimizer kernels (adamw / sgd / lamb), which fold the
// un-scaling and clipping into their single pass. (DeepSpeed divides by the divisor; multiplying
// by its fp32 reciprocal differs by at most 1 ulp per gradient.)
inline double unscale_clip_divisor(double norm_sq_scaled, double loss_scale, double clip) {
  double divisor = loss_scale;
  if (clip > 0.0) {
    const double c = (std::sqrt(norm_sq_scaled) / loss_scale + 1e-6) / clip;
    if (c > 1.0) divisor = c * loss_scale;
  }
  return divisor;
}

// grads *= factor in place (for paths that need the gradients themselves un-scaled, e.g. before
// a per-tensor norm; the optimizer kernels do not). 16-bit grads are rounded once (RNE).
void scale_grads(Tensor grads, float factor);

}  // namespace dstrain
