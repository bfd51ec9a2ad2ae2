// The config's expert_parallel section (DeepSpeed's AutoEP, docs/config.md §8.8) against the model
// dstrain trains, before step 1 (docs/parallelism.md §8).
//
// AutoEP replaces each mixture-of-experts layer of a Hugging Face model by its own, routing as the
// section's keys say where they are given and as the model's config.json says where they are
// "auto" (deepspeed/module_inject/auto_ep.py). dstrain's MoE layers are its own already
// (models/moe_mlp.h), so the routing keys become the model's settings (Architecture::with_moe_config),
// and the keys that locate modules in a PyTorch tree are checked against dstrain's layers' Hugging
// Face names: a pattern or preset that would find no layer of this model is refused, as DeepSpeed
// refuses it ("no MoE layers detected").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config_schema/expert_parallel_config.h"
#include "models/model_family.h"

namespace dstrain {

struct ExpertParallelPlan {
  // The model with the section's routing applied (the one given when nothing changes).
  std::shared_ptr<const Architecture> model;
  // Lines for the start of the run: what the section changed and how each key was read.
  std::vector<std::string> lines;
};

// With the section enabled: the model's routing as AutoEP resolves it — top_k (an integer overrides
// the model's num_experts_per_tok), score_func (softmax / sigmoid; "auto": the model's), route_norm
// (the renormalisation; unset: the model's norm_topk_prob), routed_scaling_factor or route_scale
// (a number overrides; "auto": the model's routed_scaling_factor, and route_scale when the model
// has none), num_expert_groups / num_limited_groups (DeepSeek's n_group / topk_group; unset: the
// model's). Errors before step 1, naming the key: a model without experts; a preset_model whose
// Hugging Face model types do not include the model's; a moe_layer_pattern that does not match
// every sparse layer's module name (model.layers.N.mlp); router_pattern / expert_pattern naming
// another module than the model's router ("gate") and experts ("experts"); score_apply "pre" (the
// scores scaling each expert's input, which dstrain's layer does not compute); top_k above the
// experts; group counts that do not divide the experts (the model's validation). Without the
// section (or disabled): `model` unchanged, no lines.
ExpertParallelPlan plan_expert_parallel(std::shared_ptr<const Architecture> model, const config::ExpertParallelConfig& ep);

}  // namespace dstrain
