// Global gradient norm and the clipping coefficient (docs/precision.md §7).
//
// DeepSpeed clips to a max global L2 norm c: g *= c / (‖g‖ + 1e-6) when that factor is < 1, and
// reports the norm from before clipping. The engine folds the factor into the optimizer's
// grad_scale, so clipping costs no pass of its own.
#pragma once

#include <span>

#include "ops/tensor.h"

namespace dstrain {

// sqrt(Σ g²) over every element of `grads` (fp32 / fp16 / bf16), accumulated in double by the
// fused grad_norm_overflow kernel (ops/kernels/grad_norm_overflow.h): the same bits for any
// thread count. Non-finite elements make the norm inf / NaN.
double global_grad_norm(std::span<const Tensor> grads);

// c / (norm + 1e-6) when clipping is on (c > 0) and that is < 1; otherwise 1.
float clip_coefficient(double norm, double max_norm);

}  // namespace dstrain
