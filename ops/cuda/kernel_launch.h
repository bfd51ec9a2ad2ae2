// Launchers of the CUDA kernels, defined in the .cu files and called by kernels.cpp after the
// ops/kernels/*.h entry points checked the arguments. Raw pointers, no Tensor: the .cu files cannot
// include fmt (ops/error.h). Each returns the launch status (cudaGetLastError) for
// DSTRAIN_CUDA_CHECK. Storage dtype `t` is fp32, fp16 or bf16; n, rows, C count elements.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/dtype.h"
#include "ops/kernels/optimizer_rule_step.h"
#include "ops/kernels/philox.h"

namespace dstrain::cuda_detail {

// newton_schulz.cu: X (n x m) from G (rows x cols; its transpose when tall), the inverse, the
// Frobenius normalisation (one block, double sum), dst = f·src.
cudaError_t launch_ns_load(const float* g, float* x, std::int64_t n, std::int64_t m, bool tall, cudaStream_t s);
cudaError_t launch_ns_store(float* g, const float* x, std::int64_t n, std::int64_t m, bool tall, cudaStream_t s);
cudaError_t launch_ns_normalise(float* x, std::int64_t total, float eps, cudaStream_t s);
cudaError_t launch_ns_scale(float* dst, const float* src, std::int64_t total, float f, cudaStream_t s);

// elementwise.cu
cudaError_t launch_gelu_forward(void* out, const void* inp, DType t, std::int64_t n, cudaStream_t s);
cudaError_t launch_gelu_backward(void* dinp, const void* inp, const void* dout, DType t, std::int64_t n, cudaStream_t s);
// accumulate = false: out = inp * mask * scale; true: out += inp * mask * scale. p == 0: no RNG.
cudaError_t launch_dropout(void* out, const void* inp, DType t, std::int64_t n, float p, const RngKey& key, bool accumulate, cudaStream_t s);
// first, V: the table holds rows [first, first + V) (a vocabulary shard; first = 0 for a whole table).
cudaError_t launch_encoder_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe, DType t, std::int64_t BT, std::int64_t T,
                                   std::int64_t C, std::int64_t first, std::int64_t V, cudaStream_t s);
// order (n_in) and start (V + 1) are the device copy of the host counting sort (encoder_backward)
// of the n_in positions whose token is in the table's rows.
cudaError_t launch_encoder_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens, const std::int32_t* order,
                                    const std::int32_t* start, DType t, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t first,
                                    std::int64_t n_in, cudaStream_t s);

// elementwise.cu: out = a + b in fp32, one rounding (out may alias a or b).
cudaError_t launch_residual_add(void* out, const void* a, const void* b, DType t, std::int64_t n, cudaStream_t s);

// The bf16 copy's stochastic rounding (AdamWConfig::stochastic_rounding): element i uses
// key.element_bits(offset + i) when `on`.
struct StochasticRounding {
  bool on = false;
  RngKey key{};
  std::int64_t offset = 0;
};

// optim.cu (compiled with -fmad=false: the same fp32 operations as the CPU, no contractions).
// bc1, bc2: the bias corrections computed on the host in double as the CPU does; lowp_t is
// fp16/bf16 for a 16-bit copy (lowp != nullptr).
cudaError_t launch_adamw(float* p, const void* g, DType gt, float* m, float* v, void* lowp, DType lowp_t, std::int64_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2, bool decoupled,
                         const StochasticRounding& sr, cudaStream_t s);

// Fixed grid of kNormBlocks blocks; partials: 2 * kNormBlocks doubles (device), see optim.cu.
inline constexpr unsigned kNormBlocks = 1024;
cudaError_t launch_grad_norm_partials(const void* g, DType t, std::int64_t n, double* partials, cudaStream_t s);
cudaError_t launch_scale(void* g, DType t, std::int64_t n, float factor, cudaStream_t s);
// damp = 1 - dampening; gs already negated for maximize (as ops/cpu/sgd.cpp).
cudaError_t launch_sgd(float* p, const void* g, DType gt, float* buf, void* lowp, DType lowp_t, std::int64_t n, float lr, float momentum, float damp,
                       float weight_decay, float gs, bool first, bool nesterov, cudaStream_t s);

// optimizer_rule.cu: the element-wise optimizer rules (ops/kernels/optimizer_rule.h); states:
// k.states fp32 device pointers.
cudaError_t launch_optimizer_rule(const RuleStep& k, float* p, const void* g, DType gt, float* const* states, void* lowp, DType lowp_t,
                                  std::int64_t n, cudaStream_t s);

// LAMB (DeepSpeed FusedLamb semantics, ops/cpu/lamb.cpp): ranges = nranges (offset, numel) int64
// pairs on the device; partials: 2 * kLambSlices * nranges doubles (device); coeffs: nranges
// fp32 on the device or null. Two kernels, no host synchronisation.
inline constexpr unsigned kLambSlices = 32;
cudaError_t launch_lamb(float* p, const void* g, DType gt, float* m, float* v, void* lowp, DType lowp_t, const std::int64_t* ranges,
                        std::int64_t nranges, double* partials, float* coeffs, float step_size, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, float max_coeff, float min_coeff, bool eps_inside_sqrt, cudaStream_t s);

// rows.cu. Column sums (LayerNorm's dweight/dbias, matmul's dbias) go through fixed partitions of
// kColumnRowsPerPart rows: each partition's sums (in double) land in `partials`, then one thread per
// column adds the partitions in order. The order depends only on the shape: deterministic.
inline constexpr std::int64_t kColumnRowsPerPart = 256;
// Bytes of `partials` for rows x C (room for two sums per column).
inline std::size_t column_partials_bytes(std::int64_t rows, std::int64_t C) {
  const std::int64_t parts = (rows + kColumnRowsPerPart - 1) / kColumnRowsPerPart;
  return static_cast<std::size_t>(2 * parts * C) * sizeof(double);
}
// swiglu.cu: out = silu(gate)·up (out may alias gate or up); the backward accumulates into dgate, dup.
cudaError_t launch_swiglu_forward(void* out, const void* gate, const void* up, DType t, std::int64_t n, cudaStream_t s);
cudaError_t launch_swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, DType t, std::int64_t n,
                                   cudaStream_t s);

// quantize.cu (ops/kernels/quantize.h): packed holds quantize_packed_words(n, bits, block) int32;
// bits 4 or 8. quantize zeroes the value words first when a block boundary can fall inside a word.
cudaError_t launch_quantize_blocks(std::int32_t* packed, const void* x, DType t, std::int64_t n, int bits, std::int64_t block, cudaStream_t s);
cudaError_t launch_dequantize_blocks(void* out, const std::int32_t* packed, DType t, std::int64_t n, int bits, std::int64_t block, bool accumulate,
                                     cudaStream_t s);

// rope.cu: x (B, T, H, D) rotated on heads [0, rotate_heads), the others copied (out may alias
// inp); transpose: the inverse rotation (rope_backward). inv_freq: D/2 fp32 on the device.
cudaError_t launch_rope(void* out, const void* inp, const float* inv_freq, DType t, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                        std::int64_t rotate_heads, std::int64_t pos_offset, bool transpose, cudaStream_t s);

// head_rmsnorm.cu: heads [head0, head0 + nheads) of (BT, H, D); forward in place, backward
// overwrites dx in place and accumulates dweight.
cudaError_t launch_head_rmsnorm_forward(void* x, float* rstd, const void* w, DType t, std::int64_t BT, std::int64_t H, std::int64_t D,
                                        std::int64_t head0, std::int64_t nheads, float eps, cudaStream_t st);
cudaError_t launch_head_rmsnorm_backward(void* dx, void* dweight, const void* inp, const void* w, const float* rstd, DType t, std::int64_t BT,
                                         std::int64_t H, std::int64_t D, std::int64_t head0, std::int64_t nheads, cudaStream_t st);
// rmsnorm.cu. partials: column_partials_bytes(rows, C) of device scratch (dweight's column sums).
cudaError_t launch_rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, DType t, std::int64_t rows, std::int64_t C, float eps,
                                   cudaStream_t s);
cudaError_t launch_fused_residual_rmsnorm_forward(void* residual, void* out, float* rstd, const void* a, const void* b, const void* w, DType t,
                                                  std::int64_t rows, std::int64_t C, float eps, cudaStream_t s);
cudaError_t launch_rmsnorm_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* w, const float* rstd, DType t,
                                    std::int64_t rows, std::int64_t C, double* partials, cudaStream_t s);
// A row cut across tensor-parallel ranks (ops/kernels/rmsnorm.h rmsnorm_shard_*): n is the whole row's width.
cudaError_t launch_rmsnorm_shard_sum_squares(float* sums, const void* inp, DType t, std::int64_t rows, std::int64_t C, cudaStream_t s);
cudaError_t launch_rmsnorm_shard_forward(void* out, float* rstd, const void* inp, const void* w, const float* sums, DType t, std::int64_t rows,
                                         std::int64_t C, std::int64_t n, float eps, cudaStream_t s);
cudaError_t launch_rmsnorm_shard_backward_dot(float* dots, const void* dout, const void* inp, const void* w, const float* rstd, DType t,
                                              std::int64_t rows, std::int64_t C, cudaStream_t s);
cudaError_t launch_rmsnorm_shard_backward(void* dinp, void* dweight, const void* dout, const void* inp, const void* w, const float* rstd,
                                          const float* dots, DType t, std::int64_t rows, std::int64_t C, std::int64_t n, double* partials,
                                          cudaStream_t s);
cudaError_t launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, DType t, std::int64_t rows,
                                     std::int64_t C, float eps, cudaStream_t s);
cudaError_t launch_fused_residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w,
                                                    const void* bias, DType t, std::int64_t rows, std::int64_t C, float eps, cudaStream_t s);
cudaError_t launch_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout, const void* inp, const void* w, const float* mean,
                                      const float* rstd, DType t, std::int64_t rows, std::int64_t C, double* partials, cudaStream_t s);
cudaError_t launch_softmax_ce_forward(float* losses, float* lse, const void* logits, const std::int32_t* targets, DType t, std::int64_t BT,
                                      std::int64_t V, std::int64_t Vp, cudaStream_t s);
cudaError_t launch_softmax_ce_backward(void* dlogits, const void* logits, const float* lse, const std::int32_t* targets, DType t, std::int64_t BT,
                                       std::int64_t V, std::int64_t Vp, float dloss, cudaStream_t s);
// Forward and backward in one kernel: losses, lse, and the logits overwritten with dlogits.
cudaError_t launch_softmax_ce_fused(float* losses, float* lse, void* logits, const std::int32_t* targets, DType t, std::int64_t BT, std::int64_t V,
                                    std::int64_t Vp, float dloss, cudaStream_t s);

// vocab_parallel_cross_entropy.cu: the rank's logits (BT, Vr), whose first `valid` columns are the
// real tokens [first, first + valid) of the whole vocabulary; targets whole-vocabulary ids or < 0
// (ignored); stats (BT, 2) fp32. dlogits may be logits (in place).
cudaError_t launch_vocab_shard_max(float* rowmax, const void* logits, DType t, std::int64_t BT, std::int64_t Vr, std::int64_t valid, cudaStream_t s);
cudaError_t launch_vocab_shard_sum_exp(float* stats, const void* logits, const float* rowmax, const std::int32_t* targets, DType t, std::int64_t BT,
                                       std::int64_t Vr, std::int64_t first, std::int64_t valid, cudaStream_t s);
cudaError_t launch_vocab_parallel_losses(float* losses, float* lse, const float* rowmax, const float* stats, const std::int32_t* targets,
                                         std::int64_t BT, cudaStream_t s);
cudaError_t launch_vocab_shard_ce_backward(void* dlogits, const void* logits, const float* lse, const std::int32_t* targets, DType t, std::int64_t BT,
                                           std::int64_t Vr, float dloss, std::int64_t first, std::int64_t valid, cudaStream_t s);

// attention.cu. C = NH·HS (the output width); NKV KV heads (dividing NH; NKV = NH: multi-head),
// qkv rows (NH + 2·NKV)·HS wide. p: attention dropout probability (0: none). Dsum: B*NH*T fp32
// (the tail of the caller's attention_backward scratch).
cudaError_t launch_attention_forward(void* out, float* lse, const void* qkv, DType t, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                     std::int64_t NKV, float p, const RngKey& key, cudaStream_t st);
cudaError_t launch_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, float* Dsum, DType t,
                                      std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV, float p, const RngKey& key,
                                      cudaStream_t st);
// attention_tc.cu: the tensor-core (FlashAttention-2 style) kernels for fp16/bf16 storage and
// HS in {32, 64, 128}, multi-head or grouped KV heads, otherwise the contract above. Callers check
// attention_tc_supported and 16-byte alignment of every tensor pointer (cp.async) first.
bool attention_tc_supported(DType t, std::int64_t HS);
cudaError_t launch_attention_forward_tc(void* out, float* lse, const void* qkv, DType t, std::int64_t B, std::int64_t T, std::int64_t C,
                                        std::int64_t NH, std::int64_t NKV, float p, const RngKey& key, cudaStream_t st);
cudaError_t launch_attention_backward_tc(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, float* Dsum, DType t,
                                         std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV, float p,
                                         const RngKey& key, cudaStream_t st);

// matmul's dbias (rows.cu): dbias[c] += sum over rows of dout[r, c] (double, partitions in order, rounded once).
cudaError_t launch_matmul_dbias(void* dbias, const void* dout, DType t, std::int64_t rows, std::int64_t OC, double* partials, cudaStream_t s);
// out[r, c] += bias[c] (rows x OC): the bias for pointers the cuBLASLt epilogue cannot take.
cudaError_t launch_add_bias(void* out, const void* bias, DType t, std::int64_t rows, std::int64_t OC, cudaStream_t s);

// moe.cu (ops/kernels/moe.h; compiled with -fmad=false: the CPU's fp32/fp64 operations, no
// contractions). Routing: one thread per token in double, top-k by repeated argmax in the
// header's order (higher first, the lower index on a tie). The kernels check every index they
// follow and skip one out of range (never an out-of-bounds access); only the plan reports them.
struct MoeRouteParams {
  std::int64_t top_k = 2;
  bool sigmoid = false;
  bool renormalize = true;
  float scale = 1.0f;
  std::int64_t n_group = 1;
  std::int64_t topk_group = 1;
};
cudaError_t launch_moe_route_forward(float* scores, std::int32_t* expert, float* weight, const float* logits, std::int64_t N, std::int64_t E,
                                     const MoeRouteParams& r, cudaStream_t s);
// aux_grad: E fp32 or null.
cudaError_t launch_moe_route_backward(float* dlogits, const float* dweight, const float* scores, const std::int32_t* expert, const float* logits,
                                      const float* aux_grad, std::int64_t N, std::int64_t E, const MoeRouteParams& r, cudaStream_t s);
// scratch: moe_aux_stats_scratch_bytes(N, E) of device memory (per-token softmax max and sum,
// per-expert integer counts).
inline std::size_t moe_aux_stats_scratch_bytes(std::int64_t N, std::int64_t E) {
  return static_cast<std::size_t>(2 * N) * sizeof(double) + static_cast<std::size_t>(E) * sizeof(unsigned long long);
}
cudaError_t launch_moe_aux_stats(double* assigned, double* prob_sum, const float* logits, std::int64_t N, std::int64_t E, std::int64_t top_k,
                                 void* scratch, cudaStream_t s);
// The plan as a stable counting sort over chunks of kMoePlanChunk assignments in slot order
// (choice j, then token t): per-chunk histograms, their running sums per expert, then each
// assignment's rank within its chunk. scratch: moe_plan_scratch_bytes(N·k, E); *bad_flag (in the
// scratch, returned through bad_flag_out) is set when an expert id is outside [0, E).
inline constexpr std::int64_t kMoePlanChunk = 256;
inline std::size_t moe_plan_scratch_bytes(std::int64_t M, std::int64_t E) {
  const std::int64_t chunks = (M + kMoePlanChunk - 1) / kMoePlanChunk;
  return static_cast<std::size_t>(chunks * E + E + 1) * sizeof(std::int32_t);
}
cudaError_t launch_moe_dispatch_plan(std::int32_t* slot_assignment, std::int32_t* slot_of, std::int32_t* counts, const std::int32_t* expert,
                                     std::int64_t N, std::int64_t k, std::int64_t E, std::int64_t capacity, void* scratch,
                                     const std::int32_t** bad_flag_out, cudaStream_t s);
cudaError_t launch_moe_gather_rows(void* rows, const void* x, const std::int32_t* slot_assignment, DType t, std::int64_t N, std::int64_t C,
                                   std::int64_t k, std::int64_t slots, cudaStream_t s);
// weight: N·k fp32 or null (a plain sum). R: rows of `rows`.
cudaError_t launch_moe_combine(void* out, const void* rows, const std::int32_t* slot_of, const float* weight, DType t, std::int64_t N,
                               std::int64_t C, std::int64_t k, std::int64_t R, cudaStream_t s);
cudaError_t launch_moe_combine_backward(void* drows, float* dweight, const void* dout, const void* rows, const std::int32_t* slot_of,
                                        const float* weight, DType t, std::int64_t N, std::int64_t C, std::int64_t k, std::int64_t R,
                                        cudaStream_t s);
cudaError_t launch_moe_gated_add_forward(void* out, const void* y, const void* logit, DType t, std::int64_t N, std::int64_t C, cudaStream_t s);
cudaError_t launch_moe_gated_add_backward(void* dy, void* dlogit, const void* dout, const void* y, const void* logit, DType t, std::int64_t N,
                                          std::int64_t C, cudaStream_t s);

}  // namespace dstrain::cuda_detail
