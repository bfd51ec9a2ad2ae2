// Fused LAMB step with DeepSpeed FusedLamb semantics (deepspeed/ops/lamb/fused_lamb.py and
// csrc/lamb/fused_lamb_cuda_kernel.cu, adapted from NVIDIA apex; LAMB paper arXiv:1904.00962),
// one trust ratio per parameter TENSOR. For each tensor range R of the flat buffer, elementwise:
//   g = grad * grad_scale          (DeepSpeed: grad / combined_scale, the un-scale + clip divisor)
//   m = β1 m + (1 - β1) g
//   v = β2 v + (1 - β2) g²
//   d = eps_inside_sqrt ? sqrt(v + eps) : sqrt(v) + eps       (no bias correction inside: as DS)
//   u = m / d + weight_decay * θ    (θ before this step)
// then over R:
//   w_norm = ||θ||₂,  u_norm = ||u||₂                          (θ before this step)
//   coeff  = 1;  if w_norm != 0 and u_norm != 0: coeff = w_norm / u_norm, then
//            coeff = min(coeff, max_coeff), then coeff = max(coeff, min_coeff)   (in that order)
//   step_size = bias_correction ? lr * sqrt(1 - β2^t) / (1 - β1^t) : lr
//   θ = θ - step_size * coeff * u
// and an optional 16-bit copy of the updated θ (round to nearest even). The bias correction sits
// in step_size only, so eps and the weight-decay term are scaled by it too, exactly as DeepSpeed.
//
// Differences from DeepSpeed's CUDA kernel, all below fp32 rounding of the result: the two norms
// are summed in double over fixed blocks (DS: fp32 tree), and the gradient is multiplied by
// grad_scale instead of divided by its inverse.
//
// DeepSpeed requires dynamic loss scaling with Lamb under fp16 (checked by the engine, not here)
// and Lamb is not on ZeRO's optimizer whitelist: ranges must be whole tensors on this rank (a
// tensor split across ranks would need its two norms all-reduced first).
#pragma once

#include <cstdint>
#include <span>

#include "ops/tensor.h"

namespace dstrain {

struct LambConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;  // DeepSpeed's eps_mode 0 (false = mode 1, the default)
  std::int64_t step = 1;         // t >= 1: the step being taken, for bias correction
  float grad_scale = 1.0f;       // multiplies the gradient before use (1/divisor)
};

// One parameter tensor inside the flat buffers: elements [offset, offset + numel).
struct TensorRange {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

//   params:      fp32 master parameters, 1-D flat buffer (any shape: indexed flat), updated in place
//   grads:       fp32 / fp16 / bf16, the same number of elements
//   m, v:        fp32, the same number of elements, updated in place
//   params_lowp: fp16 / bf16 copy written from the updated params, or an empty Tensor
//   ranges:      the tensors, in increasing offset order, not overlapping, inside the buffer;
//                elements outside every range (alignment padding) are left untouched
//   lamb_coeffs: fp32 [ranges.size()] receiving each tensor's clamped trust ratio (DeepSpeed's
//                get_lamb_coeffs), or an empty Tensor
// Scratch: none.
void lamb_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, std::span<const TensorRange> ranges, Tensor lamb_coeffs,
                 const LambConfig& config);

}  // namespace dstrain
