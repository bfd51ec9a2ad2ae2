// tensor_parallel.preset_model / partition_config against the model dstrain trains
// (train/tensor_parallel_plan.h, docs/parallelism.md §2 "partition_config").
//
// References: DeepSpeed's deepspeed/module_inject/autotp_config.py (the presets, re.match,
// find_matching_spec's first match, merge_autotp_configs) and auto_tp.py (_replace_module: a
// parameter name is the module's name + ".weight"; an nn.Embedding a rule names is sliced along
// dim 1; strict_mode's "No matching spec for ..."); layers.py _infer_subparam_logical_shapes for
// `shape`. The Hugging Face names are those of GPT2LMHeadModel and LlamaForCausalLM.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_config.h"
#include "models/llama/llama_family.h"
#include "models/model_registry.h"
#include "ops/error.h"
#include "train/tensor_parallel_plan.h"

namespace dstrain {
namespace {

// GPT-2: C 32, 2 heads; Llama: C 32, 4 heads of 8, 2 KV heads (q 32 rows, k and v 16 each), I 64.
constexpr const char* kGpt2 = "gpt2:L2-C32-H2-V256-T32";
constexpr const char* kLlama = "llama:L2-C32-H4-KV2-I64-V256-T32";

config::TensorParallelConfig tp_config(const std::string& section) {
  config::ConfigOptions options;
  options.world_size = 2;
  const std::string json = R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": )" + section + "}";
  return config::parse_ds_config(config::Json::parse(json), options).tensor_parallel;
}

std::vector<std::string> check(const std::string& section, const Architecture& model) {
  return check_tensor_parallel_partition(tp_config(section), model, 2);
}

std::string error_of(const std::string& section, const Architecture& model) {
  try {
    (void)check(section, model);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string rules(const std::string& specs, const std::string& more = "") {
  return R"({"autotp_size": 2, "partition_config": {"layer_specs": )" + specs + more + "}}";
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

bool any_line(const std::vector<std::string>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return has(l, what); });
}

std::shared_ptr<const Architecture> qwen(bool qk_norm, bool qkv_bias) {
  LlamaConfig cfg = llama_config_from_spec(kLlama);
  cfg.model_type = qk_norm ? "qwen3" : "qwen2";
  cfg.qk_norm = qk_norm;
  cfg.qkv_bias = qkv_bias;
  return std::make_shared<LlamaArchitecture>(cfg);
}

// An OLMoE (its q/k norms over the whole q and k projections, cut with the heads) of kLlama's shape.
std::shared_ptr<const Architecture> olmoe() {
  return std::make_shared<LlamaArchitecture>(llama_config_from_hf_json(R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
    "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_experts": 4,
    "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 32})",
                                                                       "olmoe"));
}

const HfParamName* find(const std::vector<HfParamName>& names, const std::string& name) {
  for (const HfParamName& p : names)
    if (p.name == name) return &p;
  return nullptr;
}

// ---- the Hugging Face names ----

TEST(HfParamNames, Gpt2IsGpt2LMHeadModelsWithGpt2ModelsAsAliases) {
  const auto names = model_architecture(kGpt2)->hf_param_names();
  const HfParamName* c_attn = find(names, "transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->aliases, std::vector<std::string>{"h.1.attn.c_attn.weight"});
  EXPECT_EQ(c_attn->module, HfModuleKind::linear);
  EXPECT_EQ(c_attn->shape, (Shape{96, 32}));
  EXPECT_EQ(c_attn->split.describe(), "rows [32/16 | 32/16 | 32/16]");
  ASSERT_NE(find(names, "transformer.wte.weight"), nullptr);
  EXPECT_EQ(find(names, "transformer.wte.weight")->module, HfModuleKind::embedding);
  EXPECT_EQ(find(names, "transformer.wte.weight")->shape, (Shape{256, 32}));  // the real vocabulary
  EXPECT_EQ(find(names, "transformer.wpe.weight")->split.kind, SplitKind::replicated);
  EXPECT_EQ(find(names, "transformer.h.0.ln_1.weight")->module, HfModuleKind::norm);
  EXPECT_EQ(find(names, "transformer.h.0.mlp.c_proj.bias")->module, HfModuleKind::bias);
  const HfParamName* head = find(names, "lm_head.weight");  // tied to wte, but its own module
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->module, HfModuleKind::linear);
  EXPECT_EQ(head->param, "wte.weight");
  EXPECT_EQ(head->split.kind, SplitKind::vocabulary);
  EXPECT_EQ(model_architecture(kGpt2)->hf_model_type(), "gpt2");
}

TEST(HfParamNames, LlamasQKVAreTheRowBlocksOfQkvProj) {
  const auto names = model_architecture(kLlama)->hf_param_names();
  EXPECT_EQ(find(names, "model.layers.0.self_attn.qkv_proj.weight"), nullptr);
  const HfParamName* q = find(names, "model.layers.0.self_attn.q_proj.weight");
  const HfParamName* k = find(names, "model.layers.0.self_attn.k_proj.weight");
  const HfParamName* v = find(names, "model.layers.0.self_attn.v_proj.weight");
  ASSERT_TRUE(q && k && v);
  EXPECT_EQ(q->shape, (Shape{32, 32}));
  EXPECT_EQ(k->shape, (Shape{16, 32}));
  EXPECT_EQ(q->split.describe(), "rows [32/16]");  // 2 query heads of 8 share each KV head
  EXPECT_EQ(v->split.describe(), "rows [16/8]");
  EXPECT_EQ(q->param, "model.layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(find(names, "model.layers.0.self_attn.o_proj.weight")->split.kind, SplitKind::columns);
  EXPECT_EQ(find(names, "model.embed_tokens.weight")->module, HfModuleKind::embedding);
  EXPECT_EQ(find(names, "model.norm.weight")->module, HfModuleKind::norm);
  EXPECT_EQ(model_architecture(kLlama)->hf_model_type(), "llama");
  const auto qwen3 = qwen(true, true)->hf_param_names();
  EXPECT_TRUE(find(qwen3, "model.layers.1.self_attn.q_norm.weight")->grad_summed);
  EXPECT_FALSE(find(qwen3, "model.layers.1.input_layernorm.weight")->grad_summed);
  EXPECT_EQ(find(qwen3, "model.layers.1.self_attn.k_proj.bias")->shape, (Shape{16}));
  EXPECT_EQ(find(qwen3, "model.layers.1.self_attn.k_proj.bias")->module, HfModuleKind::bias);
}

// Every parameter of the layers is covered by its Hugging Face tensors exactly (the padded vocabulary
// rows aside), and each tensor's split tiles its cut dimension: the table is the model.
TEST(HfParamNames, TheTensorsTileEveryParameter) {
  for (const auto& model : {model_architecture(kGpt2), model_architecture(kLlama), qwen(true, true)}) {
    SCOPED_TRACE(model->describe());
    std::map<std::string, std::int64_t> covered;
    for (const HfParamName& p : model->hf_param_names()) {
      if (p.name == "lm_head.weight" && p.param != "lm_head.weight") continue;  // tied: the embedding's storage
      covered[p.param] += p.shape.numel();
      if (!p.split.is_replicated()) {
        EXPECT_NO_THROW(split_ranges(p.split, p.shape, 3, 1, p.name)) << p.name;
      }
    }
    std::size_t params = 0;
    for (const auto& layer : model->make_layers()) {
      for (const ParamSpec& ps : layer->params()) {
        if (ps.tied()) continue;
        ++params;
        const std::int64_t padding = ps.split.kind == SplitKind::vocabulary ? (model->padded_vocab_size() - model->vocab_size()) * ps.shape[1] : 0;
        EXPECT_EQ(covered[ps.name], ps.shape.numel() - padding) << ps.name;
      }
    }
    EXPECT_EQ(covered.size(), params);
  }
}

// ---- DeepSpeed's presets ----

TEST(TensorParallelPlan, TheLlamaAndQwen2PresetsAreHonouredOnTheLlamaFamily) {
  for (const char* preset : {"llama", "qwen2", "LLaMA"}) {
    SCOPED_TRACE(preset);
    for (const auto& model : {model_architecture(kLlama), qwen(false, true), qwen(true, false)}) {
      const auto lines = check(std::string(R"({"autotp_size": 2, "preset_model": ")") + preset + "\"}", *model);
      // Its 4 rules honoured (o_proj row, q/k/v column, down_proj row, gate/up column), each deciding 2 layers' weights.
      EXPECT_TRUE(any_line(lines, "(its layer spec 0) (partition_type \"row\") honoured: 2 parameters")) << lines.at(0);
      EXPECT_TRUE(any_line(lines, "(its layer spec 1) (partition_type \"column\") honoured: 6 parameters"));
      EXPECT_TRUE(any_line(lines, "(its layer spec 3) (partition_type \"column\") honoured: 4 parameters"));
      // The embedding and the head, which the preset does not name: cut by vocabulary all the same.
      EXPECT_TRUE(any_line(lines, "no rule names 2 parameters that dstrain cuts (e.g. model.embed_tokens.weight (vocabulary)"));
    }
  }
  EXPECT_EQ(tp_presets_for(*model_architecture(kLlama)), (std::vector<std::string>{"llama", "qwen2"}));
  EXPECT_TRUE(tp_presets_for(*model_architecture(kGpt2)).empty());
}

TEST(TensorParallelPlan, PresetsOfOtherArchitecturesNameNothingAndAreRefused) {
  // bloom/chatglm (self_attention.*), mixtral (block_sparse_moe: o_proj and q/k/v match, the experts
  // do not), deepseek_v2 (q_a_proj...), phi3 (the fused qkv_proj, gate_up_proj HF's Llama does not have).
  const auto llama = model_architecture(kLlama);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bloom", "(its layer spec 0) pattern \".*\\.self_attention\\.dense\\.weight$\""},
      {"chatglm", "(its layer spec 0) pattern \".*\\.self_attention\\.dense\\.weight$\""},
      {"mixtral", "(its layer spec 2) pattern \".*\\.block_sparse_moe\\.experts\\.\\d+\\.w2\\.weight$\""},
      {"deepseek_v2", "(its layer spec 1) pattern \".*\\.self_attn\\.(q_a_proj|kv_a_proj_with_mqa)\\.weight$\""},
      {"phi3", "(its layer spec 1) pattern \".*\\.self_attn\\.qkv_proj\\.weight$\""},
  };
  for (const auto& [preset, where] : cases) {
    SCOPED_TRACE(preset);
    const std::string e = error_of(R"({"autotp_size": 2, "preset_model": ")" + preset + "\"}", *llama);
    EXPECT_TRUE(has(e, "tensor_parallel.preset_model \"" + preset + "\" " + where + " names no parameter of this llama model")) << e;
    EXPECT_TRUE(has(e, "The presets that fit it: preset_model \"llama\" or \"qwen2\"")) << e;
    EXPECT_TRUE(has(e, "model.layers.0.self_attn.q_proj.weight")) << e;  // the names it could have matched
  }
  // GPT-2: every preset, the first rule already (GPT2's modules are attn.c_attn, mlp.c_fc, ...).
  for (const std::string& preset : config::tp_preset_names()) {
    SCOPED_TRACE(preset);
    const std::string e = error_of(R"({"autotp_size": 2, "preset_model": ")" + preset + "\"}", *model_architecture(kGpt2));
    EXPECT_TRUE(has(e, "tensor_parallel.preset_model \"" + preset + "\" (its layer spec 0) pattern")) << e;
    EXPECT_TRUE(has(e, "names no parameter of this gpt2 model")) << e;
    EXPECT_TRUE(has(e, "No preset of DeepSpeed's fits a gpt2 model")) << e;
    EXPECT_TRUE(has(e, "transformer.h.0.attn.c_attn.weight")) << e;
  }
}

TEST(TensorParallelPlan, UseDefaultSpecsDecidesWhetherThePresetCounts) {
  const auto gpt2 = model_architecture(kGpt2);
  const std::string own = R"([{"patterns": [".*\\.mlp\\.c_fc\\.weight$"], "partition_type": "column"}])";
  // merge_autotp_configs: the custom rules first, then the llama preset's, which name nothing here.
  const std::string merged = R"({"autotp_size": 2, "preset_model": "llama", "partition_config": {"layer_specs": )" + own + "}}";
  EXPECT_TRUE(has(error_of(merged, *gpt2), "tensor_parallel.preset_model \"llama\" (its layer spec 0)"));
  // use_default_specs false: partition_config alone (get_partition_config_object drops the preset).
  const auto lines = check(R"({"autotp_size": 2, "preset_model": "llama", "partition_config": {"use_default_specs": false, "layer_specs": )" + own + "}}",
                           *gpt2);
  EXPECT_TRUE(any_line(lines, "preset_model \"llama\" is not used: partition_config.use_default_specs is false"));
  EXPECT_TRUE(any_line(lines, "layer_specs[0] (partition_type \"column\") honoured: 2 parameters"));
  // A custom rule that decides q_proj before the preset does: the preset's q/k/v rule still decides k and v.
  const auto llama_lines = check(R"({"autotp_size": 2, "preset_model": "llama", "partition_config": {"layer_specs":
      [{"patterns": [".*\\.q_proj\\.weight$"], "partition_type": "column"}]}})",
                                 *model_architecture(kLlama));
  EXPECT_TRUE(any_line(llama_lines, "layer_specs[0] (partition_type \"column\") honoured: 2 parameters"));
  EXPECT_TRUE(any_line(llama_lines, "(its layer spec 1) (partition_type \"column\") honoured: 4 parameters"));
}

// ---- custom rules that agree ----

TEST(TensorParallelPlan, Gpt2RulesThatAgreeAreHonoured) {
  // Megatron's split as AutoTP rules; c_attn is [q | k | v] (3 blocks of C rows): shape [3, -1].
  // Patterns may be written for GPT2Model's names too ("h.N...").
  const auto lines = check(rules(R"([
      {"patterns": [".*\\.attn\\.c_attn\\.weight$"], "partition_type": "column", "shape": [3, -1], "partition_dim": 0},
      {"patterns": ["h\\.\\d+\\.mlp\\.c_fc\\.weight$"], "partition_type": "column"},
      {"patterns": [".*\\.c_proj\\.weight$"], "partition_type": "row"},
      {"patterns": [".*\\.ln_[12f]\\."], "partition_type": "skip"},
      {"patterns": ["lm_head"], "partition_type": "column"}])"),
                           *model_architecture(kGpt2));
  EXPECT_TRUE(any_line(lines, "layer_specs[0] (partition_type \"column\", shape [3, -1], partition_dim 0) honoured: 2 parameters"));
  EXPECT_TRUE(any_line(lines, "layer_specs[1] (partition_type \"column\") honoured: 2 parameters"));
  EXPECT_TRUE(any_line(lines, "layer_specs[2] (partition_type \"row\") honoured: 4 parameters"));
  EXPECT_TRUE(any_line(lines, "layer_specs[3] (partition_type \"skip\") honoured: 10 parameters"));  // 2 x (ln_1, ln_2) x (w, b) + ln_f w, b
  EXPECT_TRUE(any_line(lines, "layer_specs[4] (partition_type \"column\") honoured: 1 parameter it decides is cut so"));
  EXPECT_TRUE(any_line(lines, "no rule names 1 parameter that dstrain cuts (e.g. transformer.wte.weight (vocabulary))"));
  // The same cut in other spellings: unequal sizes ([[32, 32, 32], -1]) and a 3-D view (3, C, C).
  for (const char* shape : {R"([[32, 32, 32], -1])", R"([3, 32, 32])"}) {
    SCOPED_TRACE(shape);
    EXPECT_NO_THROW(check(rules(std::string(R"([{"patterns": [".*c_attn\\.weight$"], "partition_type": "column", "shape": )") + shape +
                                R"(, "partition_dim": 0}])"),
                          *model_architecture(kGpt2)));
  }
}

TEST(TensorParallelPlan, LlamaRulesThatAgreeAreHonoured) {
  // A rule may name a module's weight and bias together; the bias goes with the weight.
  const auto lines = check(rules(R"([
      {"patterns": [".*\\.self_attn\\.[qkv]_proj\\."], "partition_type": "column"},
      {"patterns": [".*\\.(o_proj|down_proj)\\.weight$"], "partition_type": "row"},
      {"patterns": [".*\\.q_norm\\.weight$", ".*\\.k_norm\\.weight$"], "partition_type": "skip", "grad_allreduce": true},
      {"patterns": ["lm_head\\.weight$"], "partition_type": "column", "gather_output": true}])"),
                           *qwen(true, true));
  EXPECT_TRUE(any_line(lines, "layer_specs[0] (partition_type \"column\") honoured: 12 parameters"));  // 2 x q/k/v x (weight, bias)
  EXPECT_TRUE(any_line(lines, "layer_specs[1] (partition_type \"row\") honoured: 4 parameters"));
  EXPECT_TRUE(any_line(lines, "layer_specs[2] (partition_type \"skip\") honoured: 4 parameters"));  // Qwen3's norms: dstrain sums their gradients
  EXPECT_TRUE(any_line(lines, "layer_specs[3] (partition_type \"column\") honoured: 1 parameter"));
  EXPECT_TRUE(any_line(lines, "no rule names 5 parameters that dstrain cuts"));  // embed_tokens, 2 x gate/up
}

TEST(TensorParallelPlan, ModelTypesLimitARule) {
  const auto llama = model_architecture(kLlama);
  const auto lines = check(rules(R"([{"patterns": [".*\\.mlp\\.down_proj\\.weight$"], "partition_type": "column", "model_types": ["qwen2"]},
                                     {"patterns": [".*\\.mlp\\.down_proj\\.weight$"], "partition_type": "row", "model_types": ["LLAMA"]}])"),
                           *llama);
  EXPECT_TRUE(any_line(lines, "layer_specs[0] applies to model_types [qwen2] only; this model's model_type is \"llama\": not applied"));
  EXPECT_TRUE(any_line(lines, "layer_specs[1] (partition_type \"row\") honoured: 2 parameters"));
  // A rule that only repeats what an earlier one decides.
  const auto shadowed = check(rules(R"([{"patterns": [".*_proj\\.weight$"], "partition_type": "column", "model_types": ["qwen2"]},
      {"patterns": [".*\\.gate_proj\\.weight$"], "partition_type": "column"}, {"patterns": [".*\\.(gate|up)_proj\\.weight$"], "partition_type": "column"}])"),
                              *llama);
  EXPECT_TRUE(any_line(shadowed, "layer_specs[2] (partition_type \"column\") honoured: 2 parameters"));
  const auto none = check(rules(R"([{"patterns": [".*\\.gate_proj\\.weight$"], "partition_type": "column"}, {"patterns": [".*\\.gate_proj\\.weight$"], "partition_type": "column"}])"),
                          *llama);
  EXPECT_TRUE(any_line(none, "layer_specs[1] names only parameters an earlier rule decides (the first match wins): no effect"));
}

// ---- custom rules that contradict dstrain's cut, or ask for one it does not make ----

TEST(TensorParallelPlan, ARuleThatContradictsTheLayersCutIsRefused) {
  const auto llama = model_architecture(kLlama);
  std::string e = error_of(rules(R"([{"patterns": [".*\\.q_proj\\.weight$"], "partition_type": "row"}])"), *llama);
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.layer_specs[0] (partition_type \"row\") names model.layers.0.self_attn.q_proj.weight, "
                     "linear weight: the rule cuts its input dimension (row-parallel), but dstrain's layer cuts its output rows "
                     "(column-parallel, rows [32/16])"))
      << e;
  EXPECT_TRUE(has(e, "Fix: make it \"partition_type\": \"column\"")) << e;
  e = error_of(rules(R"([{"patterns": [".*\\.o_proj\\.weight$"], "partition_type": "column"}])"), *llama);
  EXPECT_TRUE(has(e, "names model.layers.0.self_attn.o_proj.weight") && has(e, "make it \"partition_type\": \"row\"")) << e;
  e = error_of(rules(R"([{"patterns": [".*\\.down_proj\\.weight$"], "partition_type": "skip"}])"), *llama);
  EXPECT_TRUE(has(e, "the rule keeps it whole on every rank, but dstrain's layer cuts its input columns")) << e;
  // GPT-2 (Conv1D weights read as nn.Linear's): c_fc is column-parallel.
  e = error_of(rules(R"([{"patterns": [".*\\.mlp\\.c_fc\\.weight$"], "partition_type": "row"}])"), *model_architecture(kGpt2));
  EXPECT_TRUE(has(e, "layer_specs[0] (partition_type \"row\") names transformer.h.0.mlp.c_fc.weight")) << e;
  // The head: row-parallel (LmHeadLinearAllreduce) or whole, where dstrain's is vocabulary-parallel.
  for (const char* type : {"row", "skip"}) {
    e = error_of(rules(std::string(R"([{"patterns": ["lm_head"], "partition_type": ")") + type + "\"}]"), *llama);
    EXPECT_TRUE(has(e, "names lm_head.weight") && has(e, "cuts it by vocabulary rows") && has(e, "make it \"partition_type\": \"column\"")) << e;
  }
}

TEST(TensorParallelPlan, NormsBiasesAndEmbeddingsAreNotCutByRules) {
  const auto llama = model_architecture(kLlama);
  std::string e = error_of(rules(R"([{"patterns": [".*layernorm\\.weight$"], "partition_type": "column"}])"), *llama);
  EXPECT_TRUE(has(e, "names model.layers.0.input_layernorm.weight, norm weight: a norm weight (1-D)")) << e;
  EXPECT_TRUE(has(e, "\"partition_type\": \"skip\"")) << e;
  // A bias named without its weight: AutoTP decides by the weight's name.
  e = error_of(rules(R"([{"patterns": [".*\\.k_proj\\.bias$"], "partition_type": "column"}])"), *qwen(false, true));
  EXPECT_TRUE(has(e, "names model.layers.0.self_attn.k_proj.bias, bias: a bias") && has(e, "name model.layers.0.self_attn.k_proj.weight")) << e;
  // The token embedding: AutoTP would slice its hidden dimension; dstrain's is vocabulary-parallel.
  for (const char* type : {"column", "row", "skip"}) {
    SCOPED_TRACE(type);
    e = error_of(rules(std::string(R"([{"patterns": ["model\\.embed_tokens"], "partition_type": ")") + type + "\"}]"), *llama);
    EXPECT_TRUE(has(e, "names model.embed_tokens.weight, embedding") && has(e, "dstrain's token embedding is always vocabulary-parallel")) << e;
  }
  e = error_of(rules(R"([{"patterns": [".*\\.wte\\."], "partition_type": "column"}])"), *model_architecture(kGpt2));
  EXPECT_TRUE(has(e, "cuts its hidden dimension (AutoTP slices an nn.Embedding a rule names along dim 1)")) << e;
  // wpe is whole in dstrain: skip agrees, a cut does not.
  EXPECT_NO_THROW(check(rules(R"([{"patterns": [".*wpe"], "partition_type": "skip"}])"), *model_architecture(kGpt2)));
  e = error_of(rules(R"([{"patterns": [".*wpe"], "partition_type": "row"}])"), *model_architecture(kGpt2));
  EXPECT_TRUE(has(e, "names transformer.wpe.weight") && has(e, "keeps it whole on every rank")) << e;
}

TEST(TensorParallelPlan, AShapeMustViewAFusedWeightAsDstrainsBlocks) {
  const auto gpt2 = model_architecture(kGpt2);
  // No shape: AutoTP cuts c_attn's 96 rows as one block.
  std::string e = error_of(rules(R"([{"patterns": [".*c_attn\\.weight$"], "partition_type": "column"}])"), *gpt2);
  EXPECT_TRUE(has(e, "holds 3 fused blocks along its output rows (32 | 32 | 32 of 96)")) << e;
  EXPECT_TRUE(has(e, "add \"shape\": [3, -1], \"partition_dim\": 0")) << e;
  // Other blocks than dstrain's.
  e = error_of(rules(R"([{"patterns": [".*c_attn\\.weight$"], "partition_type": "column", "shape": [[64, 32], -1], "partition_dim": 0}])"), *gpt2);
  EXPECT_TRUE(has(e, "its shape [[64, 32], -1] cuts transformer.h.0.attn.c_attn.weight as blocks of 64 | 32 rows, but dstrain's blocks are 32 | 32 | 32")) << e;
  // A shape DeepSpeed itself refuses: 96 rows do not divide into 5 sub-parameters.
  e = error_of(rules(R"([{"patterns": [".*c_attn\\.weight$"], "partition_type": "column", "shape": [5, -1], "partition_dim": 0}])"), *gpt2);
  EXPECT_TRUE(has(e, "partition_dim size 96 not divisible by sub-param count 5 (DeepSpeed's ValueError")) << e;
  // An interleaved cut: partition_dim 1 of the view (3, 32, 32).
  e = error_of(rules(R"([{"patterns": [".*c_attn\\.weight$"], "partition_type": "column", "shape": [3, [16, 16], 32], "partition_dim": 1}])"), *gpt2);
  EXPECT_TRUE(has(e, "interleaved slices")) << e;
  // A shape on an unfused weight that keeps it one block (one sub-parameter of 4 heads of 8 rows)
  // agrees; one that splits it does not — an int at partition_dim counts sub-parameters, so
  // [4, 8, 32] would be 4 sub-parameters of one head each, every one cut on its own.
  const auto llama = model_architecture(kLlama);
  EXPECT_NO_THROW(check(rules(R"([{"patterns": [".*\\.q_proj\\.weight$"], "partition_type": "column", "shape": [[4], 8, 32], "partition_dim": 0}])"), *llama));
  e = error_of(rules(R"([{"patterns": [".*\\.q_proj\\.weight$"], "partition_type": "column", "shape": [2, -1], "partition_dim": 0}])"), *llama);
  EXPECT_TRUE(has(e, "blocks of 16 | 16 rows, but dstrain's blocks are 32")) << e;
  // A row rule's shape must cut the input (the last dimension of the view).
  e = error_of(rules(R"([{"patterns": [".*\\.o_proj\\.weight$"], "partition_type": "row", "shape": [[16, 16], -1], "partition_dim": 0}])"), *llama);
  EXPECT_TRUE(has(e, "is an output dimension; a row-parallel layer is cut along its input")) << e;
  EXPECT_NO_THROW(check(rules(R"([{"patterns": [".*\\.o_proj\\.weight$"], "partition_type": "row", "shape": [-1, [32]], "partition_dim": 1}])"), *llama));
}

TEST(TensorParallelPlan, GatherOutputAndGradAllreduceOnlyWhereDstrainDoesTheSame) {
  const auto llama = model_architecture(kLlama);
  std::string e = error_of(rules(R"([{"patterns": [".*\\.up_proj\\.weight$"], "partition_type": "column", "gather_output": true}])"), *llama);
  EXPECT_TRUE(has(e, "gather_output all-gathers model.layers.0.mlp.up_proj's output shards") && has(e, "remove gather_output")) << e;
  e = error_of(rules(R"([{"patterns": [".*_layernorm\\.weight$"], "partition_type": "skip", "grad_allreduce": true}])"), *llama);
  EXPECT_TRUE(has(e, "grad_allreduce sums model.layers.0.input_layernorm.weight's gradient over the 2 tensor-parallel ranks") &&
              has(e, "multiply it by 2"))
      << e;
  // OLMoE's q/k norm weights are cut with the heads: each rank's gradient is its piece's.
  e = error_of(rules(R"([{"patterns": [".*\\.q_norm\\.weight$"], "partition_type": "skip", "grad_allreduce": true}])"), *olmoe());
  EXPECT_TRUE(has(e, "grad_allreduce sums model.layers.0.self_attn.q_norm.weight's gradient") &&
              has(e, "each rank holds the gradient of its own piece"))
      << e;
}

// OLMoE's q/k norms: dstrain cuts them with the heads by itself; a rule that names them keeps
// them "skip" (AutoTP cuts no 1-D weight), and any other cut is refused saying what dstrain does.
TEST(TensorParallelPlan, OlmoesCutQkNormsAreSkipForTheRules) {
  const auto model = olmoe();
  const std::string e = error_of(rules(R"([{"patterns": [".*\\.q_norm\\.weight$"], "partition_type": "column"}])"), *model);
  EXPECT_TRUE(has(e, "names model.layers.0.self_attn.q_norm.weight, norm weight: a norm weight (1-D)") &&
              has(e, "dstrain cuts this norm itself, with the heads of the projection it normalises (OLMoE's q/k norm, rows [32/16])"))
      << e;
  EXPECT_NO_THROW(check(rules(R"([{"patterns": [".*\\.[qk]_norm\\.weight$"], "partition_type": "skip"}])"), *model));
}

// ---- patterns that name nothing ----

TEST(TensorParallelPlan, APatternThatNamesNothingIsAnError) {
  const auto llama = model_architecture(kLlama);
  // DeepSpeed's own docstring spelling: AutoTP matches "<module>.weight", so "$" after the module name never matches.
  std::string e = error_of(rules(R"([{"patterns": [".*\\.down_proj\\.weight$", ".*\\.o_proj$"], "partition_type": "row"}])"), *llama);
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.layer_specs[0].patterns[1] \".*\\.o_proj$\" names no parameter of this llama model")) << e;
  EXPECT_TRUE(has(e, "It matches the module name \"model.layers.0.self_attn.o_proj\", but AutoTP matches parameter names")) << e;
  // A typo; and re.match anchors at the start: "self_attn" alone names nothing.
  for (const char* pattern : {R"(.*\\.mlp\\.donw_proj\\.weight$)", R"(self_attn\\.o_proj\\.weight)"}) {
    SCOPED_TRACE(pattern);
    e = error_of(rules(std::string(R"([{"patterns": [")") + pattern + R"("], "partition_type": "row"}])"), *llama);
    EXPECT_TRUE(has(e, "layer_specs[0].patterns[0]") && has(e, "names no parameter")) << e;
  }
  // Llama's names on GPT-2.
  e = error_of(rules(R"([{"patterns": [".*\\.mlp\\.up_proj\\.weight$"], "partition_type": "column"}])"), *model_architecture(kGpt2));
  EXPECT_TRUE(has(e, "layer_specs[0].patterns[0]") && has(e, "this gpt2 model") && has(e, "transformer.h.0.mlp.c_fc.weight")) << e;
  // A rule limited to other model types names nothing here, and is not an error.
  EXPECT_NO_THROW(check(rules(R"([{"patterns": [".*\\.block_sparse_moe\\.gate\\.weight$"], "partition_type": "skip", "model_types": ["mixtral"]}])"), *llama));
}

// ---- strict_mode, embedding_partition_dim, lm_head_patterns ----

TEST(TensorParallelPlan, StrictModeNamesTheFirstLinearNoRuleNames) {
  const std::string e = error_of(R"({"autotp_size": 2, "preset_model": "llama", "partition_config": {"strict_mode": true}})", *model_architecture(kLlama));
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.strict_mode: no layer spec names lm_head.weight (DeepSpeed's ValueError \"No matching spec "
                     "for lm_head.weight\")"))
      << e;
  EXPECT_TRUE(has(e, R"({"patterns": ["lm_head\\.weight"], "partition_type": "column"})")) << e;
  EXPECT_NO_THROW(check(R"({"autotp_size": 2, "preset_model": "llama", "partition_config": {"strict_mode": true, "layer_specs": [{"patterns": ["lm_head"]}]}})",
                        *model_architecture(kLlama)));
}

TEST(TensorParallelPlan, EmbeddingAndHeadKeysMustAgreeWithTheVocabularyCut) {
  const auto llama = model_architecture(kLlama);
  EXPECT_NO_THROW(check(rules("[]", R"(, "embedding_partition_dim": 1, "lm_head_patterns": ["lm_head"])"), *llama));
  std::string e = error_of(rules("[]", R"(, "embedding_partition_dim": 0)"), *llama);
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.embedding_partition_dim 0: dstrain cuts the token embedding model.embed_tokens.weight by "
                     "vocabulary rows"))
      << e;
  e = error_of(rules("[]", R"(, "lm_head_patterns": ["embed_out"])"), *llama);
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.lm_head_patterns [embed_out]: none names dstrain's output layer \"lm_head\"")) << e;
  e = error_of(rules("[]", R"(, "lm_head_patterns": ["lm_head", "model\\.embed"])"), *llama);
  EXPECT_TRUE(has(e, "tensor_parallel.partition_config.lm_head_patterns[1] \"model\\.embed\" names model.embed_tokens.weight, which is not the "
                     "output layer"))
      << e;
  // GPT-2's tied head has its own module, lm_head, as in GPT2LMHeadModel.
  EXPECT_NO_THROW(check(rules("[]", R"(, "lm_head_patterns": ["lm_head"])"), *model_architecture(kGpt2)));
}

TEST(TensorParallelPlan, NoRulesNothingToSay) {
  EXPECT_TRUE(check(R"({"autotp_size": 2})", *model_architecture(kLlama)).empty());
  EXPECT_TRUE(check(R"({"autotp_size": 2, "preset_model": "not_a_preset"})", *model_architecture(kGpt2)).empty());  // warned at parse, ignored
}

}  // namespace
}  // namespace dstrain
