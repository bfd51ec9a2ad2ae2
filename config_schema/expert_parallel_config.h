// expert_parallel: DeepSpeed's AutoEP (docs/config.md §8.8), read as DeepSpeed 0.19's
// parse_autoep_config reads it (deepspeed/module_inject/auto_ep_config.py: param_dict.get with a
// default per key, unknown keys ignored — regime A) and checked as validate_autoep_config and
// build_folding_spec / validate_folding_global check it when the engine starts
// (DeepSpeedEngine._configure_expert_parallel), so that dstrain refuses before step 1 what
// DeepSpeed refuses at deepspeed.initialize.
//
//   "expert_parallel": {"enabled": true, "autoep_size": 4, "preset_model": "mixtral"}
//
// autoep_size = EP splits the data-parallel ranks (zero/device_mesh.h): the EP ranks of one group
// hold different experts of every MoE layer and exchange tokens; the data-parallel size / EP ranks
// that hold the same experts reduce their gradients. The checks that need the model (EP divides
// the expert count, top_k within it, the preset against the model) are train/'s.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

struct ExpertParallelConfig {
  bool present = false;                   // the section is given (an object)
  bool enabled = false;                   // false: DeepSpeed ignores every other key
  std::int64_t autoep_size = 1;           // expert-parallel degree (>= 1; divides the data-parallel size)
  std::int64_t expert_tensor_parallel_size = 1;  // DeepSpeed accepts only 1 (reserved); so does dstrain
  bool validate_folding_routing = false;  // DeepSpeed's AutoEP+AutoTP routing coverage check (debug)
  std::optional<std::string> preset_model;        // one of expert_parallel_preset_names(), as given (case-sensitive)
  // A regular expression over module names ("model.layers.0.mlp"), matched as Python's
  // re.fullmatch: the whole name (moe_layer_matches). Compiled at parse time.
  std::optional<std::string> moe_layer_pattern;
  std::optional<std::string> router_pattern;   // a direct child attribute name, not a regex ("gate")
  std::optional<std::string> expert_pattern;   // a direct child attribute name ("experts")
  bool use_grouped_mm = true;                  // DeepSpeed's grouped-GEMM expert kernels
  bool disable_triton_grouped_mm = false;      // DeepSpeed: torch._grouped_mm instead of Triton below sm90
  std::optional<bool> route_norm;              // renormalise the top-k scores; nullopt: the model's norm_topk_prob, else the preset's
  double route_scale = 1.0;                    // the router scores' scale (routed_scaling_factor overrides it)
  std::string score_apply = "auto";            // "auto" | "pre" | "post"
  std::string combine_impl = "auto";           // "auto" | "weighted_sum" | "legacy_bmm"
  std::optional<std::int64_t> num_expert_groups;   // group-limited routing (DeepSeek-V3): >= 1
  std::optional<std::int64_t> num_limited_groups;  // >= 1, <= num_expert_groups
  std::string score_func = "auto";             // "auto" | "softmax" | "sigmoid"
  std::optional<std::int64_t> top_k;           // nullopt = "auto" (the model's top_k_attr); else >= 1
  bool load_balance_coeff_given = false;       // given as null (the only value DeepSpeed accepts)
  std::optional<double> routed_scaling_factor; // nullopt = "auto" (the model config's, else route_scale)
  std::optional<std::string> expert_w1;        // expert weight names (attribute names); nullopt: the preset's
  std::optional<std::string> expert_w2;
  // Three states, as DeepSpeed: key absent (expert_w3_given false) = the preset's; null = gate and
  // up fused in expert_w1; a name = a separate up projection.
  bool expert_w3_given = false;
  std::optional<std::string> expert_w3;
  std::optional<std::string> num_experts_attr;  // model.config attribute names; nullopt: the preset's
  std::optional<std::string> top_k_attr;
  std::optional<bool> has_shared_experts;       // nullopt: the preset's
  std::optional<std::string> shared_experts_pattern;       // attribute names
  std::optional<std::string> shared_experts_gate_pattern;

  // The device mesh's expert-parallel size (MeshShape::ep): autoep_size when enabled, else 1.
  int ep_size() const { return enabled ? static_cast<int>(autoep_size) : 1; }
  // moe_layer_pattern (empty when unset) matches the whole module name, as Python's re.fullmatch.
  bool moe_layer_matches(const std::string& module_name) const;
};

// The presets DeepSpeed's AutoEP registry knows, in its order.
const std::vector<std::string>& expert_parallel_preset_names();

SectionSpec expert_parallel_section_spec();

// Reads the section (`value` null or absent: not present, every default). `resolved` gets the
// canonical tree: every default filled (expert_w3 and load_balance_coeff only when given, as their
// absence means something), unknown keys dropped (warned). Throws Error naming
// expert_parallel.<key>, the value and the fix.
ExpertParallelConfig parse_expert_parallel_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
