// The element-wise update rules of the optimizers other than Adam/AdamW, SGD and Lamb
// (docs/optimizers.md): DeepSpeed's Adagrad and Lion, and the torch.optim classes DeepSpeed falls
// back to (RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop). Each rule's header
// (ops/kernels/<rule>.h) states its formula, turns its constructor parameters and the step t into
// one call's RuleStep (on the host, in double, rounded to fp32 once), and defines the per-element
// math, shared by the CPU loops (ops/cpu/optimizer_rule_isa.cpp, one variant per ISA) and the CUDA
// kernel (ops/cuda/optimizer_rule.cu), which therefore round alike.
//
// Every rule first forms the gradient as torch does, per element, in fp32:
//   g = grad * grad_scale                   (grad_scale < 0 for maximize: torch negates grad first)
//   g = g + weight_decay * θ                (coupled L2: RuleStep::decoupled false)
//   θ = θ * decay                           (decoupled: decay = 1 − lr·weight_decay, Lion, NAdam/RAdam
//                                            with decoupled_weight_decay)
// then applies its own update to θ and its states, and writes the optional 16-bit copy of θ
// (round to nearest even).
#pragma once

#include <cstdint>
#include <span>

#include "ops/kernels/optimizer_rule_step.h"
#include "ops/tensor.h"

namespace dstrain {

//   params:      fp32 master parameters, any shape (flat buffers are 1-D), updated in place
//   grads:       fp32 / fp16 / bf16, the same number of elements
//   states:      exactly optimizer_rule_state_count(step) fp32 tensors of the same number of elements,
//                in the rule's order (its header), updated in place; all zero before step 1
//   params_lowp: fp16 / bf16 copy written from the updated params, or an empty Tensor
// Scratch: none. Deterministic: element-wise, no reduction.
void optimizer_rule_update(const RuleStep& step, Tensor params, Tensor grads, std::span<const Tensor> states, Tensor params_lowp);

}  // namespace dstrain
