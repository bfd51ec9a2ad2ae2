// Fused AdamW step over a flat buffer (torch.optim.AdamW semantics, decoupled weight decay):
//   g  = grad * grad_scale                 (unscale / clip folded in: no separate pass)
//   θ  = θ - lr * weight_decay * θ
//   m  = β1 m + (1 - β1) g
//   v  = β2 v + (1 - β2) g²
//   θ  = θ - lr * (m / (1 - β1^t)) / (sqrt(v / (1 - β2^t)) + eps)
// and, in the same pass, an optional 16-bit copy of the updated θ (round to nearest even, or
// stochastic rounding for bf16), the parameters the forward pass of the next step reads.
//
// With decoupled_weight_decay = false it is Adam with coupled L2 weight decay (torch.optim.Adam,
// and DeepSpeed's FusedAdam with adam_w_mode false, multi_tensor_adam.cu ADAM_MODE_0):
//   g  = grad * grad_scale + weight_decay * θ      (no separate decay of θ)
// followed by the same m, v and θ updates. bias_correction = false (FusedAdam's option) uses
// 1 in place of (1 - β1^t) and (1 - β2^t).
#pragma once

#include <cstdint>

#include "ops/kernels/philox.h"
#include "ops/tensor.h"

namespace dstrain {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;               // t >= 1: the step being taken, for bias correction
  float grad_scale = 1.0f;             // multiplies the gradient before use (1/loss_scale, clip factor)
  bool decoupled_weight_decay = true;  // false: Adam with L2 (DeepSpeed "Adam" + adam_w_mode false)
  bool bias_correction = true;
  // A bf16 params_lowp rounded stochastically (ops/kernels/stochastic_round.h) instead of to
  // nearest: element i uses rounding_key.element_bits(rounding_offset + i), so the same key and
  // offsets give the same bits on the CPU and the GPU, and a caller that numbers elements by their
  // place in the model (not in a rank's partition) gets the same rounding for any ZeRO split.
  // fp16 copies, inf and NaN round to nearest even as without it.
  bool stochastic_rounding = false;
  RngKey rounding_key{};
  std::int64_t rounding_offset = 0;
};

//   params: fp32 master parameters, any shape (flat buffers are 1-D), updated in place
//   grads:  fp32 / fp16 / bf16, the same number of elements
//   m, v:   fp32, the same number of elements, updated in place
//   params_lowp: fp16 / bf16 copy written from the updated params, or an empty Tensor
// Scratch: none.
void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWConfig& config);

}  // namespace dstrain
