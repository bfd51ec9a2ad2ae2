#include "models/gpt2/gpt2_flops.h"

#include <string>
#include <utility>
#include <vector>

#include "ops/error.h"

namespace dstrain {

ModuleFlops gpt2_forward_flops(const Gpt2FlopsShape& s) {
  DSTRAIN_CHECK(s.batch > 0 && s.seq_len > 0 && s.channels > 0 && s.heads > 0 && s.vocab > 0 && s.layers > 0 && s.max_seq_len >= 0,
                "gpt2_forward_flops: every dimension must be positive (B={}, T={}, C={}, NH={}, V={}, L={}, maxT={})", s.batch, s.seq_len, s.channels,
                s.heads, s.vocab, s.layers, s.max_seq_len);
  DSTRAIN_CHECK(s.channels % s.heads == 0, "gpt2_forward_flops: channels ({}) must be a multiple of heads ({})", s.channels, s.heads);
  const std::int64_t B = s.batch, T = s.seq_len, C = s.channels, NH = s.heads, V = s.vocab;
  const std::int64_t max_t = s.max_seq_len > 0 ? s.max_seq_len : T;
  const std::int64_t BT = B * T;

  std::vector<ModuleFlops> blocks;
  blocks.reserve(static_cast<std::size_t>(s.layers));
  for (std::int64_t l = 0; l < s.layers; ++l) {
    // QKᵀ and AV: B·NH·T·T·hs multiply-accumulates each; softmax one FLOP per score.
    const std::int64_t attn_macs = 2 * B * T * T * C;
    ModuleFlops attn = flops_parent("attn", "Attention", {flops_linear("c_attn", BT, C, 3 * C), flops_linear("c_proj", BT, C, C)}, attn_macs,
                                    2 * attn_macs + B * NH * T * T);
    ModuleFlops mlp =
        flops_parent("mlp", "MLP",
                     {flops_linear("c_fc", BT, C, 4 * C), flops_leaf("gelu", "GELU", 0, 0, BT * 4 * C), flops_linear("c_proj", BT, 4 * C, C)});
    blocks.push_back(flops_parent(std::to_string(l), "Block",
                                  {flops_layernorm("ln_1", BT, C), std::move(attn), flops_layernorm("ln_2", BT, C), std::move(mlp)}, 0,
                                  2 * BT * C));  // the two residual adds
  }
  ModuleFlops lm_head = flops_leaf("lm_head", "Linear", 0, BT * C * V, 2 * BT * C * V);
  lm_head.note = "weight tied to wte";
  std::vector<ModuleFlops> top;
  top.push_back(flops_leaf("wte", "Embedding", V * C, 0, 0));
  top.push_back(flops_leaf("wpe", "Embedding", max_t * C, 0, 0));
  top.push_back(flops_parent("h", "ModuleList", std::move(blocks)));
  top.push_back(flops_layernorm("ln_f", BT, C));
  top.push_back(std::move(lm_head));
  return flops_parent("", "GPT2", std::move(top), 0, BT * C);  // token + position embedding add
}

std::int64_t gpt2_num_parameters(const Gpt2FlopsShape& s) {
  const std::int64_t C = s.channels;
  const std::int64_t max_t = s.max_seq_len > 0 ? s.max_seq_len : s.seq_len;
  return s.vocab * C + max_t * C + s.layers * (12 * C * C + 13 * C) + 2 * C;
}

}  // namespace dstrain
