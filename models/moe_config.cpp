#include "models/moe_config.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

bool MoeConfig::is_sparse_layer(std::int64_t layer) const {
  if (num_experts <= 0 || layer < first_k_dense) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

std::int64_t MoeConfig::sparse_layers(std::int64_t n_layer) const {
  // Counted, not enumerated (a descriptor may ask for billions of layers): the i in
  // [first_k_dense, n_layer) with (i + 1) % step == 0, less the mlp_only_layers among them.
  if (num_experts <= 0 || decoder_sparse_step <= 0 || n_layer <= first_k_dense) return 0;
  const std::int64_t first = std::max<std::int64_t>(first_k_dense, 0);
  const auto multiples_upto = [&](std::int64_t k) { return k / decoder_sparse_step; };  // j in [1, k] divisible by step
  std::int64_t n = multiples_upto(n_layer) - multiples_upto(first);                     // j = i + 1 in (first, n_layer]
  std::vector<std::int64_t> only(mlp_only_layers);
  std::sort(only.begin(), only.end());
  only.erase(std::unique(only.begin(), only.end()), only.end());
  for (std::int64_t i : only)
    if (i >= first && i < n_layer && (i + 1) % decoder_sparse_step == 0) --n;
  return n;
}

void validate(const MoeConfig& m, const std::string& source) {
  if (!m.active()) {
    if (m.num_experts < 0) fail("model config '{}': the expert count (num_experts / num_local_experts) is {}; it must be 0 (dense) or more", source, m.num_experts);
    return;
  }
  if (m.top_k < 1 || m.top_k > m.num_experts)
    fail("model config '{}': num_experts_per_tok (top_k) = {} must be between 1 and the {} experts", source, m.top_k, m.num_experts);
  if (m.expert_intermediate_size < 1)
    fail("model config '{}': the experts' width (moe_intermediate_size, or intermediate_size for Mixtral/OLMoE) is {}; it must be at least 1", source,
         m.expert_intermediate_size);
  if (m.n_group < 1 || m.num_experts % m.n_group != 0)
    fail("model config '{}': n_group = {} must be at least 1 and divide the {} experts (groups of equal size)", source, m.n_group, m.num_experts);
  if (m.topk_group < 1 || m.topk_group > m.n_group)
    fail("model config '{}': topk_group = {} must be between 1 and n_group = {}", source, m.topk_group, m.n_group);
  if (m.n_group > 1 && m.topk_group * (m.num_experts / m.n_group) < m.top_k)
    fail("model config '{}': the topk_group = {} eligible groups of {} experts hold fewer than num_experts_per_tok = {}; raise topk_group", source,
         m.topk_group, m.num_experts / m.n_group, m.top_k);
  if (!(m.routed_scaling_factor > 0.0) || !std::isfinite(m.routed_scaling_factor))
    fail("model config '{}': routed_scaling_factor = {} must be a positive number", source, m.routed_scaling_factor);
  if (m.shared_expert_intermediate_size < 0)
    fail("model config '{}': the shared experts' width is {}; it must be 0 (none) or more", source, m.shared_expert_intermediate_size);
  if (m.decoder_sparse_step < 1) fail("model config '{}': decoder_sparse_step = {} must be at least 1", source, m.decoder_sparse_step);
  if (m.first_k_dense < 0) fail("model config '{}': first_k_dense_replace = {} must not be negative", source, m.first_k_dense);
  if (!(m.router_aux_loss_coef >= 0.0) || !std::isfinite(m.router_aux_loss_coef))
    fail("model config '{}': router_aux_loss_coef = {} must be a number >= 0", source, m.router_aux_loss_coef);
  if (!(m.capacity_factor >= 0.0) || !std::isfinite(m.capacity_factor))
    fail("model config '{}': capacity_factor = {} must be >= 0 (0: dropless)", source, m.capacity_factor);
  if (m.min_capacity < 0) fail("model config '{}': min_capacity = {} must not be negative", source, m.min_capacity);
}

std::string describe(const MoeConfig& m) {
  if (!m.active()) return "dense";
  std::string s = fmt::format("{} experts of {}, top-{} {}{}", m.num_experts, m.expert_intermediate_size, m.top_k,
                              m.score == MoeConfig::Score::softmax ? "softmax" : "sigmoid", m.norm_topk_prob ? " (renormalised)" : "");
  if (m.n_group > 1) s += fmt::format(" in {} of {} groups", m.topk_group, m.n_group);
  if (m.routed_scaling_factor != 1.0) s += fmt::format(" x{}", m.routed_scaling_factor);
  if (m.shared_expert_intermediate_size > 0)
    s += fmt::format(", shared expert of {}{}", m.shared_expert_intermediate_size, m.shared_expert_gate ? " (gated)" : "");
  if (m.aux_loss_weight() > 0.0) s += fmt::format(", aux loss x{}", m.router_aux_loss_coef);
  if (m.capacity_factor > 0.0)
    s += m.drop_tokens ? fmt::format(", capacity factor {} (tokens dropped)", m.capacity_factor)
                       : fmt::format(", capacity factor {} with drop_tokens false (none dropped)", m.capacity_factor);
  return s;
}

}  // namespace dstrain
