// zero_optimization, offload_param, offload_optimizer: defaults, aliases, deprecated fields, legacy
// boolean form and cross-field rules (docs/zero.md §9, docs/config.md §5).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string zero(const std::string& body) {
  return R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {}}, "zero_optimization": {)" + body + "}}";
}

TEST(ZeroConfig, Defaults) {
  const DsConfig c = parse(R"({"train_batch_size": 1})");
  const ZeroConfig& z = c.zero_optimization;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 500000000);
  EXPECT_TRUE(z.use_multi_rank_bucket_allreduce);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 500000000);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_TRUE(z.load_from_fp32_weights);
  EXPECT_FALSE(z.elastic_checkpoint);
  EXPECT_FALSE(z.offload_param.has_value());
  EXPECT_FALSE(z.offload_optimizer.has_value());
  EXPECT_EQ(z.sub_group_size, 1000000000);
  EXPECT_EQ(z.prefetch_bucket_size, 50000000);  // 5e7 in code (docs say 5e8)
  EXPECT_EQ(z.param_persistence_threshold, 100000);
  EXPECT_EQ(z.model_persistence_threshold, INT64_MAX);
  EXPECT_EQ(z.max_live_parameters, 1000000000);
  EXPECT_EQ(z.max_reuse_distance, 1000000000);
  EXPECT_FALSE(z.gather_16bit_weights_on_model_save);
  EXPECT_EQ(z.module_granularity_threshold, 0);
  EXPECT_FALSE(z.use_all_reduce_for_fetch_params);
  EXPECT_FALSE(z.allgather_sequential);
  EXPECT_TRUE(z.ignore_unused_parameters);
  EXPECT_FALSE(z.legacy_stage1);
  EXPECT_FALSE(z.round_robin_gradients);
  EXPECT_EQ(z.zero_hpz_partition_size, 1);
  EXPECT_FALSE(z.zero_quantized_weights);
  EXPECT_FALSE(z.zero_quantized_nontrainable_weights);
  EXPECT_FALSE(z.zero_quantized_gradients);
  EXPECT_EQ(z.mics_shard_size, -1);
  EXPECT_FALSE(z.mics_hierarchical_params_gather);
  EXPECT_TRUE(z.memory_efficient_linear);
  EXPECT_FALSE(z.pipeline_loading_checkpoint);
  EXPECT_TRUE(z.override_module_apply);
  EXPECT_FALSE(z.log_trace_cache_warnings);
  EXPECT_FALSE(z.enable_sanity_checks);
  EXPECT_FALSE(z.save_muon_momentum_buffer_in_memory);
}

TEST(ZeroConfig, OffloadDefaults) {
  const DsConfig c = parse(zero(R"("stage": 3, "offload_param": {}, "offload_optimizer": {})"));
  const auto& p = *c.zero_optimization.offload_param;
  EXPECT_EQ(p.device, OffloadDevice::none);
  EXPECT_FALSE(p.nvme_path.has_value());
  EXPECT_EQ(p.buffer_count, 5);
  EXPECT_EQ(p.buffer_size, 100000000);
  EXPECT_EQ(p.max_in_cpu, 1000000000);
  EXPECT_TRUE(p.pin_memory);  // true since v0.19.5
  const auto& o = *c.zero_optimization.offload_optimizer;
  EXPECT_EQ(o.device, OffloadDevice::none);
  EXPECT_EQ(o.buffer_count, 4);
  EXPECT_TRUE(o.pin_memory);
  EXPECT_FALSE(o.pipeline_read);
  EXPECT_FALSE(o.pipeline_write);
  EXPECT_FALSE(o.fast_init);
  EXPECT_DOUBLE_EQ(o.ratio, 1.0);
  EXPECT_FALSE(o.super_offload);
  EXPECT_DOUBLE_EQ(o.cpuadam_cores_perc, 0.8);
}

TEST(ZeroConfig, OverlapCommDefaultsToTrueOnlyForStage3) {
  for (int stage = 0; stage <= 3; ++stage) {
    const DsConfig c = parse(zero("\"stage\": " + std::to_string(stage)));
    EXPECT_EQ(c.zero_optimization.overlap_comm, stage == 3) << stage;
  }
  EXPECT_TRUE(parse(zero(R"("stage": 2, "overlap_comm": true)")).zero_optimization.overlap_comm);
  EXPECT_FALSE(parse(zero(R"("stage": 3, "overlap_comm": false)")).zero_optimization.overlap_comm);
}

TEST(ZeroConfig, BothAliasSpellingsAccepted) {
  const DsConfig a = parse(zero(R"("stage": 3, "stage3_prefetch_bucket_size": 1000, "stage3_max_live_parameters": 7)"));
  EXPECT_EQ(a.zero_optimization.prefetch_bucket_size, 1000);
  EXPECT_EQ(a.zero_optimization.max_live_parameters, 7);
  const DsConfig b = parse(zero(R"("stage": 3, "prefetch_bucket_size": 1000, "max_live_parameters": 7)"));
  EXPECT_EQ(b.zero_optimization.prefetch_bucket_size, 1000);
  // Canonical output spelling: DeepSpeed's field name.
  EXPECT_EQ(a.to_json()["zero_optimization"]["prefetch_bucket_size"], 1000);
  EXPECT_FALSE(a.to_json()["zero_optimization"].contains("stage3_prefetch_bucket_size"));
}

TEST(ZeroConfig, BothAliasSpellingsTogetherIsError) {
  const std::string m = error_of(zero(R"("stage3_prefetch_bucket_size": 10, "prefetch_bucket_size": 10)"));
  EXPECT_TRUE(contains(m, "prefetch_bucket_size")) << m;
  EXPECT_TRUE(contains(m, "stage3_prefetch_bucket_size")) << m;
  EXPECT_TRUE(contains(m, "same field")) << m;
  EXPECT_TRUE(contains(error_of(zero(R"("stage3_gather_16bit_weights_on_model_save": true,
                                       "gather_16bit_weights_on_model_save": true)")),
                       "same field"));
}

TEST(ZeroConfig, DeprecatedCpuOffloadMapsToOffloadOptimizer) {
  const DsConfig c = parse(zero(R"("stage": 2, "cpu_offload": true)"));
  ASSERT_TRUE(c.zero_optimization.offload_optimizer.has_value());
  EXPECT_EQ(c.zero_optimization.offload_optimizer->device, OffloadDevice::cpu);
  EXPECT_TRUE(c.zero_optimization.offload_optimizer->pin_memory);  // other fields default
  EXPECT_NE(find_warning(c, "zero_optimization.cpu_offload", "Config parameter cpu_offload is deprecated use offload_optimizer instead"), nullptr);
  EXPECT_FALSE(c.to_json()["zero_optimization"].contains("cpu_offload"));
  EXPECT_EQ(c.to_json()["zero_optimization"]["offload_optimizer"]["device"], "cpu");
  const DsConfig off = parse(zero(R"("stage": 2, "cpu_offload": false)"));
  EXPECT_FALSE(off.zero_optimization.offload_optimizer.has_value());
}

TEST(ZeroConfig, DeprecatedCpuOffloadParamMapsToOffloadParam) {
  const DsConfig c = parse(zero(R"("stage": 3, "cpu_offload_param": true)"));
  ASSERT_TRUE(c.zero_optimization.offload_param.has_value());
  EXPECT_EQ(c.zero_optimization.offload_param->device, OffloadDevice::cpu);
  EXPECT_NE(find_warning(c, "zero_optimization.cpu_offload_param", "deprecated use offload_param"), nullptr);
}

TEST(ZeroConfig, DeprecatedWithReplacementIsErrorEvenIfFalse) {
  const std::string m = error_of(zero(R"("cpu_offload": false, "offload_optimizer": {"device": "cpu"})"));
  EXPECT_TRUE(contains(m,
                       "Cannot provide deprecated parameter 'cpu_offload' and replacing parameter "
                       "'offload_optimizer' together"))
      << m;
  EXPECT_TRUE(contains(error_of(zero(R"("stage": 3, "cpu_offload_param": false, "offload_param": {})")),
                       "'cpu_offload_param' and replacing parameter 'offload_param'"));
  EXPECT_TRUE(contains(error_of(zero(R"("stage3_gather_fp16_weights_on_model_save": false,
                                       "stage3_gather_16bit_weights_on_model_save": true)")),
                       "Cannot provide deprecated parameter 'stage3_gather_fp16_weights_on_model_save'"));
}

TEST(ZeroConfig, DeprecatedGatherFp16Weights) {
  const DsConfig c = parse(zero(R"("stage": 3, "stage3_gather_fp16_weights_on_model_save": true)"));
  EXPECT_TRUE(c.zero_optimization.gather_16bit_weights_on_model_save);
  EXPECT_NE(find_warning(c, "zero_optimization.stage3_gather_fp16_weights_on_model_save", "deprecated"), nullptr);
}

TEST(ZeroConfig, DeprecatedPinMemoryOnlyWarns) {
  const DsConfig c = parse(zero(R"("stage": 2, "cpu_offload_use_pin_memory": true)"));
  EXPECT_NE(find_warning(c, "zero_optimization.cpu_offload_use_pin_memory", "no effect"), nullptr);
  EXPECT_FALSE(c.zero_optimization.offload_optimizer.has_value());
}

TEST(ZeroConfig, LegacyBooleanForm) {
  const DsConfig on = parse(R"({"train_batch_size": 1, "optimizer": {"type": "Adam"}, "zero_optimization": true,
                                "allgather_size": 1000})");
  EXPECT_EQ(on.zero_optimization.stage, 1);
  EXPECT_EQ(on.zero_optimization.allgather_bucket_size, 1000);
  EXPECT_NE(find_warning(on, "zero_optimization", "deprecated boolean"), nullptr);
  const DsConfig on_default = parse(R"({"train_batch_size": 1, "optimizer": {"type": "Adam"}, "zero_optimization": true})");
  EXPECT_EQ(on_default.zero_optimization.allgather_bucket_size, 500000000);
  EXPECT_EQ(parse(R"({"train_batch_size": 1, "zero_optimization": false})").zero_optimization.stage, 0);
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": 1, "zero_optimization": null})"), "zero_optimization is null"));
}

TEST(ZeroConfig, UnknownKeyIsErrorWithSuggestion) {
  const std::string m = error_of(zero(R"("stage3_prefetch_bucket_sise": 10)"));
  EXPECT_TRUE(contains(m, "zero_optimization.stage3_prefetch_bucket_sise")) << m;
  EXPECT_TRUE(contains(m, "did you mean \"stage3_prefetch_bucket_size\"?")) << m;
  EXPECT_TRUE(contains(m, "Extra inputs are not permitted")) << m;
  // Documented but never a field.
  EXPECT_TRUE(contains(error_of(zero(R"("grad_hooks": true)")), "zero_optimization.grad_hooks"));
  // The HF docs' NVMe example nests aio here (DeepSpeed issue #2721).
  const std::string aio = error_of(zero(R"("aio": {"block_size": 1048576})"));
  EXPECT_TRUE(contains(aio, "top level")) << aio;
  EXPECT_TRUE(contains(error_of(zero(R"("stage": 3, "offload_param": {"foo": 1})")), "zero_optimization.offload_param.foo"));
}

TEST(ZeroConfig, PartialOffloadNeedsStage3) {
  const std::string m = error_of(zero(R"("stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5})"));
  EXPECT_TRUE(contains(m, "Partial offloading only supported for ZeRO Stage 3.")) << m;
  EXPECT_TRUE(contains(m, "zero_optimization.offload_optimizer.ratio")) << m;
  EXPECT_DOUBLE_EQ(parse(zero(R"("stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5})")).zero_optimization.offload_optimizer->ratio,
                   0.5);
}

TEST(ZeroConfig, NvmeNeedsPath) {
  EXPECT_TRUE(contains(error_of(zero(R"("stage": 3, "offload_param": {"device": "nvme"})")),
                       "zero_optimization.offload_param.device is \"nvme\" but nvme_path is not set"));
  EXPECT_TRUE(contains(error_of(zero(R"("stage": 3, "offload_optimizer": {"device": "nvme"})")), "offload_optimizer.nvme_path"));
}

// Both buffer_count keys alike (DeepSpeed accepts 0 and fails when it builds the swap buffers):
// 0 is an error naming the key and the minimum wherever the store swaps to NVMe, whatever the model;
// where the section does not swap (nvme as cpu below stage 3, offload_param below it) 0 is harmless.
TEST(ZeroConfig, ZeroNvmeBufferCountIsAnErrorForBothSections) {
  const std::string o = error_of(zero(R"("stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 0})"));
  EXPECT_TRUE(contains(o, "zero_optimization.offload_optimizer.buffer_count is 0") && contains(o, "at least 1")) << o;
  const std::string p = error_of(zero(R"("stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 0})"));
  EXPECT_TRUE(contains(p, "zero_optimization.offload_param.buffer_count is 0") && contains(p, "at least 1")) << p;
  EXPECT_EQ(parse(zero(R"("stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 0})"))
                .zero_optimization.offload_optimizer->buffer_count,
            0);
  EXPECT_EQ(parse(zero(R"("stage": 3, "offload_optimizer": {"device": "cpu", "buffer_count": 0})")).zero_optimization.offload_optimizer->buffer_count,
            0);
}

TEST(ZeroConfig, OffloadWarnings) {
  const DsConfig param_stage2 = parse(zero(R"("stage": 2, "offload_param": {"device": "cpu"})"));
  EXPECT_NE(find_warning(param_stage2, "zero_optimization.offload_param", "only acts at stage 3"), nullptr);
  const DsConfig nvme_stage2 = parse(zero(R"("stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"})"));
  EXPECT_NE(find_warning(nvme_stage2, "zero_optimization.offload_optimizer.device", "behaves exactly like \"cpu\""), nullptr);
}

TEST(ZeroConfig, LegacyStage1IsAnError) { EXPECT_TRUE(contains(error_of(zero(R"("legacy_stage1": true)")), "zero_optimization.legacy_stage1")); }

// ZeRO++ and MiCS act at stage 3 (docs/zero.md §10): parsed without a warning there, warned as
// ignored below it (as DeepSpeed ignores them), LoCo refused, and the one impossible combination refused.
TEST(ZeroConfig, ZeroPlusPlusAndMics) {
  const DsConfig c = parse(zero(R"("stage": 3, "zero_quantized_weights": true, "zero_hpz_partition_size": 8, "zero_quantized_gradients": true,
                                 "mics_shard_size": 4, "mics_hierarchical_params_gather": false)"));
  EXPECT_TRUE(c.zero_optimization.zero_quantized_weights);
  EXPECT_TRUE(c.zero_optimization.zero_quantized_gradients);
  EXPECT_EQ(c.zero_optimization.zero_hpz_partition_size, 8);
  EXPECT_EQ(c.zero_optimization.mics_shard_size, 4);
  EXPECT_EQ(find_warning(c, "zero_optimization", "ZeRO++"), nullptr);
  EXPECT_EQ(find_warning(c, "zero_optimization.mics_shard_size", "MiCS"), nullptr);
  EXPECT_TRUE(contains(c.summary(), "ZeRO++ / MiCS: qwZ: int8 parameter all-gathers; hpZ: a pass's later gathers within 8 ranks; qgZ: int4 "
                                    "gradient reduce-scatter across nodes; MiCS: shard groups of 4 ranks"))
      << c.summary();
  const DsConfig stage2 = parse(zero(R"("stage": 2, "zero_quantized_gradients": true)"));
  EXPECT_NE(find_warning(stage2, "zero_optimization", "at stage 2 DeepSpeed ignores them"), nullptr);
  const std::string loco = error_of(zero(R"("stage": 3, "zero_quantized_gradients": true, "zeropp_loco_param": {"err_beta": 0.8, "reset_T": 1024})"));
  EXPECT_TRUE(contains(loco, "zero_optimization.zeropp_loco_param")) << loco;
  EXPECT_TRUE(contains(loco, "LoCo")) << loco;
  const std::string both = error_of(zero(R"("stage": 3, "zero_quantized_weights": true, "mics_shard_size": 2, "mics_hierarchical_params_gather": true)"));
  EXPECT_TRUE(contains(both, "mics_hierarchical_params_gather")) << both;
}

}  // namespace
}  // namespace dstrain::config
