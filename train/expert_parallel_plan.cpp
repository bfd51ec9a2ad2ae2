#include "train/expert_parallel_plan.h"

#include <algorithm>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"

namespace dstrain {
namespace {

// The Hugging Face model types each AutoEP preset is written for (deepspeed/module_inject/
// auto_ep_presets/*.py: hf_model_types).
std::vector<std::string> preset_model_types(const std::string& preset) {
  if (preset == "mixtral") return {"mixtral"};
  if (preset == "qwen3_moe") return {"qwen3_moe", "qwen2_moe"};
  if (preset == "qwen3_5_moe") return {"qwen3_5_moe_text"};
  if (preset == "deepseek_v2") return {"deepseek_v2"};
  if (preset == "deepseek_v3") return {"deepseek_v3"};
  return {};
}

// The presets whose model types include `model_type`, for the fix in a message.
std::vector<std::string> presets_for(const std::string& model_type) {
  std::vector<std::string> out;
  for (const std::string& p : config::expert_parallel_preset_names()) {
    const std::vector<std::string> types = preset_model_types(p);
    if (std::find(types.begin(), types.end(), model_type) != types.end()) out.push_back(p);
  }
  return out;
}

const char* score_name(MoeConfig::Score s) { return s == MoeConfig::Score::softmax ? "softmax" : "sigmoid"; }

}  // namespace

ExpertParallelPlan plan_expert_parallel(std::shared_ptr<const Architecture> model, const config::ExpertParallelConfig& ep) {
  ExpertParallelPlan plan{model, {}};
  if (!ep.enabled) return plan;
  const MoeConfig* have = model->moe_config();
  if (have == nullptr) {
    fail("expert_parallel.enabled is true but the model ({}) has no mixture-of-experts layers, so AutoEP would find none (DeepSpeed: \"AutoEP: no MoE "
         "layers detected\"); train a mixture of experts (a Mixtral, Qwen-MoE or OLMoE config.json, or a moe: descriptor), or set "
         "expert_parallel.enabled false",
         model->describe());
  }
  const std::string model_type = model->hf_model_type();
  if (ep.preset_model) {
    const std::vector<std::string> types = preset_model_types(*ep.preset_model);
    if (std::find(types.begin(), types.end(), model_type) == types.end()) {
      const std::vector<std::string> fits = presets_for(model_type);
      fail("expert_parallel.preset_model \"{}\" is written for model_type {} but the model is a {}; {}", *ep.preset_model,
           fmt::join(types, " / "), model_type,
           fits.empty() ? std::string("remove preset_model (dstrain finds its own MoE layers) or give moe_layer_pattern")
                        : fmt::format("use preset_model \"{}\" or remove it", fmt::join(fits, "\" or \"")));
    }
  }
  // The module names AutoEP's patterns meet: each sparse layer's feed-forward is model.layers.N.mlp,
  // its router "gate" and its experts "experts" in every family dstrain reads.
  if (ep.moe_layer_pattern) {
    const std::regex re(*ep.moe_layer_pattern);  // compiled once already at parse time: valid
    std::vector<std::string> missed;
    for (std::int64_t i = 0; i < model->n_layer(); ++i) {
      const std::string name = fmt::format("model.layers.{}.mlp", i);
      if (have->is_sparse_layer(i) && !std::regex_match(name, re)) missed.push_back(name);
    }
    if (!missed.empty()) {
      fail("expert_parallel.moe_layer_pattern \"{}\" does not match the sparse layer{} {} of this model, so AutoEP would leave {} out of expert "
           "parallelism; the model's MoE layers are named model.layers.<N>.mlp — use \"model\\\\.layers\\\\.\\\\d+\\\\.mlp\" or remove the key",
           *ep.moe_layer_pattern, missed.size() == 1 ? "" : "s", fmt::join(missed, ", "), missed.size() == 1 ? "it" : "them");
    }
  }
  if (ep.router_pattern && *ep.router_pattern != "gate") {
    fail("expert_parallel.router_pattern \"{}\": the model's router is the module \"gate\" of each MoE layer (model.layers.N.mlp.gate), so AutoEP would "
         "find no router; use \"gate\" or remove the key",
         *ep.router_pattern);
  }
  if (ep.expert_pattern && *ep.expert_pattern != "experts") {
    fail("expert_parallel.expert_pattern \"{}\": the model's experts are the module \"experts\" of each MoE layer (model.layers.N.mlp.experts), so "
         "AutoEP would find none; use \"experts\" or remove the key",
         *ep.expert_pattern);
  }
  if (ep.score_apply == "pre") {
    fail("expert_parallel.score_apply \"pre\" multiplies each expert's input by its routing score; dstrain's MoE layer weights the experts' outputs "
         "(\"post\", what every preset uses); set score_apply \"post\" or \"auto\"");
  }
  MoeConfig moe = *have;
  std::vector<std::string> changed;
  if (ep.top_k && *ep.top_k != moe.top_k) {
    if (*ep.top_k > moe.num_experts)
      fail("expert_parallel.top_k {} exceeds the model's {} experts (DeepSpeed: \"top_k={} exceeds num_experts={}\"); give at most {} or \"auto\"",
           *ep.top_k, moe.num_experts, *ep.top_k, moe.num_experts, moe.num_experts);
    changed.push_back(fmt::format("top_k {} (the model's {})", *ep.top_k, moe.top_k));
    moe.top_k = *ep.top_k;
  }
  if (ep.score_func != "auto") {
    const MoeConfig::Score s = ep.score_func == "sigmoid" ? MoeConfig::Score::sigmoid : MoeConfig::Score::softmax;
    if (s != moe.score) changed.push_back(fmt::format("score_func {} (the model's {})", ep.score_func, score_name(moe.score)));
    moe.score = s;
  }
  if (ep.route_norm && *ep.route_norm != moe.norm_topk_prob) {
    changed.push_back(fmt::format("route_norm {} (the model's norm_topk_prob {})", *ep.route_norm, moe.norm_topk_prob));
    moe.norm_topk_prob = *ep.route_norm;
  }
  // AutoEP's one routing scale: routed_scaling_factor when a number; "auto": the model's
  // routed_scaling_factor, else route_scale. A model without the key has 1 here.
  double scale = moe.routed_scaling_factor;
  if (ep.routed_scaling_factor) {
    scale = *ep.routed_scaling_factor;
  } else if (moe.routed_scaling_factor == 1.0) {
    scale = ep.route_scale;
  }
  if (scale != moe.routed_scaling_factor) {
    changed.push_back(fmt::format("routed scale {} (the model's {})", scale, moe.routed_scaling_factor));
    moe.routed_scaling_factor = scale;
  }
  if (ep.num_expert_groups && *ep.num_expert_groups != moe.n_group) {
    changed.push_back(fmt::format("num_expert_groups {} (the model's n_group {})", *ep.num_expert_groups, moe.n_group));
    moe.n_group = *ep.num_expert_groups;
  }
  if (ep.num_limited_groups && *ep.num_limited_groups != moe.topk_group) {
    changed.push_back(fmt::format("num_limited_groups {} (the model's topk_group {})", *ep.num_limited_groups, moe.topk_group));
    moe.topk_group = *ep.num_limited_groups;
  }
  if (!changed.empty()) {
    try {
      plan.model = model->with_moe_config(moe);
    } catch (const Error& e) {
      fail("expert_parallel: the routing it asks for ({}) does not fit the model: {}", fmt::join(changed, ", "), e.what());
    }
    plan.lines.push_back(fmt::format("expert_parallel: routing as the section asks: {}", fmt::join(changed, ", ")));
  }
  return plan;
}

}  // namespace dstrain
