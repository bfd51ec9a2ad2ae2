// RMSNorm over the last dimension (Llama, Mistral, Qwen: `rms_norm_eps`), and the fused
// residual-add + RMSNorm that mirrors fused_residual_layernorm_forward (layernorm.h).
//
// Conventions as layernorm.h: activations are written (=), gradients accumulate (+=); rstd is
// saved in fp32 for the backward pass. Compute is fp32 with one rounding into the storage dtype
// per output (Hugging Face's LlamaRMSNorm rounds x·rstd to the input dtype before the weight
// multiply in 16-bit; here the product is rounded once, which is at least as accurate).
#pragma once

#include "ops/tensor.h"

namespace dstrain {

// out = inp * rstd * weight, per row of C, with rstd = 1 / sqrt(mean(inp^2) + eps).
//   inp, out: (..., C)  storage dtype S (fp32 / fp16 / bf16); e.g. (B, T, C)
//   weight:   (C)       S
//   rstd:     (...)     fp32: the leading dimensions of inp, e.g. (B, T)
// out may not alias inp. Scratch: none.
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps = 1e-6f);

// With n = inp * rstd (recomputed from the saved fp32 rstd) and dn = weight * dout:
// dinp += rstd * (dn - n * mean(dn * n)), dweight += sum over rows of dout * n.
//   dinp, dout, inp: (..., C) S;  dweight, weight: (C) S;  rstd: (...) fp32.
// dweight is summed per channel over rows in a fixed order in double and rounded into S once:
// deterministic for any thread count. dinp must not alias dout or inp. Scratch: none.
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);

// residual = a + b (rounded to S), then out/rstd = rmsnorm(residual) exactly as rmsnorm_forward
// would compute from the stored residual, in one pass over memory.
//   a, b, residual, out: (..., C) S;  weight: (C) S;  rstd: (...) fp32.
// residual may alias a or b. Scratch: none.
void fused_residual_rmsnorm_forward(Tensor residual, Tensor out, Tensor rstd, Tensor a, Tensor b, Tensor weight, float eps = 1e-6f);

// sums[r] = Σ_c inp[r, c]² in fp32 (the same sum rmsnorm_forward forms), one per row.
//   inp: (..., C) S;  sums: (...) fp32, the leading dimensions of inp.
void rmsnorm_shard_sum_squares(Tensor sums, Tensor inp);

// From the group's sums over the whole rows of n elements: rstd = 1 / sqrt(sums / n + eps) and
// out = inp * rstd * weight on the rank's columns.
//   inp, out: (..., C) S;  weight: (C) S;  sums, rstd: (...) fp32, not the same memory;  n >= C.
// out may not alias inp. Scratch: none.
void rmsnorm_shard_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, Tensor sums, std::int64_t n, float eps = 1e-6f);

// dots[r] = Σ_c (weight·dout)·(inp·rstd) over the rank's columns, fp32 (rmsnorm_backward's sum).
//   dout, inp: (..., C) S;  weight: (C) S;  rstd, dots: (...) fp32.
void rmsnorm_shard_backward_dot(Tensor dots, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);

// From the group's dots over the whole rows of n elements: with x̂ = inp·rstd and dn = weight·dout,
// dinp += rstd·(dn - x̂·dots / n) and dweight += Σ over rows of dout·x̂ (fixed order in double, as
// rmsnorm_backward). Shapes as rmsnorm_backward, dots (...) fp32; dinp must not alias dout or inp.
void rmsnorm_shard_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd, Tensor dots, std::int64_t n);

}  // namespace dstrain
