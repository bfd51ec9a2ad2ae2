// tensor_parallel (DeepSpeed 0.19's TPTrainingConfig, AutoTPConfig.from_dict), sequence_parallel_size,
// seq_parallel_communication_data_type, and the device mesh world = data-parallel x sequence-parallel
// x tensor-parallel that the batch arithmetic divides by (docs/config.md §8.5, docs/batch.md §1).
//
// References: the defaults and messages are DeepSpeed's (deepspeed/runtime/tensor_parallel/config.py,
// deepspeed/module_inject/autotp_config.py, deepspeed/runtime/engine.py _apply_autotp_partitioning);
// the data-parallel size is world / (tp * sp), computed here by hand per case.
#include <cstdio>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string with_tp(const std::string& section, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": )" + section + extra + "}";
}

TEST(TensorParallel, AbsentSectionIsOffAndNotWritten) {
  const DsConfig c = parse(R"({"train_micro_batch_size_per_gpu": 1})", 4);
  EXPECT_FALSE(c.tensor_parallel.configured);
  EXPECT_EQ(c.tensor_parallel_size, 1);
  EXPECT_EQ(c.data_parallel_world_size, 4);
  EXPECT_FALSE(c.to_json().contains("tensor_parallel"));
}

TEST(TensorParallel, EmptySectionHasDeepSpeedsDefaults) {
  const DsConfig c = parse(with_tp("{}"), 2);
  const TensorParallelConfig& t = c.tensor_parallel;
  EXPECT_TRUE(t.configured);
  // TPTrainingConfig: autotp_size 0, tp_overlap_comm False, tp = TPConfig(tp_size 1, tp_grain_size 1),
  // injection_policy_tuple None, partition_config None, preset_model None, keep_module_on_host False,
  // replace_with_kernel_inject False.
  EXPECT_EQ(t.autotp_size, 0);
  EXPECT_FALSE(t.tp_overlap_comm);
  EXPECT_EQ(t.tp_size, 1);
  EXPECT_EQ(t.tp_grain_size, 1);
  EXPECT_FALSE(t.injection_policy_tuple);
  EXPECT_FALSE(t.partition_config);
  EXPECT_FALSE(t.preset_model);
  EXPECT_FALSE(t.keep_module_on_host);
  EXPECT_FALSE(t.replace_with_kernel_inject);
  EXPECT_FALSE(t.enabled());
  EXPECT_EQ(c.tensor_parallel_size, 1);
  EXPECT_EQ(c.data_parallel_world_size, 2);
  const Json expected = Json::parse(R"({"autotp_size": 0, "tp_overlap_comm": false,
      "tensor_parallel": {"tp_size": 1, "tp_grain_size": 1, "mpu": null, "tp_group": null},
      "injection_policy_tuple": null, "partition_config": null, "preset_model": null,
      "keep_module_on_host": false, "replace_with_kernel_inject": false})");
  EXPECT_EQ(c.to_json().at("tensor_parallel"), expected) << c.to_json().at("tensor_parallel").dump();
  EXPECT_TRUE(c.ignored_sections.empty());
}

TEST(TensorParallel, EveryKeyIsRead) {
  const DsConfig c = parse(with_tp(R"({"autotp_size": 2, "tp_overlap_comm": true, "tp": {"tp_size": 2, "tp_grain_size": 64},
      "preset_model": "LLaMA", "keep_module_on_host": true,
      "partition_config": {"use_default_specs": false, "embedding_partition_dim": 0, "lm_head_patterns": ["output"], "strict_mode": true,
        "layer_specs": [
          {"patterns": [".*\\.o_proj\\.weight$"], "partition_type": "ROW"},
          {"patterns": [".*\\.qkv_proj\\.weight$"], "partition_type": "column", "shape": [[4096, 1024, 1024], -1], "partition_dim": 0,
           "model_types": ["llama"]},
          {"patterns": [".*\\.q_norm\\.weight$"], "partition_type": "skip", "grad_allreduce": true},
          {"patterns": [".*lm_head\\.weight$"], "gather_output": true}]}})"),
                           4);
  const TensorParallelConfig& t = c.tensor_parallel;
  EXPECT_EQ(t.autotp_size, 2);
  EXPECT_TRUE(t.tp_overlap_comm);
  EXPECT_EQ(t.tp_size, 2);
  EXPECT_EQ(t.tp_grain_size, 64);
  EXPECT_EQ(t.preset_model, "llama");  // get_preset lower-cases the name
  EXPECT_TRUE(t.keep_module_on_host);
  ASSERT_TRUE(t.partition_config);
  const TpPartitionConfig& p = *t.partition_config;
  EXPECT_FALSE(p.use_default_specs);
  EXPECT_EQ(p.embedding_partition_dim, 0);
  EXPECT_EQ(p.lm_head_patterns, std::vector<std::string>{"output"});
  EXPECT_TRUE(p.strict_mode);
  ASSERT_EQ(p.layer_specs.size(), 4u);
  EXPECT_EQ(p.layer_specs[0].partition_type, TpPartitionType::row);
  EXPECT_EQ(p.layer_specs[0].effective_partition_dim(), 1);  // row: dimension 1
  EXPECT_FALSE(p.layer_specs[0].shape);
  const TpLayerSpec& qkv = p.layer_specs[1];
  EXPECT_EQ(qkv.partition_type, TpPartitionType::column);
  ASSERT_TRUE(qkv.shape);
  ASSERT_EQ(qkv.shape->size(), 2u);
  EXPECT_EQ((*qkv.shape)[0].sub_sizes, (std::vector<std::int64_t>{4096, 1024, 1024}));
  EXPECT_EQ((*qkv.shape)[1].size, -1);
  EXPECT_EQ(qkv.model_types, std::vector<std::string>{"llama"});
  EXPECT_EQ(p.layer_specs[2].partition_type, TpPartitionType::skip);
  EXPECT_TRUE(p.layer_specs[2].grad_allreduce);
  EXPECT_EQ(p.layer_specs[3].partition_type, TpPartitionType::column);  // the default
  EXPECT_TRUE(p.layer_specs[3].gather_output);
  EXPECT_EQ(c.tensor_parallel_size, 2);
  EXPECT_EQ(c.data_parallel_world_size, 2);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front().message;
}

TEST(TensorParallel, ResolvedConfigRoundTrips) {
  const DsConfig c = parse(with_tp(R"({"autotp_size": 2, "tp": {"tp_grain_size": 8}, "kernel_inject": false,
      "partition_config": {"layer_specs": [{"patterns": ["a"], "partition_type": "Row"}]}})"),
                           4);
  const Json j = c.to_json();
  EXPECT_EQ(j["tensor_parallel"]["tensor_parallel"]["tp_grain_size"], 8);  // the field name, as for every alias
  EXPECT_EQ(j["tensor_parallel"]["tensor_parallel"]["tp_size"], 1);
  EXPECT_EQ(j["tensor_parallel"]["partition_config"]["use_default_specs"], true);
  EXPECT_EQ(j["tensor_parallel"]["partition_config"]["layer_specs"][0]["partition_type"], "row");
  ConfigOptions o;
  o.world_size = 4;
  const DsConfig again = parse_ds_config(j, o);
  EXPECT_EQ(again.to_json(), j);
  // The only warning: the resolved train_batch_size counts data-parallel ranks, which DeepSpeed's
  // config-only path (no mpu) reads differently (DeviceMesh.ExplicitTrainBatchSize...).
  for (const Warning& w : again.warnings) EXPECT_EQ(w.path, "train_batch_size") << w.message;
}

TEST(TensorParallel, UnknownKeysAreErrorsInThePydanticPartsWarningsInTheDictParts) {
  const std::string m = error_of(with_tp(R"({"autotp_sise": 2})"));
  EXPECT_TRUE(contains(m, "tensor_parallel.autotp_sise: unknown key")) << m;
  EXPECT_TRUE(contains(m, "Extra inputs are not permitted")) << m;
  EXPECT_TRUE(contains(m, "did you mean \"autotp_size\"?")) << m;
  const std::string tp = error_of(with_tp(R"({"tp": {"size": 2}})"));
  EXPECT_TRUE(contains(tp, "tensor_parallel.tp.size: unknown key")) << tp;
  // partition_config and its layer specs are read with dict.get: unknown keys are ignored there.
  const DsConfig c = parse(with_tp(R"({"partition_config": {"use_default_spec": false, "layer_specs": [{"patterns": ["x"], "type": "row"}]}})"));
  EXPECT_NE(find_warning(c, "tensor_parallel.partition_config.use_default_spec", "did you mean \"use_default_specs\"?"), nullptr);
  EXPECT_NE(find_warning(c, "tensor_parallel.partition_config.layer_specs[0].type", "ignored"), nullptr);
}

TEST(TensorParallel, BothSpellingsOfAnAliasAreAnError) {
  const std::string m = error_of(with_tp(R"({"tp": {"tp_size": 1}, "tensor_parallel": {"tp_size": 1}})"));
  EXPECT_TRUE(contains(m, "both \"tensor_parallel\" and \"tp\"")) << m;
  const std::string k = error_of(with_tp(R"({"kernel_inject": false, "replace_with_kernel_inject": false})"));
  EXPECT_TRUE(contains(k, "both \"replace_with_kernel_inject\" and \"kernel_inject\"")) << k;
}

TEST(TensorParallel, ValuesDeepSpeedCannotTake) {
  const std::string dtype = error_of(with_tp(R"({"dtype": "bf16"})"));
  EXPECT_TRUE(contains(dtype, "tensor_parallel.dtype: \"bf16\"")) << dtype;
  EXPECT_TRUE(contains(dtype, "Input should be an instance of dtype")) << dtype;
  const std::string str = error_of(with_tp(R"({"autotp_size": "4"})"));
  EXPECT_TRUE(contains(str, "tensor_parallel.autotp_size: \"4\"")) << str;
  EXPECT_TRUE(contains(str, "TypeError")) << str;
  EXPECT_TRUE(contains(error_of(with_tp("null")), "tensor_parallel: null")) << error_of(with_tp("null"));
  EXPECT_TRUE(contains(error_of(with_tp(R"({"autotp_size": 2.5})")), "tensor_parallel.autotp_size")) << error_of(with_tp(R"({"autotp_size": 2.5})"));
  EXPECT_TRUE(contains(error_of(with_tp(R"({"tp": {"tp_group": "g"}})")), "tensor_parallel.tp.tp_group"))
      << error_of(with_tp(R"({"tp": {"tp_group": "g"}})"));
  EXPECT_TRUE(contains(error_of(with_tp(R"({"tp": null})")), "tensor_parallel.tp")) << error_of(with_tp(R"({"tp": null})"));
  EXPECT_TRUE(contains(error_of(with_tp(R"({"partition_config": {"layer_specs": ["row"]}})")), "tensor_parallel.partition_config.layer_specs[0]"));
}

TEST(TensorParallel, TpSizeAgainstAutotpSizeAsTheEngineChecksIt) {
  // _apply_autotp_partitioning: tp.tp_size not in (1, autotp_size) -> ValueError.
  const std::string m = error_of(with_tp(R"({"autotp_size": 4, "tp": {"tp_size": 2}})"), 4);
  EXPECT_TRUE(contains(m, "tensor_parallel.tp.tp_size (2) does not match tensor_parallel.autotp_size (4)")) << m;
  EXPECT_EQ(parse(with_tp(R"({"autotp_size": 4, "tp": {"tp_size": 4}})"), 4).tensor_parallel_size, 4);
  EXPECT_EQ(parse(with_tp(R"({"autotp_size": 4, "tp": {"tp_size": 1}})"), 4).tensor_parallel.tp_size, 4);  // overwritten as DeepSpeed does
  // The engine shards only when autotp_size > 1: tp.tp_size alone shards nothing.
  const DsConfig alone = parse(with_tp(R"({"tp": {"tp_size": 4}})"), 4);
  EXPECT_EQ(alone.tensor_parallel_size, 1);
  EXPECT_EQ(alone.data_parallel_world_size, 4);
  EXPECT_NE(find_warning(alone, "tensor_parallel.tp.tp_size", "\"autotp_size\": 4"), nullptr);
  EXPECT_EQ(parse(with_tp(R"({"autotp_size": 1})"), 4).tensor_parallel_size, 1);  // 1 = off, like 0
}

TEST(TensorParallel, PartitionTypeIsColumnRowOrSkipInAnyCase) {
  const std::string m = error_of(with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["x"], "partition_type": "diagonal"}]}})"));
  EXPECT_TRUE(contains(m, "tensor_parallel.partition_config.layer_specs[0].partition_type: invalid value \"diagonal\"")) << m;
  EXPECT_TRUE(contains(m, "\"column\", \"row\", \"skip\"")) << m;
  const DsConfig c = parse(with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["x"], "partition_type": "SKIP"}]}})"));
  EXPECT_EQ(c.tensor_parallel.partition_config->layer_specs[0].partition_type, TpPartitionType::skip);
}

TEST(TensorParallel, InvalidRegexNamesThePatternAndItsPath) {
  const std::string m = error_of(with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["ok", ".*\\.[qkv_proj\\.weight$"]}]}})"));
  EXPECT_TRUE(contains(m, "tensor_parallel.partition_config.layer_specs[0].patterns[1]")) << m;
  EXPECT_TRUE(contains(m, R"(".*\.[qkv_proj\.weight$")")) << m;
  EXPECT_TRUE(contains(m, "not a valid regular expression")) << m;
  // Python re constructs that ECMAScript lacks or reads otherwise are refused, not misread.
  const std::string z = error_of(with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["lm_head\\Z"]}]}})"));
  EXPECT_TRUE(contains(z, "layer_specs[0].patterns[0]")) << z;
  EXPECT_TRUE(contains(z, "\\Z")) << z;
  const std::string named = error_of(with_tp(R"j({"partition_config": {"layer_specs": [{"patterns": ["(?P<n>a)"]}]}})j"));
  EXPECT_TRUE(contains(named, "(?P")) << named;
  // Escaped parentheses and class members are not groups.
  EXPECT_EQ(error_of(with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["a\\(?Pb", "[(?P]"]}]}})")), "<no error>");
}

TEST(TensorParallel, PatternsMatchAsPythonsReMatch) {
  // re.match anchors at the start only: re.match("self_attn", "model.self_attn.q") is None,
  // re.match("model", "model.layers") matches, re.match(".*q_proj", "a.q_proj.weight") matches.
  const auto m = [](const std::string& p, const std::string& n) { return tp_pattern_matches(compile_tp_pattern(p, "t"), n); };
  EXPECT_FALSE(m("self_attn", "model.self_attn.q"));
  EXPECT_TRUE(m("model", "model.layers"));
  EXPECT_TRUE(m(R"(.*q_proj)", "a.q_proj.weight"));
  EXPECT_FALSE(m(R"(.*q_proj$)", "a.q_proj.weight"));
  EXPECT_TRUE(m(R"(.*\.self_attn\.[qkv]_proj\.weight$)", "model.layers.0.self_attn.k_proj.weight"));
  EXPECT_TRUE(m(R"(.*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$)", "model.layers.3.block_sparse_moe.experts.12.w3.weight"));
}

TEST(TensorParallel, ShapeIsValidatedAsTPLayerSpecDoes) {
  const auto spec = [](const std::string& body) { return with_tp(R"({"partition_config": {"layer_specs": [{"patterns": ["x"], )" + body + "}]}}"); };
  EXPECT_EQ(error_of(spec(R"("shape": [2, -1], "partition_dim": 0)")), "<no error>");
  EXPECT_EQ(error_of(spec(R"("partition_type": "row", "shape": [-1, [3, 5]])")), "<no error>");  // row: dimension 1
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [2, -1], "partition_dim": 2)")), "AutoTP partition_dim 2 is out of range for shape length 2"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [2, [3, 5]])")), "nested tuple only allowed at partition_dim=0, got at 1"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [[], -1])")), "nested tuple cannot be empty"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [[2, [1]], -1])")), "only 1-level nesting"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [[2, 0], -1])")), "sub-parameter sizes must be positive integers"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [0, -1])")), "positive integers or -1"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [-2, -1])")), "layer_specs[0].shape[0]"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": ["2", -1])")), "only integers or a tuple at partition_dim"));
  EXPECT_TRUE(contains(error_of(spec(R"("shape": [2, -1], "gather_output": true)")), "NotImplementedError"));
  EXPECT_NE(find_warning(parse(spec(R"("partition_dim": 0)")), "tensor_parallel.partition_config.layer_specs[0].partition_dim", "without a shape"),
            nullptr);
}

TEST(TensorParallel, PresetsAreDeepSpeedsAndUnknownOnesAreWarned) {
  EXPECT_EQ(tp_preset_names(), (std::vector<std::string>{"llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3"}));
  for (const auto& n : tp_preset_names()) {
    const auto p = tp_preset(n);
    ASSERT_TRUE(p) << n;
    for (const auto& s : p->layer_specs)
      for (const auto& pat : s.patterns) (void)compile_tp_pattern(pat, n);  // every preset pattern compiles here
  }
  EXPECT_EQ(tp_preset("llama")->layer_specs.size(), 4u);
  EXPECT_EQ(tp_preset("mixtral")->layer_specs.size(), 5u);
  EXPECT_EQ(tp_preset("deepseek_v2")->layer_specs.size(), 8u);
  EXPECT_EQ(tp_preset("chatglm")->layer_specs[1].shape->front().size, 3);
  const DsConfig c = parse(with_tp(R"({"autotp_size": 2, "preset_model": "lama"})"), 2);
  EXPECT_NE(find_warning(c, "tensor_parallel.preset_model", "\"lama\" is not a preset DeepSpeed knows"), nullptr);
  EXPECT_FALSE(c.tensor_parallel.effective_partition_config());  // DeepSpeed falls back to the model's tp_plan
}

TEST(TensorParallel, EffectivePartitionConfigMergesAsGetPartitionConfigObject) {
  const std::string custom = R"("partition_config": {"use_default_specs": %s, "layer_specs": [{"patterns": ["custom"]}]})";
  auto config = [&](const char* use_default) {
    char buf[256];
    std::snprintf(buf, sizeof buf, custom.c_str(), use_default);
    return parse(with_tp(std::string(R"({"autotp_size": 2, "preset_model": "llama", )") + buf + "}"), 2).tensor_parallel;
  };
  const auto merged = config("true").effective_partition_config();
  ASSERT_TRUE(merged);
  ASSERT_EQ(merged->layer_specs.size(), 5u);  // custom first, then llama's four
  EXPECT_EQ(merged->layer_specs[0].patterns[0], "custom");
  EXPECT_EQ(merged->layer_specs[1].patterns[0], R"(.*\.self_attn\.o_proj\.weight$)");
  const auto alone = config("false").effective_partition_config();
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->layer_specs.size(), 1u);
  const auto preset = parse(with_tp(R"({"autotp_size": 2, "preset_model": "qwen2"})"), 2).tensor_parallel.effective_partition_config();
  ASSERT_TRUE(preset);
  EXPECT_EQ(preset->layer_specs.size(), 4u);
}

TEST(TensorParallel, InferenceOnlyKeysAreWarned) {
  const DsConfig c = parse(with_tp(R"({"injection_policy_tuple": [], "replace_with_kernel_inject": true, "tp": {"mpu": 1}})"));
  EXPECT_NE(find_warning(c, "tensor_parallel.injection_policy_tuple", "no effect in training"), nullptr);
  EXPECT_NE(find_warning(c, "tensor_parallel.replace_with_kernel_inject", "no effect in training"), nullptr);
  EXPECT_NE(find_warning(c, "tensor_parallel.tp.mpu", "no effect"), nullptr);
}

// The mesh: world = dp x sp x tp, and the batch keys count dp ranks (train_batch_size = MBS x GAS x dp).
TEST(DeviceMesh, DataParallelSizeIsWorldOverTensorTimesSequenceParallel) {
  struct Case {
    std::int64_t tp, sp, world, dp;
  };
  // dp = world / (tp * sp), by hand.
  for (const Case k : {Case{2, 1, 4, 2}, Case{4, 1, 4, 1}, Case{1, 2, 4, 2}, Case{1, 4, 4, 1}, Case{2, 2, 4, 1}, Case{2, 2, 8, 2}}) {
    SCOPED_TRACE(::testing::Message() << "tp " << k.tp << " sp " << k.sp << " world " << k.world);
    std::string text = R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2)";
    if (k.tp > 1) text += R"(, "tensor_parallel": {"autotp_size": )" + std::to_string(k.tp) + "}";
    if (k.sp > 1) text += R"(, "sequence_parallel_size": )" + std::to_string(k.sp);
    text += "}";
    const DsConfig c = parse(text, k.world);
    EXPECT_EQ(c.data_parallel_world_size, k.dp);
    EXPECT_EQ(c.tensor_parallel_size, k.tp);
    EXPECT_EQ(c.sequence_parallel_world_size, k.sp);
    EXPECT_EQ(c.train_batch_size, 3 * 2 * k.dp);
    EXPECT_EQ(c.mesh_description(),
              fmt::format("world size {} = data-parallel {} x sequence-parallel {} x tensor-parallel {}", k.world, k.dp, k.sp, k.tp));
    EXPECT_TRUE(contains(c.summary(), c.mesh_description())) << c.summary();
    // With data_parallel_size given (DeepSpeed reads it with sequence_parallel_size), it must agree.
    if (k.sp > 1) {
      std::string with_dp = text.substr(0, text.size() - 1) + R"(, "data_parallel_size": )" + std::to_string(k.dp) + "}";
      EXPECT_EQ(parse(with_dp, k.world).data_parallel_world_size, k.dp);
    }
  }
}

TEST(DeviceMesh, SizesThatDoNotDivideTheWorldNameBothKeys) {
  const std::string tp = error_of(with_tp(R"({"autotp_size": 4})"), 6);
  EXPECT_TRUE(contains(tp, "tensor_parallel.autotp_size is 4 but the world size 6 is not a multiple of 4")) << tp;
  const std::string both = error_of(with_tp(R"({"autotp_size": 2})", R"(, "sequence_parallel_size": 2)"), 6);
  EXPECT_TRUE(contains(both, "sequence_parallel_size is 2 and tensor_parallel.autotp_size is 2 (product 4)")) << both;
  EXPECT_TRUE(contains(both, "world size 6")) << both;
  EXPECT_TRUE(contains(both, "e.g. 8")) << both;
  const std::string big = error_of(with_tp(R"({"autotp_size": 8})"), 4);
  EXPECT_TRUE(contains(big, "world size 4 is not a multiple of 8")) << big;
}

TEST(DeviceMesh, DataParallelSizeMustMatchTheMesh) {
  const std::string m = error_of(with_tp(R"({"autotp_size": 2})", R"(, "sequence_parallel_size": 2, "data_parallel_size": 4)"), 8);
  EXPECT_TRUE(contains(m, "data_parallel_size is 4 but world size 8 / (sequence_parallel_size 2 x tensor-parallel size 2) = 2")) << m;
  EXPECT_TRUE(contains(m, "set data_parallel_size to 2")) << m;
  // Without sequence_parallel_size DeepSpeed never reads it: warned, whatever its value.
  const DsConfig alone = parse(with_tp(R"({"autotp_size": 2})", R"(, "data_parallel_size": 4)"), 8);
  EXPECT_EQ(alone.data_parallel_world_size, 4);
  EXPECT_NE(find_warning(alone, "data_parallel_size", "no effect"), nullptr);
}

TEST(DeviceMesh, BatchErrorsSayWhatTheWorldSizeIs) {
  const std::string m = error_of(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                                     "tensor_parallel": {"autotp_size": 4}})",
                                 8);
  EXPECT_TRUE(contains(m, "8 != 1 * 1 * 2")) << m;
  EXPECT_TRUE(contains(m, "world size 8 = data-parallel 2 x sequence-parallel 1 x tensor-parallel 4")) << m;
}

TEST(DeviceMesh, ExplicitTrainBatchSizeWarnsWhereDeepSpeedsConfigOnlyPathDiffers) {
  // DeepSpeed's tutorial config on 8 ranks: DeepSpeedConfig without an mpu counts all 8 ranks
  // (GAS = 8 // 1 // 8 = 1); dstrain counts the 2 data-parallel ranks (GAS = 8 // 1 // 2 = 4).
  const DsConfig c = parse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                               "tensor_parallel": {"autotp_size": 4, "preset_model": "llama"}})",
                           8);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_NE(find_warning(c, "train_batch_size", "resolves micro batch 1 x gradient accumulation 1"), nullptr);
  // With only the micro batch given each rank's work is DeepSpeed's: no warning.
  EXPECT_EQ(find_warning(parse(with_tp(R"({"autotp_size": 4})"), 8), "train_batch_size"), nullptr);
}

TEST(SeqParallelCommunicationDataType, DeepSpeedsValuesAndDefault) {
  EXPECT_EQ(parse(R"({"train_batch_size": 1})").seq_parallel_communication_data_type, "fp32");
  EXPECT_EQ(parse(R"({"train_batch_size": 1, "seq_parallel_communication_data_type": "BF16"})").seq_parallel_communication_data_type, "bf16");
  // get_communication_data_type returns None for an explicit null: the model dtype.
  EXPECT_FALSE(parse(R"({"train_batch_size": 1, "seq_parallel_communication_data_type": null})").seq_parallel_communication_data_type);
  const std::string m = error_of(R"({"train_batch_size": 1, "seq_parallel_communication_data_type": "fp8"})");
  EXPECT_TRUE(contains(m, "Supported data types: ['fp16', 'bf16', 'fp32']. Got: fp8")) << m;
  // With sequence-parallel ranks DeepSpeed reduces gradients in this dtype, not communication_data_type.
  const DsConfig sp = parse(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2, "communication_data_type": "bf16"})", 4);
  EXPECT_EQ(sp.gradient_communication_data_type(), "fp32");
  const DsConfig no_sp = parse(R"({"train_micro_batch_size_per_gpu": 1, "communication_data_type": "bf16"})", 4);
  EXPECT_EQ(no_sp.gradient_communication_data_type(), "bf16");
  // Given without sequence-parallel ranks it acts nowhere: warned.
  EXPECT_NE(find_warning(parse(R"({"train_batch_size": 1, "seq_parallel_communication_data_type": "bf16"})"), "seq_parallel_communication_data_type",
                         "no effect"),
            nullptr);
  EXPECT_EQ(find_warning(sp, "seq_parallel_communication_data_type"), nullptr);
}

// The schema's layer_specs items agree with the table the parser reads each entry through (the
// agreement test walks "properties" only, not array items).
TEST(TensorParallel, SchemaLayerSpecItemsAgreeWithTheParser) {
  std::ifstream in(DSTRAIN_SOURCE_DIR "/config_schema/ds_config.schema.json");
  const Json schema = Json::parse(in);
  const Json& items = schema["properties"]["tensor_parallel"]["properties"]["partition_config"]["properties"]["layer_specs"]["items"];
  const SectionSpec spec = tp_layer_spec_section_spec();
  std::set<std::string> schema_keys, parser_keys;
  for (const auto& [k, v] : items["properties"].items()) schema_keys.insert(k);
  for (const auto& f : spec.fields) {
    parser_keys.insert(f.key);
    ASSERT_TRUE(items["properties"].contains(f.key)) << f.key;
    EXPECT_EQ(items["properties"][f.key]["default"], f.default_value) << f.key;
  }
  EXPECT_EQ(schema_keys, parser_keys);
  EXPECT_EQ(items["properties"]["partition_type"]["x-enum-canonical"].get<std::vector<std::string>>(), spec.find("partition_type")->enum_values);
  EXPECT_FALSE(schema["properties"]["tensor_parallel"]["properties"].contains("dtype"));  // no JSON value is valid (see ValuesDeepSpeedCannotTake)
}

}  // namespace
}  // namespace dstrain::config
