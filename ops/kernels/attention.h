// Causal multi-head self-attention as one fused op (GPT-2), with grouped KV heads (grouped-query
// attention: Llama, Mistral, Qwen): qkv (B, T, (NH + 2·NKV)·HS) -> out (B, T, C = NH·HS).
//
// Layout (llm.c, nn.Linear c_attn; Llama's q_proj | k_proj | v_proj outputs side by side):
// qkv[b, t, :] = [q (NH·HS) | k (NKV·HS) | v (NKV·HS)], head h at columns h*HS .. h*HS+HS-1 of its
// part; out[b, t, h*HS + d] is query head h's output. Query head h reads KV head h / (NH / NKV)
// (Hugging Face's repeat_kv: consecutive query heads share a KV head). NKV = NH is GPT-2's
// multi-head attention (qkv (B, T, 3C)); NKV = 1 is multi-query attention. Scale 1/sqrt(HS).
//
// Saved for backward: flash-style, only the per-row logsumexp lse (B, NH, T) in fp32, and the
// backward pass recomputes the scores. Why: the probabilities would be (B, NH, T, T), e.g.
// 48 MiB per sequence per layer in fp32 at NH = 12, T = 1024 (4.5 GiB for a d12 micro-batch of
// 8), against 48 KiB for lse; recomputing QKᵀ costs one extra T×T×HS product per head in backward,
// which is cheap next to the memory it saves and what activation checkpointing would recompute
// anyway. The backward also needs `out` (to form D_i = dout_i · out_i), which the layer keeps as
// the input of the attention projection.
//
// Precision of the CPU path: fp32 / fp16 storage (and bf16 on a CPU without AVX512-BF16) widens
// each Q/K/V tile to fp32 and computes everything in fp32. bf16 storage on a CPU with
// AVX512-BF16 (ops/cpu/attention_bf16.cpp; cpu::cpu_bf16_attention_path() in
// ops/cpu/attention_bf16.h says which path runs, DSTRAIN_CPU_BF16_ATTENTION=0 forces the fp32
// one) does the tile products with bf16 dot products (vdpbf16ps) into fp32 accumulators: q, k, v
// and dout enter as stored; the probabilities P̃ (after the dropout scaling) and dS are rounded
// to bf16 for P̃·V, P̃ᵀ·dout, dSᵀ·q and dS·k, one relative 2^-8 rounding per term (what
// flash-attention does on GPUs in bf16), so out may differ from the fp32-tile path by up to
// 2^-8·Σ_j P̃_ij|v_j| and the gradients by the analogous sums. The scale 1/sqrt(HS) multiplies the
// fp32 scores (q·scale is not rounded to bf16). The softmax, its running max and sum, lse, D_i
// and every accumulator stay fp32. tests/unit/kernels/test_attention_bf16.cpp derives the bounds.
//
// Optional attention dropout on the probabilities: the mask is never stored; it is regenerated
// from Philox with element index ((b * NH + h) * T + i) * T + j (query i, key j).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/kernels/dropout.h"
#include "ops/tensor.h"

namespace dstrain {

// Query heads and KV heads of one attention call. A plain head count (GPT-2) means NKV = NH.
struct AttentionHeads {
  std::int64_t q = 0;                                 // NH
  std::int64_t kv = 0;                                // NKV: divides NH
  AttentionHeads(std::int64_t nh) : q(nh), kv(nh) {}  // NOLINT(google-explicit-constructor): MHA call sites pass NH
  AttentionHeads(std::int64_t nh, std::int64_t nkv) : q(nh), kv(nkv) {}
};

// The largest head size HS = C / NH the kernels accept: the CPU tiles live on the stack (GPT-2
// and GPT-3 use HS = 64 .. 128).
inline constexpr std::int64_t kAttentionMaxHeadSize = 128;

// out = softmax(mask(q kᵀ / sqrt(HS))) v per head, with optional dropout on the probabilities.
//   qkv: (B, T, (NH + 2·NKV)·HS) storage dtype S (fp32 / fp16 / bf16);  out: (B, T, C = NH·HS) S
//   lse: (B, NH, T) fp32: log sum_j exp(score_ij) per query row (before dropout)
//   NKV divides NH, HS <= kAttentionMaxHeadSize. Scratch: none.
//   window: 0 = causal (query i sees keys 0 .. i); W > 0 = sliding window (Mistral): query i sees
//   keys i - W < j <= i (itself and the W - 1 before it, Hugging Face's sliding_window mask).
//   The CPU computes both; the CUDA kernels only windows that mask nothing (W >= T), else Error.
void attention_forward(Tensor out, Tensor lse, Tensor qkv, AttentionHeads heads, const DropoutParams& dropout = {}, std::int64_t window = 0);

// fp32 scratch elements for attention_backward: B*T*C (dq accumulated in fp32) + B*NH*T (D_i),
// C = NH·HS (the output width, whatever NKV is).
std::size_t attention_backward_scratch_elems(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH);

// dqkv += d(loss)/d(qkv), given dout = d(loss)/d(out).
//   dqkv, qkv: (B, T, (NH + 2·NKV)·HS) S;  dout, out: (B, T, C) S;  lse: (B, NH, T) fp32
//   scratch: fp32, >= attention_backward_scratch_elems(B, T, C, NH) elements.
//   dropout: the same params as the forward. Parallel over (b, KV head): each task writes only
//   its own columns of dqkv; the query heads of a group add into their shared dk/dv in head
//   order, so the result is deterministic.
//   window: the forward's.
void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, AttentionHeads heads, Tensor scratch,
                        const DropoutParams& dropout = {}, std::int64_t window = 0);
// How the CPU computes attention's tile products for `storage`, for the run's start line:
// "AVX512-BF16 dot products (vdpbf16ps)" for bf16 where the CPU has them (ops/cpu/attention_bf16.h),
// else "fp32 tiles".
std::string cpu_attention_path(DType storage);

}  // namespace dstrain
