// The CUDA backend of ops/kernels/*.h. Not called directly: every ops/kernels entry point
// (ops/cpu/<op>.cpp) checks its arguments once, for both backends, and then calls the function
// of the same name here when its tensors are on a cuda device (ops/cpu/backend_dispatch.h).
// Same signatures and semantics as the headers in ops/kernels/; the arguments are already checked
// (shapes, dtypes, one device for all tensors). Work is queued on the legacy default stream of
// the tensors' device; functions returning a host value (the cross-entropy mean) or validating
// index data (tokens, targets: copied to the host and checked as on the CPU) synchronise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/kernels/adamw.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/encoder.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/lamb.h"
#include "ops/kernels/moe.h"
#include "ops/kernels/newton_schulz.h"
#include "ops/kernels/optimizer_rule.h"
#include "ops/kernels/quantize.h"
#include "ops/kernels/sgd.h"
#include "ops/tensor.h"

namespace dstrain::cuda {

void encoder_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, VocabShard shard);
void encoder_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor scratch, VocabShard shard);

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps);
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor mean, Tensor rstd);
void fused_residual_layernorm_forward(Tensor residual, Tensor out, Tensor mean, Tensor rstd, Tensor a, Tensor b, Tensor weight, Tensor bias,
                                      float eps);

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);
void fused_residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, float eps);
void rmsnorm_shard_sum_squares(Tensor sums, Tensor inp);
void rmsnorm_shard_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, Tensor sums, std::int64_t n, float eps);
void rmsnorm_shard_backward_dot(Tensor dots, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);
void rmsnorm_shard_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, Tensor dots, std::int64_t n);
void head_rmsnorm_forward(Tensor x, Tensor rstd, Tensor weight, std::int64_t head0, std::int64_t nheads, float eps);
void head_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor inp, Tensor weight, Tensor rstd, std::int64_t head0, std::int64_t nheads);

void swiglu_forward(Tensor out, Tensor gate, Tensor up);
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);

// Mixture of experts (moe.cu): routing and the aux statistics bit for bit as the CPU's up to the
// device's double exp (within an ulp of glibc's); the plan bit for bit. moe_dispatch_plan
// synchronises (a device flag read back: expert ids outside [0, E) are the CPU's Error); the other
// kernels take the index data as given, skipping an index out of range rather than checking it.
void moe_route_forward(Tensor scores, Tensor expert, Tensor weight, Tensor logits, const MoeRouting& r);
void moe_route_backward(Tensor dlogits, Tensor dweight, Tensor scores, Tensor expert, Tensor weight, Tensor logits, Tensor aux_grad,
                        const MoeRouting& r);
void moe_aux_stats(Tensor assigned, Tensor prob_sum, Tensor logits, std::int64_t top_k);
void moe_dispatch_plan(Tensor slot_assignment, Tensor slot_of, Tensor counts, Tensor expert, std::int64_t capacity);
void moe_gather_rows(Tensor rows, Tensor x, Tensor slot_assignment, std::int64_t k, std::int64_t slots);
void moe_combine(Tensor out, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k);
void moe_combine_backward(Tensor drows, Tensor dweight, Tensor dout, Tensor rows, Tensor slot_of, Tensor weight, std::int64_t k);
void moe_gated_add_forward(Tensor out, Tensor y, Tensor logit);
void moe_gated_add_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor logit);

void rope_forward(Tensor out, Tensor inp, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset);
void rope_backward(Tensor dinp, Tensor dout, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset);

void gelu_forward(Tensor out, Tensor inp);
void gelu_backward(Tensor dinp, Tensor inp, Tensor dout);

void dropout_forward(Tensor out, Tensor inp, const DropoutParams& params);
void dropout_backward(Tensor dinp, Tensor dout, const DropoutParams& params);

float softmax_cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, std::int64_t V);
void softmax_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t V);
float softmax_cross_entropy_forward_backward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, float dloss, std::int64_t V);

// The vocabulary-parallel cross-entropy's phases (vocab_parallel_cross_entropy.cu); targets stay on
// the device (not validated, as on the CPU: < 0 is ignored, an id outside the shard adds nothing).
// vocab_parallel_losses synchronises: the mean comes from the losses and targets copied back.
void vocab_shard_max(Tensor rowmax, Tensor logits, std::int64_t valid);
void vocab_shard_sum_exp(Tensor stats, Tensor logits, Tensor rowmax, Tensor targets, std::int64_t first, std::int64_t valid);
float vocab_parallel_losses(Tensor losses, Tensor lse, Tensor rowmax, Tensor stats, Tensor targets);
void vocab_shard_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t first,
                                        std::int64_t valid);

// Flash-style (attention.cu): saves lse only. attention_backward uses the B*NH*T tail of the
// caller's scratch for D_i; dq accumulates in registers, so the B*T*C head of it stays unused.
// NKV KV heads (ops/kernels/attention.h's grouped layout), on the tensor-core kernels or attention.cu's.
void attention_forward(Tensor out, Tensor lse, Tensor qkv, std::int64_t NH, std::int64_t NKV, const DropoutParams& dropout);
void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, std::int64_t NH, std::int64_t NKV, Tensor scratch,
                        const DropoutParams& dropout);

// cuBLASLt (ops/cuda/cublaslt.h); the fp32 scratch of the CPU contract is accepted and unused.
void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, Tensor scratch);
void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor scratch);
// GELU in the cuBLASLt epilogue (GELU_AUX_BIAS forward, DGELU backward) where cuBLASLt offers it for
// the shape; otherwise the separate kernels, as the CPU composes them.
void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, Tensor scratch);
void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dy, Tensor out, Tensor pre, Tensor weight, Tensor dout_scratch,
                          Tensor scratch);

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWConfig& config);
// The ranges and the per-range norm partials go to a per-device buffer (allocated on first use,
// regrown for more ranges; the copy of the ranges synchronises with the host).
void lamb_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, std::span<const TensorRange> ranges, Tensor lamb_coeffs,
                 const LambConfig& config);
void newton_schulz(Tensor x, Tensor workspace, const NewtonSchulzConfig& config);
void sgd_update(Tensor params, Tensor grads, Tensor momentum_buffer, Tensor params_lowp, const SgdConfig& config);
void optimizer_rule_update(const RuleStep& step, Tensor params, Tensor grads, std::span<const Tensor> states, Tensor params_lowp);

// A fixed-size grid (the same bits on every run and GPU; not the CPU's block order, so equal to
// it within the double rounding of a reordered sum); synchronises to return the host value. The
// block partials live in a 16 KiB device buffer per device, allocated on first use.
GradNormOverflow grad_norm_overflow(Tensor grads);
void scale_grads(Tensor grads, float factor);

// Block quantization (quantize.cu): the CPU's bits (packed words compare equal; a non-finite
// block's dequantized NaNs may carry another payload). Words shared by two blocks are ORed into
// with atomicOr, which is order-free: deterministic.
void quantize_blocks(Tensor packed, Tensor x, int bits, std::int64_t block);
void dequantize_blocks(Tensor out, Tensor packed, int bits, std::int64_t block, bool accumulate);

// ops/kernels/tensor_ops.h. copy_tensor: one side may be host memory (cudaMemcpy, cudaMemcpyDefault).
void zero_tensor(Tensor t);
void copy_tensor(Tensor dst, Tensor src);
void copy_rows(Tensor dst, std::int64_t dst_offset, std::int64_t dst_pitch, Tensor src, std::int64_t src_offset, std::int64_t src_pitch,
               std::int64_t rows, std::int64_t width);
void convert_tensor(Tensor dst, Tensor src);
void residual_forward(Tensor out, Tensor a, Tensor b);

}  // namespace dstrain::cuda
