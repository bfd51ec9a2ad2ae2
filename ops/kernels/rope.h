// Rotary position embeddings (RoPE) in Hugging Face's rotate-half convention (LlamaRotaryEmbedding,
// apply_rotary_pos_emb): for a head vector x of even size D, h = D / 2, position p and
// angle_j = p * inv_freq[j] (fp32 product, as Hugging Face computes it),
//   out[j]     = x[j]     * cos(angle_j) - x[j + h] * sin(angle_j)
//   out[j + h] = x[j + h] * cos(angle_j) + x[j]     * sin(angle_j)      (j < h).
// The frequencies follow `rope_theta` and `rope_scaling` (types "default", "linear", "llama3") as
// transformers' modeling_rope_utils computes them (rope_inv_freq below).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/tensor.h"

namespace dstrain {

// config.json's `rope_scaling`. kind none: no scaling (also `rope_type: "default"`).
struct RopeScaling {
  enum class Kind { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1.0;                               // linear and llama3
  double low_freq_factor = 1.0;                      // llama3
  double high_freq_factor = 4.0;                     // llama3
  double original_max_position_embeddings = 8192.0;  // llama3
};

// The D/2 inverse frequencies: inv_freq[j] = theta^(-2j / D), then
//  linear: inv_freq / factor (the same as dividing the positions by factor);
//  llama3: with wavelen = 2·pi / inv_freq, low = original / low_freq_factor, high = original /
//    high_freq_factor: wavelen < high keeps inv_freq; wavelen > low uses inv_freq / factor; in
//    between, (1 - s)·inv_freq / factor + s·inv_freq with s = (original / wavelen - low_freq_factor)
//    / (high_freq_factor - low_freq_factor).
// Computed in double and rounded to fp32 once. Throws dstrain::Error, naming the key, for an odd
// or non-positive head_dim, theta <= 0, factor <= 0, or llama3 with high_freq_factor <= low_freq_factor.
std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta, const RopeScaling& scaling = {});

// out = rope(inp) on heads [0, rotate_heads) of every token; heads [rotate_heads, H) are copied
// (nothing to do in place). The token at (b, t) has position t + pos_offset.
//   inp, out:  (B, T, H, D)  storage dtype S (fp32 / fp16 / bf16), D even; e.g. the fused q|k|v
//              of one layer viewed as (B, T, NH + 2·NKV, D) with rotate_heads = NH + NKV, so q and
//              k are rotated in place inside the attention input and v is left as it is.
//   inv_freq:  (D/2) fp32 on the same device (rope_inv_freq's values).
// out may alias inp (in place): each pair (j, j + h) is read before it is written. Scratch: none.
void rope_forward(Tensor out, Tensor inp, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset = 0);

// The backward is the transposed (inverse) rotation: dinp = R(-angle) dout on heads
// [0, rotate_heads), dinp = dout on the others. Unlike most backward kernels it WRITES dinp (it
// does not accumulate), so that it can run in place on the attention input's gradient; dinp may
// alias dout. Shapes and dtypes as rope_forward. Scratch: none.
void rope_backward(Tensor dinp, Tensor dout, Tensor inv_freq, std::int64_t rotate_heads, std::int64_t pos_offset = 0);

}  // namespace dstrain
