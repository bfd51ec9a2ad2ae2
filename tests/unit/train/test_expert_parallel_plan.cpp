// The config's expert_parallel section (DeepSpeed's AutoEP) against the model dstrain trains
// (train/expert_parallel_plan.h, docs/config.md §8.8).
//
// References: DeepSpeed's deepspeed/module_inject/auto_ep_config.py (parse_autoep_config's defaults,
// validate_autoep_post_detection), auto_ep.py (_resolve_route_scale: routed_scaling_factor when a
// number, else the model config's routed_scaling_factor, else route_scale; the presets' re.fullmatch
// of moe_layer_pattern over named_modules), auto_ep_presets/*.py (hf_model_types, moe_layer_pattern
// r"model\.layers\.\d+\.mlp", router "gate", experts "experts", score_apply "post"). The expected
// routing is written out here from those rules, not read back from the code under test; each test
// fails when the key is ignored (the model unchanged) or applied to the wrong setting.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "models/model_registry.h"
#include "ops/error.h"
#include "train/expert_parallel_plan.h"

namespace dstrain {
namespace {

// 2 layers, 4 experts of width 24, top-2 renormalised: a bare moe: descriptor is a Mixtral.
constexpr const char* kMoe = "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16";

config::ExpertParallelConfig ep_config(const std::string& section) {
  config::ConfigOptions options;
  options.world_size = 4;
  const std::string json = R"({"train_micro_batch_size_per_gpu": 1, "expert_parallel": )" + section + "}";
  return config::parse_ds_config(config::Json::parse(json), options).expert_parallel;
}

ExpertParallelPlan plan(const std::string& section, const char* model = kMoe) {
  return plan_expert_parallel(model_architecture(model), ep_config(section));
}

std::string error_of(const std::string& section, const char* model = kMoe) {
  try {
    (void)plan(section, model);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

bool any_line(const std::vector<std::string>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return has(l, what); });
}

const MoeConfig& moe_of(const ExpertParallelPlan& p) {
  const MoeConfig* m = p.model->moe_config();
  EXPECT_NE(m, nullptr);
  return *m;
}

// The descriptor's own routing, which the tests below change one key at a time.
TEST(ExpertParallelPlan, TheDescriptorIsAMixtralWithTopTwoRenormalisedSoftmax) {
  const auto model = model_architecture(kMoe);
  EXPECT_EQ(model->hf_model_type(), "mixtral");
  const MoeConfig& m = *model->moe_config();
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.score, MoeConfig::Score::softmax);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.routed_scaling_factor, 1.0);
  EXPECT_EQ(m.n_group, 1);
  EXPECT_EQ(m.topk_group, 1);
  // -nonorm makes it a Qwen-MoE (Qwen's and OLMoE's default routing).
  EXPECT_EQ(model_architecture("moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-nonorm")->hf_model_type(), "qwen3_moe");
}

TEST(ExpertParallelPlan, DisabledOrAbsentLeavesTheModelAlone) {
  const auto model = model_architecture(kMoe);
  // enabled false: DeepSpeed ignores every other key, even ones that would be refused.
  for (const std::string& section : {std::string(R"({"enabled": false, "top_k": 1, "score_apply": "pre", "router_pattern": "router"})"),
                                    std::string(R"({"autoep_size": 2})"), std::string("null")}) {
    SCOPED_TRACE(section);
    const ExpertParallelPlan p = plan_expert_parallel(model, ep_config(section));
    EXPECT_EQ(p.model.get(), model.get());
    EXPECT_TRUE(p.lines.empty());
  }
  // A dense model with the section disabled: nothing to refuse.
  const auto dense = model_architecture("llama:L2-C32-H4-KV2-I48-V96-T16");
  EXPECT_EQ(plan_expert_parallel(dense, ep_config(R"({"enabled": false})")).model.get(), dense.get());
}

TEST(ExpertParallelPlan, EnabledWithEveryKeyAutoKeepsTheModelsRouting) {
  const auto model = model_architecture(kMoe);
  for (const std::string& section :
       {std::string(R"({"enabled": true})"), std::string(R"({"enabled": true, "autoep_size": 2, "top_k": "auto",
         "routed_scaling_factor": "auto", "preset_model": "mixtral"})"),
        // The keys given as the model has them change nothing either.
        std::string(R"({"enabled": true, "top_k": 2, "score_func": "softmax", "route_norm": true, "num_expert_groups": 1,
         "num_limited_groups": 1, "score_apply": "post", "moe_layer_pattern": "model\\.layers\\.\\d+\\.mlp", "router_pattern": "gate",
         "expert_pattern": "experts"})")}) {
    SCOPED_TRACE(section);
    const ExpertParallelPlan p = plan_expert_parallel(model, ep_config(section));
    EXPECT_EQ(p.model.get(), model.get());
    EXPECT_TRUE(p.lines.empty());
  }
}

TEST(ExpertParallelPlan, TopKOverridesNumExpertsPerTok) {
  const auto model = model_architecture(kMoe);
  const ExpertParallelPlan p = plan_expert_parallel(model, ep_config(R"({"enabled": true, "top_k": 1})"));
  EXPECT_EQ(moe_of(p).top_k, 1);
  EXPECT_EQ(model->moe_config()->top_k, 2);  // the original unchanged
  ASSERT_EQ(p.lines.size(), 1u);
  EXPECT_TRUE(has(p.lines[0], "top_k 1")) << p.lines[0];
  EXPECT_TRUE(has(p.lines[0], "the model's 2")) << p.lines[0];
  // Only top_k: the rest of the routing and the shape stay.
  EXPECT_EQ(moe_of(p).score, MoeConfig::Score::softmax);
  EXPECT_TRUE(moe_of(p).norm_topk_prob);
  EXPECT_EQ(p.model->stored_parameter_count(), model->stored_parameter_count());
  EXPECT_EQ(p.model->hf_model_type(), "mixtral");
  EXPECT_EQ(moe_of(plan(R"({"enabled": true, "top_k": 4})")).top_k, 4);  // every expert: allowed
}

TEST(ExpertParallelPlan, ScoreFuncSigmoid) {
  const ExpertParallelPlan p = plan(R"({"enabled": true, "score_func": "sigmoid"})");
  EXPECT_EQ(moe_of(p).score, MoeConfig::Score::sigmoid);
  EXPECT_TRUE(any_line(p.lines, "score_func sigmoid")) << (p.lines.empty() ? "" : p.lines[0]);
  // And back: a sigmoid model with score_func softmax.
  EXPECT_EQ(moe_of(plan(R"({"enabled": true, "score_func": "softmax"})", "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-sigmoid")).score,
            MoeConfig::Score::softmax);
}

TEST(ExpertParallelPlan, RouteNormIsNormTopkProb) {
  const ExpertParallelPlan off = plan(R"({"enabled": true, "route_norm": false})");
  EXPECT_FALSE(moe_of(off).norm_topk_prob);
  EXPECT_TRUE(any_line(off.lines, "route_norm false"));
  const ExpertParallelPlan on = plan(R"({"enabled": true, "route_norm": true})", "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-nonorm");
  EXPECT_TRUE(moe_of(on).norm_topk_prob);
}

// _resolve_route_scale: a number in routed_scaling_factor wins; "auto" takes the model's
// routed_scaling_factor, and route_scale only where the model has none.
TEST(ExpertParallelPlan, RoutedScalingFactorAndRouteScale) {
  const ExpertParallelPlan given = plan(R"({"enabled": true, "routed_scaling_factor": 2.5})");
  EXPECT_EQ(moe_of(given).routed_scaling_factor, 2.5);
  EXPECT_TRUE(any_line(given.lines, "routed scale 2.5"));
  // A number overrides route_scale too (DeepSpeed warns "routed_scaling_factor=... overrides route_scale").
  EXPECT_EQ(moe_of(plan(R"({"enabled": true, "routed_scaling_factor": 2.5, "route_scale": 3})")).routed_scaling_factor, 2.5);
  // "auto" and a model without routed_scaling_factor: route_scale.
  const ExpertParallelPlan scale = plan(R"({"enabled": true, "route_scale": 3, "routed_scaling_factor": "auto"})");
  EXPECT_EQ(moe_of(scale).routed_scaling_factor, 3.0);
  EXPECT_TRUE(any_line(scale.lines, "routed scale 3"));
  // "auto" and a model with one (a DeepSeek-style -RS2): the model's, route_scale ignored.
  const auto deepseek = model_architecture("moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-RS2");
  const ExpertParallelPlan model_wins = plan_expert_parallel(deepseek, ep_config(R"({"enabled": true, "route_scale": 3})"));
  EXPECT_EQ(model_wins.model.get(), deepseek.get());
  EXPECT_EQ(moe_of(model_wins).routed_scaling_factor, 2.0);
  // A number still overrides the model's.
  EXPECT_EQ(moe_of(plan_expert_parallel(deepseek, ep_config(R"({"enabled": true, "routed_scaling_factor": 0.5})"))).routed_scaling_factor, 0.5);
}

TEST(ExpertParallelPlan, ExpertGroupsAreNGroupAndTopkGroup) {
  const ExpertParallelPlan p = plan(R"({"enabled": true, "num_expert_groups": 2, "num_limited_groups": 1})");
  EXPECT_EQ(moe_of(p).n_group, 2);
  EXPECT_EQ(moe_of(p).topk_group, 1);
  EXPECT_TRUE(any_line(p.lines, "num_expert_groups 2"));
  const ExpertParallelPlan both = plan(R"({"enabled": true, "num_expert_groups": 4, "num_limited_groups": 2})");
  EXPECT_EQ(moe_of(both).n_group, 4);
  EXPECT_EQ(moe_of(both).topk_group, 2);
  EXPECT_TRUE(any_line(both.lines, "num_limited_groups 2"));
  // Several keys at once: one line naming each.
  const ExpertParallelPlan many = plan(R"({"enabled": true, "top_k": 1, "score_func": "sigmoid", "route_norm": false})");
  ASSERT_EQ(many.lines.size(), 1u);
  for (const char* k : {"top_k 1", "score_func sigmoid", "route_norm false"}) EXPECT_TRUE(has(many.lines[0], k)) << many.lines[0];
}

// ---- refused before step 1, naming the key ----

TEST(ExpertParallelPlan, ADenseModelIsRefused) {
  const std::string e = error_of(R"({"enabled": true})", "llama:L2-C32-H4-KV2-I48-V96-T16");
  EXPECT_TRUE(has(e, "expert_parallel.enabled")) << e;
  EXPECT_TRUE(has(e, "no MoE layers detected")) << e;
  EXPECT_TRUE(has(error_of(R"({"enabled": true, "autoep_size": 2})", "gpt2:L2-C32-H2-V96-T16"), "expert_parallel.enabled"));
}

TEST(ExpertParallelPlan, APresetForAnotherModelTypeIsRefused) {
  // qwen3_moe's hf_model_types are qwen3_moe / qwen2_moe; the descriptor is a mixtral.
  const std::string e = error_of(R"({"enabled": true, "preset_model": "qwen3_moe"})");
  EXPECT_TRUE(has(e, "expert_parallel.preset_model \"qwen3_moe\"")) << e;
  EXPECT_TRUE(has(e, "mixtral")) << e;
  EXPECT_TRUE(has(e, "use preset_model \"mixtral\"")) << e;
  EXPECT_TRUE(has(error_of(R"({"enabled": true, "preset_model": "deepseek_v3"})"), "deepseek_v3")) << e;
  // The matching presets are accepted: mixtral for the bare descriptor, qwen3_moe for -nonorm.
  EXPECT_NO_THROW(plan(R"({"enabled": true, "preset_model": "mixtral"})"));
  EXPECT_NO_THROW(plan(R"({"enabled": true, "preset_model": "qwen3_moe"})", "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-nonorm"));
  EXPECT_TRUE(has(error_of(R"({"enabled": true, "preset_model": "mixtral"})", "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-nonorm"),
                  "expert_parallel.preset_model \"mixtral\""));
}

TEST(ExpertParallelPlan, AMoeLayerPatternThatMissesTheLayersIsRefused) {
  // DeepSpeed's custom-model example: "model\\.layers\\.\\d+\\.moe" finds no module of this model.
  const std::string e = error_of(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.\\d+\\.moe"})");
  EXPECT_TRUE(has(e, "expert_parallel.moe_layer_pattern")) << e;
  EXPECT_TRUE(has(e, "model.layers.0.mlp, model.layers.1.mlp")) << e;
  // A pattern matching one layer only leaves the other out: refused, naming it.
  const std::string one = error_of(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.0\\.mlp"})");
  EXPECT_TRUE(has(one, "model.layers.1.mlp")) << one;
  EXPECT_FALSE(has(one, "model.layers.0.mlp,")) << one;
  // re.fullmatch: a prefix of the name is no match.
  EXPECT_TRUE(has(error_of(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.\\d+"})"), "expert_parallel.moe_layer_pattern"));
  EXPECT_NO_THROW(plan(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.\\d+\\.mlp"})"));
  EXPECT_NO_THROW(plan(R"({"enabled": true, "moe_layer_pattern": ".*mlp"})"));
  // Only the sparse layers must match: with the first layer dense, "model\\.layers\\.1\\.mlp" is enough.
  EXPECT_NO_THROW(plan(R"({"enabled": true, "moe_layer_pattern": "model\\.layers\\.1\\.mlp"})", "moe:L2-C32-H4-KV2-E4-K2-I24-V96-T16-dense1"));
}

TEST(ExpertParallelPlan, RouterAndExpertPatternsNameTheModelsModules) {
  const std::string router = error_of(R"({"enabled": true, "router_pattern": "router"})");
  EXPECT_TRUE(has(router, "expert_parallel.router_pattern \"router\"")) << router;
  EXPECT_TRUE(has(router, "\"gate\"")) << router;
  const std::string experts = error_of(R"({"enabled": true, "expert_pattern": "mlp_experts"})");
  EXPECT_TRUE(has(experts, "expert_parallel.expert_pattern \"mlp_experts\"")) << experts;
  EXPECT_TRUE(has(experts, "\"experts\"")) << experts;
  EXPECT_NO_THROW(plan(R"({"enabled": true, "router_pattern": "gate", "expert_pattern": "experts"})"));
}

TEST(ExpertParallelPlan, ScoreApplyPreIsRefused) {
  const std::string e = error_of(R"({"enabled": true, "score_apply": "pre"})");
  EXPECT_TRUE(has(e, "expert_parallel.score_apply \"pre\"")) << e;
  EXPECT_NO_THROW(plan(R"({"enabled": true, "score_apply": "post"})"));
}

TEST(ExpertParallelPlan, TopKAboveTheExpertsIsRefused) {
  const std::string e = error_of(R"({"enabled": true, "top_k": 9})");
  EXPECT_TRUE(has(e, "expert_parallel.top_k 9")) << e;
  EXPECT_TRUE(has(e, "4 experts")) << e;
  EXPECT_TRUE(has(error_of(R"({"enabled": true, "top_k": 5})"), "expert_parallel.top_k 5"));
}

TEST(ExpertParallelPlan, GroupsThatDoNotFitTheExpertsAreRefusedByTheModelsValidation) {
  const std::string e = error_of(R"({"enabled": true, "num_expert_groups": 3, "num_limited_groups": 1})");
  EXPECT_TRUE(has(e, "expert_parallel")) << e;
  EXPECT_TRUE(has(e, "num_expert_groups 3")) << e;
  EXPECT_TRUE(has(e, "n_group = 3")) << e;  // the model's own validation, wrapped
  // 2 groups of 2, 1 eligible: fewer than top_k 4 experts are eligible.
  const std::string few = error_of(R"({"enabled": true, "num_expert_groups": 2, "num_limited_groups": 1, "top_k": 4})");
  EXPECT_TRUE(has(few, "topk_group")) << few;
}

}  // namespace
}  // namespace dstrain
