// MoeConfig: the mixture-of-experts feed-forward of a decoder (Mixtral, Qwen2-MoE, Qwen3-MoE,
// OLMoE, DeepSeek-style routing), whatever family's blocks carry it. docs/models.md §MoE lists the
// config.json keys each family reads into it; models/moe_mlp.h computes it.
//
// A sparse layer's feed-forward, for the N tokens of a micro-batch (h = the post-attention norm):
//   logits  = h · gateᵀ                                   (N, E)   router, no bias
//   scores  = softmax(logits) or sigmoid(logits)          (N, E)   fp32
//   chosen  = the top_k experts of each token by score, optionally group-limited (DeepSeek: the E
//             experts form n_group consecutive groups, a group scores the sum of its top 2 (sigmoid)
//             or its max (softmax), only the topk_group best groups are eligible)
//   weights = the chosen scores, renormalised to sum 1 when norm_topk_prob, × routed_scaling_factor
//   out     = Σ_chosen weight · down_e(silu(gate_e(h)) · up_e(h))
//             + shared(h) (DeepSeek's shared experts), or + sigmoid(h · shared_gateᵀ) · shared(h) (Qwen2-MoE)
// Ties in the scores go to the lower expert index (and the lower group index), on every backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain {

struct MoeConfig {
  enum class Score { softmax, sigmoid };

  std::int64_t num_experts = 0;  // E; 0: a dense model (no sparse layer)
  std::int64_t top_k = 2;        // experts per token (num_experts_per_tok)
  std::int64_t expert_intermediate_size = 0;  // each expert's SwiGLU width (Mixtral/OLMoE intermediate_size; Qwen moe_intermediate_size)
  Score score = Score::softmax;               // scoring_func
  bool norm_topk_prob = true;                 // renormalise the chosen weights to sum 1 (Mixtral always)
  double routed_scaling_factor = 1.0;         // DeepSeek: the weights are scaled after renormalising
  std::int64_t n_group = 1;                   // DeepSeek's group-limited routing: groups of E / n_group experts
  std::int64_t topk_group = 1;                // ... of which the best topk_group are eligible
  // Shared experts: one SwiGLU MLP of this width that every token goes through (0: none); Qwen2-MoE
  // scales its output per token by sigmoid(h · shared_expert_gateᵀ) (shared_expert_gate = true),
  // DeepSeek adds it as it is (width n_shared_experts · moe_intermediate_size).
  std::int64_t shared_expert_intermediate_size = 0;
  bool shared_expert_gate = false;
  // Which layers are sparse (the others keep the dense MLP of the family's intermediate_size):
  // layer i is sparse when num_experts > 0, i >= first_k_dense (DeepSeek's first_k_dense_replace),
  // i is not in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0 (Qwen-MoE).
  std::int64_t decoder_sparse_step = 1;
  std::vector<std::int64_t> mlp_only_layers;
  std::int64_t first_k_dense = 0;
  // The load-balancing loss (transformers' load_balancing_loss_func over all sparse layers' router
  // logits, models/moe_router.h): added × router_aux_loss_coef when output_router_logits is true.
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;
  // DeepSpeed MoE's capacity (deepspeed.moe.layer.MoE capacity_factor / min_capacity / drop_tokens):
  // capacity_factor > 0 drops an expert's assignments beyond max(min_capacity, ceil(top_k · N ·
  // capacity_factor / E)), first choices before second ones, then by token; 0 (the default):
  // dropless, every assignment computed. drop_tokens false (DeepSpeed's drop_tokens=False: the
  // capacity becomes the largest expert's count, deepspeed/moe/sharded_moe.py) drops nothing
  // whatever the factor.
  double capacity_factor = 0.0;
  std::int64_t min_capacity = 4;
  bool drop_tokens = true;
  // Whether some assignments may be dropped: a capacity factor, with drop_tokens.
  bool drops() const { return capacity_factor > 0.0 && drop_tokens; }

  bool active() const { return num_experts > 0; }
  bool is_sparse_layer(std::int64_t layer) const;
  // How many of n_layer layers are sparse.
  std::int64_t sparse_layers(std::int64_t n_layer) const;
  // The aux loss's weight in the objective: router_aux_loss_coef when output_router_logits, else 0.
  double aux_loss_weight() const { return output_router_logits ? router_aux_loss_coef : 0.0; }

  friend bool operator==(const MoeConfig&, const MoeConfig&) = default;
};

// Error naming the key when the settings are inconsistent (top_k above the experts, n_group not
// dividing them, topk_group above n_group or too few experts in the eligible groups, negative
// sizes, capacity_factor < 0). `source` names the config in messages.
void validate(const MoeConfig& moe, const std::string& source);

// "8 experts, top-2 softmax (renormalised), 1 shared expert of 1408, aux loss 0.02": one phrase for describe().
std::string describe(const MoeConfig& moe);

}  // namespace dstrain
