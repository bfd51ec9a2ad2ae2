// RMSNorm of individual attention heads inside the fused attention input: Qwen3's q_norm and
// k_norm normalise each head_dim-wide q and k head (before RoPE) with one weight of head_dim.
//
// The heads live inside the q|k|v rows that the attention kernel reads, (B, T, NH + 2·NKV, D),
// so this op works in place on a range of heads and leaves the others (v) as they are, with no
// extra copy. Numerics as rmsnorm.h: fp32 math, one rounding per output, rstd saved in fp32.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// For heads h in [head0, head0 + nheads) of every token: x[b, t, h, :] = x * rstd * weight, with
// rstd = 1 / sqrt(mean(x^2) + eps) saved in rstd[b, t, h - head0]. In place; other heads untouched.
//   x:      (B, T, H, D) storage dtype S (fp32 / fp16 / bf16)
//   weight: (D) S;  rstd: (B, T, nheads) fp32.  Scratch: none.
void head_rmsnorm_forward(Tensor x, Tensor rstd, Tensor weight, std::int64_t head0, std::int64_t nheads, float eps);

// Given dx holding d(loss)/d(normalised heads) on the range, OVERWRITES it with d(loss)/d(heads
// before the norm) (in place, like rope_backward, so it runs on the attention input's gradient);
// dweight += sum over rows of dout * n. inp holds the heads before the norm (same layout as dx).
//   dx, inp: (B, T, H, D) S;  dweight, weight: (D) S;  rstd: (B, T, nheads) fp32.
// dweight is summed per channel over rows in a fixed order in double: deterministic. Heads
// outside the range are untouched. Scratch: none.
void head_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor inp, Tensor weight, Tensor rstd, std::int64_t head0, std::int64_t nheads);

}  // namespace dstrain
