// expert_parallel (DeepSpeed AutoEP), read as parse_autoep_config reads it and checked as
// validate_autoep_config / build_folding_spec / validate_folding_global check it at
// deepspeed.initialize (deepspeed/module_inject/auto_ep_config.py, auto_ep_folding.py): every key's
// default, every key read, DeepSpeed's errors with its own words inside dstrain's, the warnings,
// the section off (warned, not refused), the two corpus examples of DeepSpeed's docs, and bad types
// for every key (docs/config.md §8.8).
#include <filesystem>

#include <gtest/gtest.h>

#include "config_schema/config_source.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::find_warning;

std::string with_ep(const std::string& section, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 1)" + extra + R"(, "expert_parallel": )" + section + "}";
}
DsConfig parse_ep(const std::string& section, std::int64_t world = 4, const std::string& extra = "") {
  return testing::parse(with_ep(section, extra), world);
}
std::string error_ep(const std::string& section, std::int64_t world = 4, const std::string& extra = "") {
  return testing::error_of(with_ep(section, extra), world);
}
#define EXPECT_EP_ERROR(section, needle)                                  \
  do {                                                                    \
    const std::string m_ = error_ep(section);                             \
    EXPECT_TRUE(contains(m_, needle)) << "section " << section << "\nmessage: " << m_; \
  } while (0)

TEST(ExpertParallelConfig, AbsentSectionIsOffAndNotWritten) {
  const DsConfig c = testing::parse(R"({"train_micro_batch_size_per_gpu": 1})", 4);
  EXPECT_FALSE(c.expert_parallel.present);
  EXPECT_FALSE(c.expert_parallel.enabled);
  EXPECT_EQ(c.expert_parallel.ep_size(), 1);
  EXPECT_FALSE(c.to_json().contains("expert_parallel"));
  EXPECT_EQ(c.mesh_description(), "world size 4 = data-parallel 4 x sequence-parallel 1 x tensor-parallel 1");
}

// AutoEPConfig's defaults, as parse_autoep_config fills them from param_dict.get.
TEST(ExpertParallelConfig, EmptySectionHasDeepSpeedsDefaults) {
  const DsConfig c = parse_ep("{}");
  const ExpertParallelConfig& e = c.expert_parallel;
  EXPECT_TRUE(e.present);
  EXPECT_FALSE(e.enabled);
  EXPECT_EQ(e.autoep_size, 1);
  EXPECT_EQ(e.expert_tensor_parallel_size, 1);
  EXPECT_FALSE(e.validate_folding_routing);
  EXPECT_FALSE(e.preset_model);
  EXPECT_FALSE(e.moe_layer_pattern);
  EXPECT_FALSE(e.expert_pattern);
  EXPECT_FALSE(e.router_pattern);
  EXPECT_TRUE(e.use_grouped_mm);
  EXPECT_FALSE(e.disable_triton_grouped_mm);
  EXPECT_FALSE(e.route_norm);
  EXPECT_EQ(e.route_scale, 1.0);
  EXPECT_EQ(e.score_apply, "auto");
  EXPECT_EQ(e.combine_impl, "auto");
  EXPECT_FALSE(e.num_expert_groups);
  EXPECT_FALSE(e.num_limited_groups);
  EXPECT_EQ(e.score_func, "auto");
  EXPECT_FALSE(e.top_k);
  EXPECT_FALSE(e.load_balance_coeff_given);
  EXPECT_FALSE(e.routed_scaling_factor);
  EXPECT_FALSE(e.expert_w1);
  EXPECT_FALSE(e.expert_w2);
  EXPECT_FALSE(e.expert_w3_given);
  EXPECT_FALSE(e.expert_w3);
  EXPECT_FALSE(e.num_experts_attr);
  EXPECT_FALSE(e.top_k_attr);
  EXPECT_FALSE(e.has_shared_experts);
  EXPECT_FALSE(e.shared_experts_pattern);
  EXPECT_FALSE(e.shared_experts_gate_pattern);
  EXPECT_EQ(e.ep_size(), 1);
  // The resolved tree: every default, but not expert_w3 / load_balance_coeff (their absence means something).
  const Json r = c.to_json()["expert_parallel"];
  EXPECT_EQ(r["enabled"], false);
  EXPECT_EQ(r["autoep_size"], 1);
  EXPECT_EQ(r["top_k"], "auto");
  EXPECT_EQ(r["routed_scaling_factor"], "auto");
  EXPECT_EQ(r["score_func"], "auto");
  EXPECT_EQ(r["use_grouped_mm"], true);
  EXPECT_TRUE(r["preset_model"].is_null());
  EXPECT_TRUE(r["route_norm"].is_null());
  EXPECT_EQ(r["route_scale"], 1.0);
  EXPECT_FALSE(r.contains("expert_w3"));
  EXPECT_FALSE(r.contains("load_balance_coeff"));
  EXPECT_EQ(r.size(), expert_parallel_section_spec().fields.size() - 2);
  // Not an ignored section any more: no "does not provide" warning.
  EXPECT_TRUE(c.ignored_sections.empty());
  EXPECT_EQ(find_warning(c, "expert_parallel"), nullptr);
}

TEST(ExpertParallelConfig, EveryKeyIsRead) {
  const DsConfig c = parse_ep(R"({"enabled": true, "autoep_size": 2, "expert_tensor_parallel_size": 1, "validate_folding_routing": true,
      "preset_model": "deepseek_v3", "moe_layer_pattern": "model\\.layers\\.\\d+\\.mlp", "expert_pattern": "experts",
      "router_pattern": "gate", "use_grouped_mm": false, "disable_triton_grouped_mm": true, "route_norm": false, "route_scale": 2.5,
      "score_apply": "pre", "combine_impl": "legacy_bmm", "num_expert_groups": 8, "num_limited_groups": 4, "score_func": "sigmoid",
      "top_k": 8, "load_balance_coeff": null, "routed_scaling_factor": 2.827, "expert_w1": "gate_proj", "expert_w2": "down_proj",
      "expert_w3": "up_proj", "num_experts_attr": "n_routed_experts", "top_k_attr": "num_experts_per_tok", "has_shared_experts": true,
      "shared_experts_pattern": "shared_experts", "shared_experts_gate_pattern": "shared_gate"})");
  const ExpertParallelConfig& e = c.expert_parallel;
  EXPECT_TRUE(e.enabled);
  EXPECT_EQ(e.autoep_size, 2);
  EXPECT_EQ(e.ep_size(), 2);
  EXPECT_TRUE(e.validate_folding_routing);
  EXPECT_EQ(e.preset_model, "deepseek_v3");
  EXPECT_EQ(e.moe_layer_pattern, "model\\.layers\\.\\d+\\.mlp");
  EXPECT_EQ(e.expert_pattern, "experts");
  EXPECT_EQ(e.router_pattern, "gate");
  EXPECT_FALSE(e.use_grouped_mm);
  EXPECT_TRUE(e.disable_triton_grouped_mm);
  EXPECT_EQ(e.route_norm, false);
  EXPECT_EQ(e.route_scale, 2.5);
  EXPECT_EQ(e.score_apply, "pre");
  EXPECT_EQ(e.combine_impl, "legacy_bmm");
  EXPECT_EQ(e.num_expert_groups, 8);
  EXPECT_EQ(e.num_limited_groups, 4);
  EXPECT_EQ(e.score_func, "sigmoid");
  EXPECT_EQ(e.top_k, 8);
  EXPECT_TRUE(e.load_balance_coeff_given);
  EXPECT_EQ(e.routed_scaling_factor, 2.827);
  EXPECT_EQ(e.expert_w1, "gate_proj");
  EXPECT_EQ(e.expert_w2, "down_proj");
  EXPECT_TRUE(e.expert_w3_given);
  EXPECT_EQ(e.expert_w3, "up_proj");
  EXPECT_EQ(e.num_experts_attr, "n_routed_experts");
  EXPECT_EQ(e.top_k_attr, "num_experts_per_tok");
  EXPECT_EQ(e.has_shared_experts, true);
  EXPECT_EQ(e.shared_experts_pattern, "shared_experts");
  EXPECT_EQ(e.shared_experts_gate_pattern, "shared_gate");
  // The mesh and the summary say it.
  EXPECT_EQ(c.mesh_description(),
            "world size 4 = data-parallel 4 (expert-parallel 2 x expert-data-parallel 2) x sequence-parallel 1 x tensor-parallel 1");
  EXPECT_TRUE(contains(c.summary(), "expert parallelism: autoep_size 2, preset_model deepseek_v3")) << c.summary();
  EXPECT_FALSE(contains(c.summary(), "ignored sections")) << c.summary();
  // top_k given: top_k_attr is ignored, as DeepSpeed warns.
  EXPECT_NE(find_warning(c, "expert_parallel.top_k_attr", "ignored"), nullptr);
  // The resolved tree reads back to the same config.
  const DsConfig again = parse_ds_config(c.to_json(), ConfigOptions{.world_size = 4});
  EXPECT_EQ(again.to_json(), c.to_json());
  EXPECT_EQ(again.expert_parallel.expert_w3, "up_proj");
  EXPECT_TRUE(again.expert_parallel.load_balance_coeff_given);
}

TEST(ExpertParallelConfig, EpSizeIsOneWhileDisabled) {
  const DsConfig c = parse_ep(R"({"enabled": false, "autoep_size": 4})", 2);  // 4 does not divide 2: not checked while off
  EXPECT_EQ(c.expert_parallel.autoep_size, 4);
  EXPECT_EQ(c.expert_parallel.ep_size(), 1);
  EXPECT_TRUE(contains(c.summary(), "expert parallelism: off")) << c.summary();
  EXPECT_EQ(c.mesh_description(), "world size 2 = data-parallel 2 x sequence-parallel 1 x tensor-parallel 1");
}

// "auto" written out is DeepSpeed's default value of score_func, score_apply and combine_impl (one of
// their choices), not the HF integration's placeholder that the reader refuses elsewhere.
TEST(ExpertParallelConfig, ExplicitAutoIsAValueOfItsChoices) {
  const DsConfig c = parse_ep(R"({"enabled": true, "autoep_size": 2, "score_func": "auto", "score_apply": "auto", "combine_impl": "auto"})");
  EXPECT_EQ(c.expert_parallel.score_func, "auto");
  EXPECT_EQ(c.expert_parallel.score_apply, "auto");
  EXPECT_EQ(c.expert_parallel.combine_impl, "auto");
}

// expert_w3: key absent = the preset's, null = fused gate+up, a name = a separate up projection.
TEST(ExpertParallelConfig, ExpertW3HasThreeStates) {
  const auto absent = parse_ep(R"({"enabled": true, "autoep_size": 2})").expert_parallel;
  EXPECT_FALSE(absent.expert_w3_given);
  const DsConfig fused_cfg = parse_ep(R"({"enabled": true, "autoep_size": 2, "expert_w3": null})");
  EXPECT_TRUE(fused_cfg.expert_parallel.expert_w3_given);
  EXPECT_FALSE(fused_cfg.expert_parallel.expert_w3);
  EXPECT_TRUE(fused_cfg.to_json()["expert_parallel"].contains("expert_w3"));
  EXPECT_TRUE(fused_cfg.to_json()["expert_parallel"]["expert_w3"].is_null());
  const auto named = parse_ep(R"({"enabled": true, "autoep_size": 2, "expert_w3": "w3"})").expert_parallel;
  EXPECT_EQ(named.expert_w3, "w3");
}

// load_balance_coeff: DeepSpeed raises while it parses the config, even with enabled false.
TEST(ExpertParallelConfig, LoadBalanceCoeffIsRefusedAsDeepSpeedDoes) {
  for (const char* section : {R"({"enabled": true, "autoep_size": 2, "load_balance_coeff": 0.001})", R"({"load_balance_coeff": 0.001})"}) {
    const std::string m = error_ep(section);
    EXPECT_TRUE(contains(m, "expert_parallel.load_balance_coeff is 0.001")) << m;
    EXPECT_TRUE(contains(m, "load_balance_coeff=0.001 is not supported in this AutoEP build")) << m;
    EXPECT_TRUE(contains(m, "Fix: remove the key")) << m;
  }
  EXPECT_TRUE(contains(error_ep(R"({"load_balance_coeff": "x"})"), "load_balance_coeff='x' is not supported"));
  EXPECT_TRUE(parse_ep(R"({"load_balance_coeff": null})").expert_parallel.load_balance_coeff_given);
}

TEST(ExpertParallelConfig, DeepSpeedsValueErrorsNameTheKeyTheValueAndTheFix) {
  EXPECT_EP_ERROR(R"({"enabled": true, "validate_folding_routing": "yes"})",
                  "expert_parallel.validate_folding_routing must be a boolean");
  EXPECT_EP_ERROR(R"({"enabled": true, "autoep_size": 0})", "expert_parallel.autoep_size must be a positive integer, got 0");
  EXPECT_EP_ERROR(R"({"enabled": true, "autoep_size": "4"})", "expert_parallel.autoep_size must be a positive integer, got '4'");
  EXPECT_EP_ERROR(R"({"enabled": true, "autoep_size": true})", "got True");
  EXPECT_EP_ERROR(R"({"enabled": true, "expert_tensor_parallel_size": 0})",
                  "expert_parallel.expert_tensor_parallel_size must be a positive integer, got 0");
  const std::string etp = error_ep(R"({"enabled": true, "autoep_size": 2, "expert_tensor_parallel_size": 2})");
  EXPECT_TRUE(contains(etp, "expert_parallel.expert_tensor_parallel_size is 2")) << etp;
  EXPECT_TRUE(contains(etp, "is reserved for expert-internal tensor parallelism and is not supported yet")) << etp;
  EXPECT_TRUE(contains(etp, "keeps each expert whole")) << etp;
  EXPECT_EP_ERROR(R"({"enabled": true, "preset_model": "Mixtral"})",
                  "Unknown preset_model 'Mixtral'. Available presets: ['mixtral', 'qwen3_moe', 'qwen3_5_moe', 'deepseek_v2', 'deepseek_v3']");
  EXPECT_EP_ERROR(R"({"enabled": true, "score_apply": "during"})", "score_apply must be one of ('auto', 'pre', 'post'), got 'during'");
  EXPECT_EP_ERROR(R"({"enabled": true, "combine_impl": "bmm"})",
                  "combine_impl must be one of ('auto', 'weighted_sum', 'legacy_bmm'), got 'bmm'");
  EXPECT_EP_ERROR(R"({"enabled": true, "score_func": "Softmax"})", "score_func must be one of ('auto', 'softmax', 'sigmoid'), got 'Softmax'");
  EXPECT_EP_ERROR(R"({"enabled": true, "num_limited_groups": 0})", "num_limited_groups must be >= 1, got 0");
  EXPECT_EP_ERROR(R"({"enabled": true, "num_expert_groups": 0})", "num_expert_groups must be >= 1, got 0");
  EXPECT_EP_ERROR(R"({"enabled": true, "num_expert_groups": 4, "num_limited_groups": 5})",
                  "num_limited_groups (5) must be <= num_expert_groups (4)");
  for (const char* key : {"expert_w1", "expert_w2", "expert_w3", "num_experts_attr", "top_k_attr", "router_pattern", "expert_pattern",
                          "shared_experts_pattern", "shared_experts_gate_pattern"}) {
    SCOPED_TRACE(key);
    const std::string empty = error_ep(fmt::format(R"({{"enabled": true, "{}": ""}})", key));
    EXPECT_TRUE(contains(empty, fmt::format("expert_parallel.{} is \"\"", key))) << empty;
    EXPECT_TRUE(contains(empty, fmt::format("{} must be a non-empty string", key))) << empty;
    const std::string dotted = error_ep(fmt::format(R"({{"enabled": true, "{}": "mlp.gate"}})", key));
    EXPECT_TRUE(contains(dotted, fmt::format("{} must be a direct attribute name (no dots)", key))) << dotted;
  }
  EXPECT_EP_ERROR(R"({"enabled": true, "has_shared_experts": "true"})", "has_shared_experts must be a boolean when set");
  EXPECT_EP_ERROR(R"({"enabled": true, "routed_scaling_factor": "2.5"})", "routed_scaling_factor must be a number or 'auto'");
  EXPECT_EP_ERROR(R"({"enabled": true, "routed_scaling_factor": true})", "routed_scaling_factor must be a number or 'auto'");
  EXPECT_EP_ERROR(R"({"enabled": true, "route_scale": true})", "route_scale must be a finite number");
  // top_k: an int >= 1 or "auto" (DeepSpeed would read anything else as "auto", silently).
  for (const char* bad : {"0", "\"2\"", "2.5", "true", "-1"}) EXPECT_EP_ERROR(fmt::format(R"({{"enabled": true, "top_k": {}}})", bad), "expert_parallel.top_k is");
}

TEST(ExpertParallelConfig, MoeLayerPatternIsCompiledAndMatchesWholeNames) {
  const std::string bad = error_ep(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.(\\d+\\.mlp"})");
  EXPECT_TRUE(contains(bad, "expert_parallel.moe_layer_pattern")) << bad;
  const std::string python = error_ep(R"({"enabled": true, "moe_layer_pattern": "(?P<layer>\\d+)\\.mlp"})");
  EXPECT_TRUE(contains(python, "expert_parallel.moe_layer_pattern")) << python;
  const auto e = parse_ep(R"({"enabled": true, "autoep_size": 2, "moe_layer_pattern": "model\\.layers\\.\\d+\\.mlp"})").expert_parallel;
  EXPECT_TRUE(e.moe_layer_matches("model.layers.11.mlp"));
  EXPECT_FALSE(e.moe_layer_matches("model.layers.11.mlp.experts"));  // re.fullmatch, not re.match
  EXPECT_FALSE(e.moe_layer_matches("x.model.layers.1.mlp"));
  EXPECT_FALSE(ExpertParallelConfig{}.moe_layer_matches("model.layers.0.mlp"));
}

// Config-only checks with the mesh: autoep_size divides the data-parallel size; DeepSpeed's
// preset agreement between tensor_parallel and expert_parallel.
TEST(ExpertParallelConfig, AutoepSizeMustDivideTheDataParallelSize) {
  const std::string m = error_ep(R"({"enabled": true, "autoep_size": 3})", 8);
  EXPECT_TRUE(contains(m, "expert_parallel.autoep_size 3 does not divide the data-parallel size 8")) << m;
  EXPECT_TRUE(contains(m, "one of 1, 2, 4, 8")) << m;
  EXPECT_TRUE(contains(m, "(world size 8 = data-parallel 8 x sequence-parallel 1 x tensor-parallel 1)")) << m;  // not the split that fails
  // With tensor parallelism the data-parallel ranks are world / autotp_size.
  const std::string tp = testing::error_of(
      R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}, "expert_parallel": {"enabled": true, "autoep_size": 4}})", 4);
  EXPECT_TRUE(contains(tp, "expert_parallel.autoep_size 4 does not divide the data-parallel size 2")) << tp;
  const DsConfig ok = testing::parse(
      R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}, "expert_parallel": {"enabled": true, "autoep_size": 2}})", 8);
  EXPECT_EQ(ok.expert_parallel.ep_size(), 2);
  EXPECT_EQ(ok.data_parallel_world_size, 4);
  const std::string presets = testing::error_of(
      R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"preset_model": "llama"}, "expert_parallel": {"enabled": true, "preset_model": "mixtral"}})",
      1);
  EXPECT_TRUE(contains(presets, "tensor_parallel.preset_model and expert_parallel.preset_model must match when both are set")) << presets;
}

TEST(ExpertParallelConfig, DeepSpeedsWarnings) {
  const DsConfig one = parse_ep(R"({"enabled": true})");
  EXPECT_NE(find_warning(one, "expert_parallel.autoep_size", "no tokens are exchanged"), nullptr);
  const DsConfig shared = parse_ep(R"({"enabled": true, "autoep_size": 2, "has_shared_experts": true})");
  EXPECT_NE(find_warning(shared, "expert_parallel.has_shared_experts", "shared_experts_pattern is not set"), nullptr);
  const DsConfig pattern = parse_ep(R"({"enabled": true, "autoep_size": 2, "shared_experts_pattern": "shared"})");
  EXPECT_NE(find_warning(pattern, "expert_parallel.shared_experts_pattern", "is ignored"), nullptr);
  const DsConfig order = parse_ep(R"({"enabled": true, "autoep_size": 2})", 4, R"(, "use_data_before_expert_parallelism": true)");
  EXPECT_NE(find_warning(order, "use_data_before_expert_parallelism", "E + D"), nullptr);
  const DsConfig unknown = parse_ep(R"({"enabled": true, "autoep_size": 2, "autoep_sise": 4})");
  EXPECT_NE(find_warning(unknown, "expert_parallel.autoep_sise", "ignored"), nullptr);
  EXPECT_FALSE(unknown.to_json()["expert_parallel"].contains("autoep_sise"));
}

// enabled false: DeepSpeed never validates the section, so its value errors are warnings here and
// the values stay as given.
TEST(ExpertParallelConfig, DisabledSectionWarnsInsteadOfRefusing) {
  const DsConfig c = parse_ep(R"({"enabled": false, "preset_model": "mixtrall", "score_func": "relu", "top_k": 0, "expert_tensor_parallel_size": 2})");
  EXPECT_NE(find_warning(c, "expert_parallel.preset_model", "Unknown preset_model 'mixtrall'"), nullptr);
  EXPECT_NE(find_warning(c, "expert_parallel.score_func", "refused once it is enabled"), nullptr);
  EXPECT_NE(find_warning(c, "expert_parallel.top_k"), nullptr);
  EXPECT_NE(find_warning(c, "expert_parallel.expert_tensor_parallel_size"), nullptr);
  EXPECT_EQ(c.to_json()["expert_parallel"]["score_func"], "relu");
  EXPECT_EQ(c.to_json()["expert_parallel"]["preset_model"], "mixtrall");
  EXPECT_EQ(c.expert_parallel.ep_size(), 1);
  // Turned on, the same section is refused.
  EXPECT_TRUE(contains(error_ep(R"({"enabled": true, "preset_model": "mixtrall"})"), "Unknown preset_model 'mixtrall'"));
}

// Every key given a value of a wrong JSON type, with the section on: an Error naming the key (never
// another exception, never accepted). With the section off: no exception other than dstrain's Error.
TEST(ExpertParallelConfig, WrongTypesForEveryKeyAreErrorsNamingTheKey) {
  const std::vector<std::string> bad_values = {"[]", "{}", "[1, 2]", "{\"a\": 1}"};
  for (const FieldSpec& f : expert_parallel_section_spec().fields) {
    for (const std::string& bad : bad_values) {
      SCOPED_TRACE(f.key + " = " + bad);
      const std::string section = f.key == "enabled" ? fmt::format(R"({{"enabled": {}}})", bad)
                                                      : fmt::format(R"({{"enabled": true, "autoep_size": 2, "{}": {}}})", f.key, bad);
      const std::string m = error_ep(section);
      EXPECT_TRUE(contains(m, "expert_parallel." + f.key)) << m;
      try {
        (void)parse_ep(fmt::format(R"({{"enabled": false, "{}": {}}})", f.key, bad));
      } catch (const Error&) {
      }
    }
  }
  EXPECT_TRUE(contains(error_ep("[1]"), "expert_parallel must be an object"));
  EXPECT_TRUE(contains(error_ep("\"on\""), "expert_parallel must be an object"));
}

// DeepSpeed's docs (config-json.md "Expert Parallel (AutoEP)"): the custom-model and preset-override examples.
std::filesystem::path corpus(const std::string& name) {
  return std::filesystem::path(DSTRAIN_SOURCE_DIR) / ".." / "shared" / "ds_configs" / name;
}

TEST(ExpertParallelConfig, DeepSpeedDocsCustomModelExample) {
  const auto path = corpus("DeepSpeed__docs___pages__config-json__18.json");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "corpus not found: " << path;
  Json j = load_config_file(path).tree;
  j["train_micro_batch_size_per_gpu"] = 1;
  const DsConfig c = parse_ds_config(j, ConfigOptions{.world_size = 8});
  const ExpertParallelConfig& e = c.expert_parallel;
  EXPECT_TRUE(e.enabled);
  EXPECT_EQ(e.ep_size(), 4);
  EXPECT_EQ(e.moe_layer_pattern, "model\\.layers\\.\\d+\\.moe");
  EXPECT_TRUE(e.moe_layer_matches("model.layers.3.moe"));
  EXPECT_EQ(e.router_pattern, "router");
  EXPECT_EQ(e.expert_pattern, "mlp_experts");
  EXPECT_EQ(e.expert_w1, "w1");
  EXPECT_EQ(e.expert_w2, "w2");
  EXPECT_EQ(e.expert_w3, "w3");
  EXPECT_EQ(e.num_experts_attr, "num_moe_experts");
  EXPECT_EQ(e.top_k_attr, "moe_top_k");
  EXPECT_EQ(e.has_shared_experts, false);
  EXPECT_FALSE(e.preset_model);
  EXPECT_TRUE(c.ignored_sections.empty());
  EXPECT_EQ(c.mesh_description(),
            "world size 8 = data-parallel 8 (expert-parallel 4 x expert-data-parallel 2) x sequence-parallel 1 x tensor-parallel 1");
  // On 2 ranks autoep_size 4 cannot split the data-parallel ranks.
  EXPECT_THROW((void)parse_ds_config(j, ConfigOptions{.world_size = 2}), Error);
}

TEST(ExpertParallelConfig, DeepSpeedDocsPresetOverrideExample) {
  const auto path = corpus("DeepSpeed__docs___pages__config-json__19.json");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "corpus not found: " << path;
  Json j = load_config_file(path).tree;
  j["train_micro_batch_size_per_gpu"] = 1;
  const DsConfig c = parse_ds_config(j, ConfigOptions{.world_size = 2});
  const ExpertParallelConfig& e = c.expert_parallel;
  EXPECT_TRUE(e.enabled);
  EXPECT_EQ(e.preset_model, "mixtral");
  EXPECT_EQ(e.autoep_size, 1);  // not given: DeepSpeed's default, which it warns about
  EXPECT_EQ(e.ep_size(), 1);
  EXPECT_NE(find_warning(c, "expert_parallel.autoep_size", "no tokens are exchanged"), nullptr);
  EXPECT_EQ(e.router_pattern, "router");
  EXPECT_EQ(e.expert_w1, "w1");
  EXPECT_EQ(e.expert_w2, "w2");
  EXPECT_FALSE(e.expert_w3_given);  // the preset's
  EXPECT_TRUE(c.ignored_sections.empty());
}

}  // namespace
}  // namespace dstrain::config
