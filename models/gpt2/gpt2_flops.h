// FLOP and parameter counts of a GPT-2 forward pass, per module in Hugging Face's GPT2LMHeadModel
// names, for the flops profiler (models/module_flops.h has the conventions).
//
// What is counted (forward, one micro-batch of B sequences of T tokens, hs = C / NH):
//   Linear(in, out)        2·B·T·in·out (matmul, 2 FLOPs per multiply-accumulate) + B·T·out (bias)
//   attention QKᵀ and AV   2·B·NH·T·T·hs each = 2·B·T²·C each, the full T×T product as the kernels
//                          compute it (causal masking does not remove work from a dense kernel)
//   softmax                B·NH·T² (one per element, DeepSpeed's convention)
//   LayerNorm              5·B·T·C (DeepSpeed's estimate with affine)
//   GELU                   B·T·4C;  residual adds B·T·C each;  token + position embedding add B·T·C
//   embedding lookups, dropout, the loss: 0 (DeepSpeed counts none of them)
#pragma once

#include <cstdint>

#include "models/module_flops.h"

namespace dstrain {

struct Gpt2FlopsShape {
  std::int64_t batch = 1;        // B: sequences per micro-batch on this GPU
  std::int64_t seq_len = 1024;   // T
  std::int64_t channels = 768;   // C
  std::int64_t heads = 12;       // NH
  std::int64_t vocab = 50304;    // V as stored and multiplied: the padded vocabulary (wte rows)
  std::int64_t layers = 12;      // L
  std::int64_t max_seq_len = 0;  // wpe rows (n_positions); 0 = seq_len
};

// The forward-pass tree: GPT2 > {wte, wpe, h: ModuleList > Block × L > {ln_1, attn > {c_attn,
// c_proj}, ln_2, mlp > {c_fc, gelu, c_proj}}, ln_f, lm_head (tied: 0 own params)}.
// Throws Error when a dimension is <= 0 or C is not a multiple of NH.
ModuleFlops gpt2_forward_flops(const Gpt2FlopsShape& shape);

// Parameters as stored: V·C + maxT·C + L·(12C² + 13C) + 2C (GPT-2 124M: 124,439,808 with V = 50257,
// 124,475,904 with the padded 50304 that llm.c counts).
std::int64_t gpt2_num_parameters(const Gpt2FlopsShape& shape);

}  // namespace dstrain
