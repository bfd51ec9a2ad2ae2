#include "config_schema/expert_parallel_config.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "config_schema/tensor_parallel_config.h"
#include "ops/error.h"

namespace dstrain::config {

namespace {

constexpr const char* kSection = "expert_parallel";

// DeepSpeed's Python list repr: ['mixtral', 'qwen3_moe', ...].
std::string python_list(const std::vector<std::string>& names) {
  std::string s = "[";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s + "]";
}
// DeepSpeed's tuple repr: ('auto', 'pre', 'post').
std::string python_tuple(const std::vector<std::string>& names) {
  std::string s = "(";
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s + ")";
}
// For dstrain's own text: "auto", "pre" or "post".
std::string choices(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("\"" + names[i] + "\"");
  return s;
}

// Python's repr of a JSON value, for DeepSpeed's own messages: 'x', 0.5, True, None.
std::string python_repr(const Json& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_string()) return "'" + v.get<std::string>() + "'";
  return v.dump();
}

const std::vector<std::string> kScoreApply = {"auto", "pre", "post"};
const std::vector<std::string> kCombineImpl = {"auto", "weighted_sum", "legacy_bmm"};
const std::vector<std::string> kScoreFunc = {"auto", "softmax", "sigmoid"};

// The keys read outside the table (their absence, or a string-or-number, means something).
const std::vector<std::string> kReadHere = {"top_k", "routed_scaling_factor", "load_balance_coeff", "expert_w3"};

std::optional<std::string> opt_string(const Json& v) { return v.is_null() ? std::nullopt : std::optional<std::string>(v.get<std::string>()); }
std::optional<std::int64_t> opt_int(const Json& v) { return v.is_null() ? std::nullopt : std::optional<std::int64_t>(v.get<std::int64_t>()); }
std::optional<bool> opt_bool(const Json& v) { return v.is_null() ? std::nullopt : std::optional<bool>(v.get<bool>()); }

// A whole number as DeepSpeed's isinstance(x, int) sees it (no bool; hjson's integral floats).
std::optional<std::int64_t> whole(const Json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 0x1p62) return static_cast<std::int64_t>(x);
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& expert_parallel_preset_names() {
  static const std::vector<std::string> names = {"mixtral", "qwen3_moe", "qwen3_5_moe", "deepseek_v2", "deepseek_v3"};
  return names;
}

bool ExpertParallelConfig::moe_layer_matches(const std::string& module_name) const {
  if (!moe_layer_pattern) return false;
  return std::regex_match(module_name, compile_tp_pattern(*moe_layer_pattern, "expert_parallel.moe_layer_pattern"));
}

SectionSpec expert_parallel_section_spec() {
  FieldSpec top_k{.key = "top_k", .kind = FieldKind::any, .default_value = "auto"};
  top_k.description = "Experts per token: a whole number >= 1 (overrides top_k_attr) or \"auto\" (the model config's top_k_attr).";
  FieldSpec scaling{.key = "routed_scaling_factor", .kind = FieldKind::any, .default_value = "auto"};
  scaling.description = "Scale of the routed experts' output: a number (overrides route_scale) or \"auto\" (the model config's, else route_scale).";
  FieldSpec lbc{.key = "load_balance_coeff", .kind = FieldKind::any, .default_value = nullptr};
  lbc.description = "Reserved (auxiliary-loss-free load balancing): only null or absent; DeepSpeed rejects any other value.";
  return make_section(
      kSection, Regime::dict_lookup, "DeepSpeed AutoEP expert parallelism (parse_autoep_config: dict lookups, unknown keys ignored).",
      {
          bool_field("enabled", false, "Enable expert parallelism; when false every other key is ignored."),
          int_field("autoep_size", 1, "Expert-parallel degree: ranks that split each MoE layer's experts; divides the data-parallel size."),
          int_field("expert_tensor_parallel_size", 1, "Reserved for expert tensor parallelism: only 1 is accepted."),
          bool_field("validate_folding_routing", false, "DeepSpeed's AutoEP+AutoTP routing coverage check (a boolean)."),
          string_field("preset_model", nullptr, "Model preset: mixtral, qwen3_moe, qwen3_5_moe, deepseek_v2 or deepseek_v3.").default_none(),
          string_field("moe_layer_pattern", nullptr, "Regular expression matching whole MoE module names (Python re.fullmatch).")
              .default_none(),
          string_field("expert_pattern", nullptr, "Direct child attribute name of the experts module (not a regex).").default_none(),
          string_field("router_pattern", nullptr, "Direct child attribute name of the router/gate module (not a regex).").default_none(),
          bool_field("use_grouped_mm", true, "Grouped-GEMM expert kernels."),
          bool_field("disable_triton_grouped_mm", false, "Use torch._grouped_mm instead of Triton below compute capability 9.0."),
          bool_field("route_norm", false, "Renormalise the top-k scores; null: the model config's norm_topk_prob, else the preset's.")
              .default_none(),
          number_field("route_scale", 1.0, "Scale applied to the router scores."),
          string_field("score_apply", "auto", "When the scores apply: \"pre\" (before the experts), \"post\" (in the combine) or \"auto\".")
              .one_of(kScoreApply),
          string_field("combine_impl", "auto", "How expert outputs are combined.").one_of(kCombineImpl),
          int_field("num_expert_groups", nullptr, "Expert groups of group-limited routing (DeepSeek-V3); >= 1.").default_none(),
          int_field("num_limited_groups", nullptr, "Groups each token may use; >= 1 and <= num_expert_groups.").default_none(),
          string_field("score_func", "auto", "Router scoring: \"softmax\", \"sigmoid\" or \"auto\" (model config, else preset).")
              .one_of(kScoreFunc),
          std::move(top_k),
          std::move(lbc),
          std::move(scaling),
          string_field("expert_w1", nullptr, "Expert gate (or fused gate+up) weight name; null: the preset's.").default_none(),
          string_field("expert_w2", nullptr, "Expert down-projection weight name; null: the preset's.").default_none(),
          string_field("expert_w3", nullptr, "Expert up-projection weight name; absent: the preset's; null: fused into expert_w1.").default_none(),
          string_field("num_experts_attr", nullptr, "model.config attribute holding the expert count; null: the preset's.").default_none(),
          string_field("top_k_attr", nullptr, "model.config attribute holding top-k; null: the preset's.").default_none(),
          bool_field("has_shared_experts", false, "Whether MoE layers have shared experts; null: the preset's.").default_none(),
          string_field("shared_experts_pattern", nullptr, "Direct child attribute name of the shared experts.").default_none(),
          string_field("shared_experts_gate_pattern", nullptr, "Direct child attribute name of the shared experts' gate.").default_none(),
      });
}

ExpertParallelConfig parse_expert_parallel_config(const Json* value, ParseContext& ctx, Json& resolved) {
  ExpertParallelConfig c;
  const SectionSpec spec = expert_parallel_section_spec();
  resolved = Json::object();
  if (value == nullptr || value->is_null()) {
    for (const FieldSpec& f : spec.fields)
      if (f.key != "expert_w3" && f.key != "load_balance_coeff") resolved[f.key] = f.default_value;
    return c;
  }
  if (!value->is_object())
    fail("expert_parallel must be an object such as {{\"enabled\": true, \"autoep_size\": 4, \"preset_model\": \"mixtral\"}}, got {}", show(*value));
  c.present = true;
  const Json& v = *value;

  // load_balance_coeff: DeepSpeed raises while it parses the config, enabled or not.
  if (v.contains("load_balance_coeff")) {
    if (!v["load_balance_coeff"].is_null())
      fail(
          "expert_parallel.load_balance_coeff is {}: DeepSpeed raises ValueError \"load_balance_coeff={} is not supported in this AutoEP "
          "build (would register expert_bias and route through unsupported auxiliary-loss-free load balancing). Set load_balance_coeff "
          "to null or omit the key.\" Fix: remove the key (or set it to null); the router's balance comes from the model's "
          "router_aux_loss_coef",
          show(v["load_balance_coeff"]), python_repr(v["load_balance_coeff"]));
    c.load_balance_coeff_given = true;
  }

  // enabled first: DeepSpeed checks the rest only when the engine starts with enabled true, so a
  // value it would refuse then is an error when enabled and a warning while it is not.
  const FieldSpec& enabled_field = *spec.find("enabled");
  c.enabled = v.contains("enabled") ? check_dict_lookup(v["enabled"], enabled_field, ctx).get<bool>() : false;
  std::vector<std::string> flagged;  // keys warned about while the section is off
  const auto problem = [&](const std::string& key, const std::string& message) {
    if (c.enabled) fail("{}", message);
    flagged.push_back(key);
    ctx.warn(join_path(kSection, key), message + " (ignored while expert_parallel.enabled is false, as DeepSpeed ignores the section; refused once it is enabled)");
  };

  // DeepSpeed's value checks (validate_autoep_config, build_folding_spec, validate_folding_global), in its order.
  if (v.contains("validate_folding_routing") && !v["validate_folding_routing"].is_boolean())
    problem("validate_folding_routing", fmt::format("expert_parallel.validate_folding_routing is {}: DeepSpeed raises ValueError "
                                                    "\"expert_parallel.validate_folding_routing must be a boolean\"; write true or false "
                                                    "without quotes",
                                                    show(v["validate_folding_routing"])));
  for (const char* key : {"autoep_size", "expert_tensor_parallel_size"}) {
    if (!v.contains(key)) continue;
    const std::optional<std::int64_t> n = v[key].is_boolean() ? std::nullopt : whole(v[key]);
    if (!n || *n < 1)
      problem(key, fmt::format("expert_parallel.{} is {}: DeepSpeed raises ValueError \"expert_parallel.{} must be a positive integer, got "
                               "{}\"; give a whole number >= 1{}",
                               key, show(v[key]), key, python_repr(v[key]),
                               std::string(key) == "autoep_size" ? " that divides the data-parallel size (1: every rank holds all experts)"
                                                                 : " (only 1 is accepted)"));
  }
  if (v.contains("expert_tensor_parallel_size")) {
    const std::optional<std::int64_t> etp = whole(v["expert_tensor_parallel_size"]);
    if (etp && *etp > 1)
      problem("expert_tensor_parallel_size",
              fmt::format("expert_parallel.expert_tensor_parallel_size is {}: DeepSpeed reserves it for expert-internal tensor parallelism "
                          "and refuses any value but 1 (\"expert_parallel.expert_tensor_parallel_size={} is reserved for expert-internal "
                          "tensor parallelism and is not supported yet\"); dstrain, too, keeps each expert whole on its rank (with "
                          "tensor_parallel, experts are not cut across the tensor-parallel ranks). Fix: set it to 1 or remove the key",
                          *etp, *etp));
  }
  if (v.contains("preset_model") && v["preset_model"].is_string()) {
    const std::string p = v["preset_model"].get<std::string>();
    const auto& names = expert_parallel_preset_names();
    if (std::find(names.begin(), names.end(), p) == names.end())
      problem("preset_model", fmt::format("expert_parallel.preset_model is \"{}\": DeepSpeed raises ValueError \"Unknown preset_model '{}'. "
                                          "Available presets: {}\"; use one of {} (case-sensitive), or remove the key to detect the "
                                          "model's layers from its model_type",
                                          p, p, python_list(names), choices(names)));
  }
  for (const auto& [key, allowed] : {std::pair<const char*, const std::vector<std::string>*>{"score_apply", &kScoreApply},
                                     {"combine_impl", &kCombineImpl},
                                     {"score_func", &kScoreFunc}}) {
    if (!v.contains(key) || !v[key].is_string()) continue;
    const std::string s = v[key].get<std::string>();
    if (std::find(allowed->begin(), allowed->end(), s) == allowed->end())
      problem(key, fmt::format("expert_parallel.{} is \"{}\": DeepSpeed raises ValueError \"{} must be one of {}, got '{}'\"; use {} "
                               "(case-sensitive)",
                               key, s, key, python_tuple(*allowed), s, choices(*allowed)));
  }
  std::optional<std::int64_t> expert_groups, limited_groups;
  if (v.contains("num_expert_groups") && !v["num_expert_groups"].is_boolean()) expert_groups = whole(v["num_expert_groups"]);
  if (v.contains("num_limited_groups") && !v["num_limited_groups"].is_boolean()) limited_groups = whole(v["num_limited_groups"]);
  if (limited_groups && *limited_groups < 1)
    problem("num_limited_groups", fmt::format("expert_parallel.num_limited_groups is {}: DeepSpeed raises ValueError \"num_limited_groups "
                                              "must be >= 1, got {}\"; give the number of expert groups each token may use (>= 1)",
                                              *limited_groups, *limited_groups));
  if (expert_groups && *expert_groups < 1)
    problem("num_expert_groups", fmt::format("expert_parallel.num_expert_groups is {}: DeepSpeed raises ValueError \"num_expert_groups "
                                             "must be >= 1, got {}\"; give the number of expert groups (>= 1), or remove the key",
                                             *expert_groups, *expert_groups));
  if (expert_groups && limited_groups && *expert_groups >= 1 && *limited_groups > *expert_groups)
    problem("num_limited_groups", fmt::format("expert_parallel.num_limited_groups is {} but num_expert_groups is {}: DeepSpeed raises "
                                              "ValueError \"num_limited_groups ({}) must be <= num_expert_groups ({})\"; a token can "
                                              "use at most every group",
                                              *limited_groups, *expert_groups, *limited_groups, *expert_groups));
  // Attribute names (DeepSpeed's _validate_attr_name): a non-empty string without dots.
  for (const char* key : {"expert_w1", "expert_w2", "expert_w3", "num_experts_attr", "top_k_attr", "router_pattern", "expert_pattern",
                          "shared_experts_pattern", "shared_experts_gate_pattern"}) {
    if (!v.contains(key) || v[key].is_null()) continue;
    const Json& x = v[key];
    if (!x.is_string() || x.get<std::string>().empty())
      problem(key, fmt::format("expert_parallel.{} is {}: DeepSpeed raises ValueError \"{} must be a non-empty string\"; give the "
                               "attribute's name, e.g. \"{}\", or null for the preset's",
                               key, show(x), key,
                               std::string(key).rfind("expert_w", 0) == 0 ? "down_proj" : std::string(key).find("attr") != std::string::npos
                                                                                            ? "num_experts_per_tok"
                                                                                            : "experts"));
    else if (x.get<std::string>().find('.') != std::string::npos)
      problem(key, fmt::format("expert_parallel.{} is {}: DeepSpeed raises ValueError \"{} must be a direct attribute name (no dots)\"; "
                               "it names a child of the MoE module (or a model.config attribute), not a path or a regex: give the last "
                               "part alone{}",
                               key, show(x), key, std::string(key) == "router_pattern" || std::string(key) == "expert_pattern"
                                                      ? ", and match the layers' full names with moe_layer_pattern"
                                                      : ""));
  }
  if (v.contains("has_shared_experts") && !v["has_shared_experts"].is_null() && !v["has_shared_experts"].is_boolean())
    problem("has_shared_experts", fmt::format("expert_parallel.has_shared_experts is {}: DeepSpeed raises ValueError \"has_shared_experts "
                                              "must be a boolean when set\"; write true or false without quotes, or null for the preset's",
                                              show(v["has_shared_experts"])));
  if (v.contains("routed_scaling_factor")) {
    const Json& x = v["routed_scaling_factor"];
    const bool is_auto = x.is_string() && x.get<std::string>() == "auto";
    if (!is_auto && (!x.is_number() || x.is_boolean()))
      problem("routed_scaling_factor", fmt::format("expert_parallel.routed_scaling_factor is {}: DeepSpeed raises ValueError "
                                                   "\"routed_scaling_factor must be a number or 'auto'\"; write the number without "
                                                   "quotes, or \"auto\"",
                                                   show(x)));
  }
  // top_k: DeepSpeed uses an int and reads anything else as "auto"; a token needs at least one expert.
  if (v.contains("top_k")) {
    const Json& x = v["top_k"];
    const bool is_auto = x.is_string() && x.get<std::string>() == "auto";
    const std::optional<std::int64_t> k = x.is_boolean() ? std::nullopt : whole(x);
    if (!is_auto && (!k || *k < 1))
      problem("top_k", fmt::format("expert_parallel.top_k is {}: it must be a whole number of experts per token >= 1 or \"auto\" (the model "
                                   "config's top_k_attr); DeepSpeed uses only an int and silently reads any other value as \"auto\"",
                                   show(x)));
  }
  if (v.contains("route_scale") && v["route_scale"].is_boolean())
    problem("route_scale", fmt::format("expert_parallel.route_scale is {}: DeepSpeed raises ValueError \"route_scale must be a finite "
                                       "number\" when it builds the router; write a number, e.g. 1.0",
                                       show(v["route_scale"])));
  if (v.contains("moe_layer_pattern") && v["moe_layer_pattern"].is_string()) {
    try {
      (void)compile_tp_pattern(v["moe_layer_pattern"].get<std::string>(), "expert_parallel.moe_layer_pattern");
    } catch (const Error& e) {
      problem("moe_layer_pattern", e.what());
    }
  }

  // The types, through the table (regime A: no coercion). With enabled false the choices were
  // warned about above, so the table's enums are not applied twice.
  SectionSpec typed = spec;
  std::erase_if(typed.fields, [](const FieldSpec& f) { return f.key == "enabled" || std::find(kReadHere.begin(), kReadHere.end(), f.key) != kReadHere.end(); });
  if (!c.enabled)
    for (FieldSpec& f : typed.fields) f.enum_values.clear();
  // Values warned about above (the section off) are not type-checked again; they stay as given.
  Json given = v;
  for (const std::string& key : flagged)
    if (given.contains(key)) given.erase(key);
  given.erase("enabled");  // read above
  std::vector<std::string> handled = kReadHere;
  handled.push_back("enabled");
  Json r = read_section(given, typed, ctx, handled);
  r["enabled"] = c.enabled;
  // validate_folding_routing and has_shared_experts are exact booleans in DeepSpeed (checked above when enabled).
  c.autoep_size = opt_int(r["autoep_size"]).value_or(1);
  c.expert_tensor_parallel_size = opt_int(r["expert_tensor_parallel_size"]).value_or(1);
  c.validate_folding_routing = r["validate_folding_routing"].get<bool>();
  c.preset_model = opt_string(r["preset_model"]);
  c.moe_layer_pattern = opt_string(r["moe_layer_pattern"]);
  c.expert_pattern = opt_string(r["expert_pattern"]);
  c.router_pattern = opt_string(r["router_pattern"]);
  c.use_grouped_mm = r["use_grouped_mm"].get<bool>();
  c.disable_triton_grouped_mm = r["disable_triton_grouped_mm"].get<bool>();
  c.route_norm = opt_bool(r["route_norm"]);
  c.route_scale = r["route_scale"].is_number() ? r["route_scale"].get<double>() : 1.0;
  c.score_apply = r["score_apply"].get<std::string>();
  c.combine_impl = r["combine_impl"].get<std::string>();
  c.num_expert_groups = opt_int(r["num_expert_groups"]);
  c.num_limited_groups = opt_int(r["num_limited_groups"]);
  c.score_func = r["score_func"].get<std::string>();
  c.expert_w1 = opt_string(r["expert_w1"]);
  c.expert_w2 = opt_string(r["expert_w2"]);
  c.num_experts_attr = opt_string(r["num_experts_attr"]);
  c.top_k_attr = opt_string(r["top_k_attr"]);
  c.has_shared_experts = opt_bool(r["has_shared_experts"]);
  c.shared_experts_pattern = opt_string(r["shared_experts_pattern"]);
  c.shared_experts_gate_pattern = opt_string(r["shared_experts_gate_pattern"]);
  // The keys read here: as given (checked above), in the table's order below.
  if (v.contains("top_k")) {
    const std::optional<std::int64_t> k = v["top_k"].is_boolean() ? std::nullopt : whole(v["top_k"]);
    if (k && *k >= 1) c.top_k = k;
  }
  r["top_k"] = c.top_k ? Json(*c.top_k) : Json("auto");
  if (v.contains("routed_scaling_factor") && v["routed_scaling_factor"].is_number() && !v["routed_scaling_factor"].is_boolean())
    c.routed_scaling_factor = v["routed_scaling_factor"].get<double>();
  r["routed_scaling_factor"] = v.contains("routed_scaling_factor") ? v["routed_scaling_factor"] : Json("auto");
  if (c.load_balance_coeff_given) r["load_balance_coeff"] = nullptr;
  if (v.contains("expert_w3")) {
    c.expert_w3_given = true;
    if (!v["expert_w3"].is_null()) {
      if (!v["expert_w3"].is_string())
        fail("expert_parallel.expert_w3: invalid value {}; expected a string (the up projection's weight name), null (gate and up fused in "
             "expert_w1) or no key (the preset's)",
             show(v["expert_w3"]));
      c.expert_w3 = v["expert_w3"].get<std::string>();
    }
    r["expert_w3"] = v["expert_w3"];
  }
  // The keys warned about (the section off) keep their given values in the resolved tree.
  for (const std::string& key : flagged)
    if (r.contains(key) && std::find(kReadHere.begin(), kReadHere.end(), key) == kReadHere.end()) r[key] = v[key];

  // DeepSpeed's warnings (validate_autoep_config), when the section is on.
  if (c.enabled) {
    if (c.autoep_size == 1)
      ctx.warn("expert_parallel.autoep_size",
               "autoep_size is 1: every rank holds all experts and no tokens are exchanged (DeepSpeed: \"AutoEP replacement remains enabled, "
               "but expert-parallel communication is bypassed\"); set autoep_size to a divisor of the data-parallel size to split the "
               "experts");
    if (c.top_k && c.top_k_attr)
      ctx.warn("expert_parallel.top_k_attr", fmt::format("top_k is {}: top_k_attr \"{}\" is ignored (as DeepSpeed: \"top_k is explicitly "
                                                         "set; top_k_attr will be ignored.\")",
                                                         *c.top_k, *c.top_k_attr));
    if (c.has_shared_experts == true && !c.shared_experts_pattern)
      ctx.warn("expert_parallel.has_shared_experts",
               "has_shared_experts is true but shared_experts_pattern is not set (DeepSpeed: \"Shared expert detection requires both "
               "fields.\"); give the shared experts' attribute name");
    for (const auto& [key, pattern] : {std::pair{"shared_experts_pattern", c.shared_experts_pattern},
                                       std::pair{"shared_experts_gate_pattern", c.shared_experts_gate_pattern}})
      if (pattern && c.has_shared_experts != true)
        ctx.warn(join_path(kSection, key), fmt::format("{} \"{}\" is ignored: has_shared_experts is not true (as DeepSpeed: \"Pattern will be "
                                                       "ignored.\"); set has_shared_experts to true, or remove the key",
                                                       key, *pattern));
  }

  // Ordered as the table (top_k, load_balance_coeff, routed_scaling_factor, expert_w3 in place).
  for (const FieldSpec& f : spec.fields)
    if (r.contains(f.key)) resolved[f.key] = r[f.key];
  return c;
}

}  // namespace dstrain::config
