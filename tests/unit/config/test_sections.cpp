// Top-level keys, aio, activation_checkpointing, checkpoint, monitors, unsupported sections,
// to_json round trip and summary (docs/config.md §3, §7, §8; docs/monitoring.md).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string with(const std::string& body) { return R"({"train_batch_size": 1, )" + body + "}"; }

TEST(TopLevel, Defaults) {
  const DsConfig c = parse(R"({"train_batch_size": 1})");
  EXPECT_TRUE(c.managed_gradient_accumulation);
  EXPECT_FALSE(c.steps_per_print.has_value());  // None since v0.15.2
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.memory_breakdown);
  EXPECT_FALSE(c.dump_state);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);  // 1.0 since v0.19.3
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_DOUBLE_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_EQ(c.gradient_allreduce_op, "mean");
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_EQ(c.seq_parallel_communication_data_type, "fp32");
  EXPECT_FALSE(c.sparse_gradients);
  EXPECT_FALSE(c.zero_allow_untested_optimizer);
  EXPECT_TRUE(c.zero_force_ds_cpu_optimizer);
  EXPECT_FALSE(c.graph_harvesting);
  EXPECT_FALSE(c.dataloader_drop_last);
  EXPECT_EQ(c.allgather_size, 500000000);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(TopLevel, UnknownKeysWarnWithSuggestion) {
  const DsConfig c = parse(with(R"("cuda_visible_devices": "0,1", "gradient_clippin": 1.0)"));
  const Warning* cuda = find_warning(c, "cuda_visible_devices", "ignored");
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(contains(cuda->message, "CUDA_VISIBLE_DEVICES"));
  EXPECT_NE(find_warning(c, "gradient_clippin", "did you mean \"gradient_clipping\"?"), nullptr);
}

TEST(TopLevel, EnumsWithDeepSpeedMessages) {
  EXPECT_EQ(parse(with(R"("gradient_allreduce_op": "SUM")")).gradient_allreduce_op, "sum");
  EXPECT_TRUE(contains(error_of(with(R"("gradient_allreduce_op": "avg")")),
                       "Invalid gradient_allreduce_op. Supported operations: ['mean', 'sum']. Got: avg"));
  EXPECT_EQ(parse(with(R"("communication_data_type": "BF16")")).communication_data_type, "bf16");
  EXPECT_TRUE(contains(error_of(with(R"("communication_data_type": "fp8")")),
                       "Invalid communication_data_type. Supported data types: ['fp16', 'bf16', 'fp32']. Got: fp8"));
  EXPECT_TRUE(contains(error_of(with(R"("gradient_allreduce_op": "sum", "optimizer": {"type": "Adam"},
                                       "zero_optimization": {"stage": 3})")),
                       "gradient_allreduce_op is \"sum\" with zero_optimization.stage 3"));
}

TEST(TopLevel, FlopsProfilerForcesWallClock) {
  const DsConfig c = parse(with(R"("flops_profiler": {"enabled": true})"));
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_EQ(c.flops_profiler.top_modules, 1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_FALSE(c.flops_profiler.output_file.has_value());
}

TEST(Aio, DefaultsAndRenamedThreadCount) {
  const DsConfig d = parse(R"({"train_batch_size": 1})");
  EXPECT_EQ(d.aio.block_size, 1048576);
  EXPECT_EQ(d.aio.queue_depth, 8);
  EXPECT_EQ(d.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(d.aio.single_submit);
  EXPECT_TRUE(d.aio.overlap_events);
  EXPECT_FALSE(d.aio.use_gds);
  const DsConfig c = parse(with(R"("aio": {"thread_count": 4})"));
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);  // DeepSpeed ignores the old name: so do we, loudly
  const Warning* w = find_warning(c, "aio.thread_count", "intra_op_parallelism");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(contains(w->message, "v0.16.4"));
  EXPECT_EQ(parse(with(R"("aio": null)")).aio.queue_depth, 8);
}

// The io_uring engine's limits (docs/offload.md §2): values it cannot run are refused before step 1,
// by check-config and train alike; what it adjusts or cannot provide is said, with the key.
TEST(Aio, EngineLimitsAndWhatItCannotProvide) {
  const DsConfig ok = parse(with(R"("aio": {"queue_depth": 32768, "intra_op_parallelism": 256, "block_size": 8388608})"));
  EXPECT_EQ(ok.aio.queue_depth, 32768);
  EXPECT_EQ(find_warning(ok, "aio.block_size", ""), nullptr);
  const std::string q = error_of(with(R"("aio": {"queue_depth": 32769})"));
  EXPECT_TRUE(contains(q, "aio.queue_depth") && contains(q, "32768")) << q;
  const std::string t = error_of(with(R"("aio": {"intra_op_parallelism": 257})"));
  EXPECT_TRUE(contains(t, "aio.intra_op_parallelism") && contains(t, "256")) << t;
  // A piece moves at most 1 GiB: beyond it is an error naming the range (it was capped silently).
  EXPECT_EQ(parse(with(R"("aio": {"block_size": 1073741824})")).aio.block_size, 1073741824);
  const std::string big = error_of(with(R"("aio": {"block_size": 1e15})"));
  EXPECT_TRUE(contains(big, "aio.block_size") && contains(big, "1073741824")) << big;
  const Warning* b = find_warning(parse(with(R"("aio": {"block_size": 6000})")), "aio.block_size", "8192-byte pieces");
  EXPECT_NE(b, nullptr);
  const DsConfig gds = parse(with(R"("aio": {"use_gds": true})"));
  EXPECT_TRUE(gds.aio.use_gds);
  const Warning* g = find_warning(gds, "aio.use_gds", "cuFile");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(contains(g->message, "pinned host buffers")) << g->message;
  EXPECT_EQ(find_warning(parse(R"({"train_batch_size": 1})"), "aio.use_gds", ""), nullptr);
}

TEST(ActivationCheckpointing, DefaultsAndRules) {
  const ActivationCheckpointingConfig d = parse(R"({"train_batch_size": 1})").activation_checkpointing;
  EXPECT_FALSE(d.partition_activations);
  EXPECT_FALSE(d.cpu_checkpointing);
  EXPECT_FALSE(d.contiguous_memory_optimization);
  EXPECT_FALSE(d.number_checkpoints.has_value());
  EXPECT_FALSE(d.synchronize_checkpoint_boundary);
  EXPECT_FALSE(d.profile);
  // Asserted by DeepSpeed only in checkpointing.configure() (explicit arguments override the JSON):
  // warnings carrying DeepSpeed's assertion text.
  const DsConfig no_partition = parse(with(R"("activation_checkpointing": {"contiguous_memory_optimization": true,
                                             "number_checkpoints": 4})"));
  EXPECT_NE(find_warning(no_partition, "activation_checkpointing.contiguous_memory_optimization",
                         "Contiguous Checkpointing is only available with partitioned activations"),
            nullptr);
  const DsConfig no_number = parse(with(R"("activation_checkpointing": {"contiguous_memory_optimization": true,
                                          "partition_activations": true})"));
  EXPECT_NE(find_warning(no_number, "activation_checkpointing.number_checkpoints",
                         "Must specify the number of layers with contiguous memory checkpointing"),
            nullptr);
  EXPECT_EQ(parse(with(R"("activation_checkpointing": {"number_checkpoints": 4})")).activation_checkpointing.number_checkpoints, 4);
  const DsConfig typo = parse(with(R"("activation_checkpointing": {"partitioned_activations": true})"));
  EXPECT_NE(find_warning(typo, "activation_checkpointing.partitioned_activations", "did you mean \"partition_activations\"?"), nullptr);
}

TEST(Checkpoint, TagValidation) {
  EXPECT_EQ(parse(R"({"train_batch_size": 1})").checkpoint.tag_validation, TagValidation::warn);
  EXPECT_EQ(parse(with(R"("checkpoint": {"tag_validation": "fail"})")).checkpoint.tag_validation, TagValidation::fail);
  EXPECT_EQ(parse(with(R"("checkpoint": {"tag_validation": "IGNORE"})")).checkpoint.tag_validation, TagValidation::ignore);
  EXPECT_TRUE(contains(error_of(with(R"("checkpoint": {"tag_validation": "strict"})")),
                       "Checkpoint config contains invalid tag_validation value of strict, expecting one of ['WARN', "
                       "'IGNORE', 'FAIL']"));
  EXPECT_TRUE(
      contains(error_of(with(R"("checkpoint": {"parallel_write": {"pipeline_stage": "true"}})")), "checkpoint.parallel_write.pipeline_stage"));
  const CheckpointConfig d = parse(R"({"train_batch_size": 1})").checkpoint;
  EXPECT_FALSE(d.load_universal);
  EXPECT_FALSE(d.use_node_local_storage);
  EXPECT_FALSE(d.parallel_write_pipeline_stage);
  EXPECT_TRUE(d.checkpoint_serialization);
}

TEST(Monitors, DefaultsAndStrictness) {
  const DsConfig d = parse(R"({"train_batch_size": 1})");
  EXPECT_FALSE(d.tensorboard.enabled);
  EXPECT_EQ(d.tensorboard.output_path, "");
  EXPECT_EQ(d.tensorboard.job_name, "DeepSpeedJobName");
  EXPECT_EQ(d.csv_monitor.job_name, "DeepSpeedJobName");
  EXPECT_EQ(d.wandb.project, "deepspeed");
  EXPECT_EQ(d.comet.samples_log_interval, 100);
  EXPECT_FALSE(d.comms_logger.configured);
  EXPECT_TRUE(d.comms_logger.prof_all);
  EXPECT_TRUE(d.timers.throughput_enabled);
  EXPECT_TRUE(d.timers.throughput_synchronized);
  const std::string m = error_of(with(R"("tensorboard": {"enabled": true, "outdir": "runs"})"));
  EXPECT_TRUE(contains(m, "tensorboard.outdir")) << m;
  EXPECT_TRUE(contains(m, "output_path")) << m;
  EXPECT_TRUE(contains(error_of(with(R"("comms_logger": {"enabled": true, "verbos": true})")), "did you mean \"verbose\"?"));
  EXPECT_NE(find_warning(parse(with(R"("wandb": {"enabled": true})")), "wandb", "does not provide"), nullptr);
  EXPECT_NE(find_warning(parse(with(R"("comet": {"enabled": true})")), "comet", "does not provide"), nullptr);
  EXPECT_TRUE(parse(with(R"("comms_logger": {})")).comms_logger.configured);
  // timers: enabled false acts (the progress line drops tokens/s); synchronized false cannot, and says so.
  const DsConfig t = parse(with(R"("timers": {"throughput": {"enabled": false, "synchronized": false}})"));
  EXPECT_FALSE(t.timers.throughput_enabled);
  EXPECT_NE(find_warning(t, "timers.throughput.synchronized", "has no effect"), nullptr);
  EXPECT_EQ(find_warning(parse(with(R"("timers": {"throughput": {"enabled": false}})")), "timers.throughput.synchronized", ""), nullptr);
}

TEST(UnsupportedSections, WarnedNeverDropped) {
  const DsConfig c = parse(with(R"("progressive_layer_drop": {"enabled": true},
                                   "sparse_attention": {"mode": "fixed"}, "curriculum_learning": {"enabled": false})"));
  EXPECT_NE(find_warning(c, "progressive_layer_drop", "does not provide"), nullptr);
  EXPECT_NE(find_warning(c, "sparse_attention", "does not provide"), nullptr);
  EXPECT_EQ(find_warning(c, "curriculum_learning"), nullptr);  // disabled: nothing is lost
  EXPECT_EQ(c.ignored_sections.size(), 3u);
  EXPECT_TRUE(c.to_json().contains("sparse_attention"));
  // pipeline is read now (config_schema/pipeline_config.h): no "does not provide", not an ignored section.
  const DsConfig p = parse(with(R"("pipeline": {"stages": 1})"));
  EXPECT_EQ(find_warning(p, "pipeline"), nullptr);
  EXPECT_TRUE(p.ignored_sections.empty());
  EXPECT_TRUE(p.to_json().contains("pipeline"));
}

TEST(UnsupportedSections, DeepSpeedValidation) {
  EXPECT_TRUE(contains(error_of(with(R"("eigenvalue": {"enabled": true})")), "temporarily disabled"));
  EXPECT_TRUE(contains(error_of(with(R"("sparse_attention": {"mode": "sliding"})")), "sparse_attention.mode"));
  EXPECT_TRUE(contains(error_of(with(R"("pipeline": {"pipe_partitioned": "yes"})")), "pipeline.pipe_partitioned"));
  EXPECT_NE(find_warning(parse(with(R"("datastates_ckpt": {})")), "datastates_ckpt"), nullptr);
  // hybrid_engine is pydantic-validated in DeepSpeed.
  EXPECT_TRUE(contains(error_of(with(R"("hybrid_engine": {"enabled": false, "max_out_token": 512})")), "did you mean \"max_out_tokens\"?"));
  EXPECT_NE(find_warning(parse(with(R"("hybrid_engine": {"enabled": true})")), "hybrid_engine", "does not provide"), nullptr);
  EXPECT_EQ(find_warning(parse(with(R"("datastates_ckpt": false)")), "datastates_ckpt"), nullptr);
}

TEST(ToJson, FullyResolvedAndRoundTrips) {
  const DsConfig c = parse(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
      "bfloat16": {"enabled": true},
      "zero_optimization": {"stage": 3, "cpu_offload_param": true, "stage3_max_live_parameters": 1e9}})",
                           4);
  const Json j = c.to_json();
  EXPECT_EQ(j["train_batch_size"], 32);
  EXPECT_EQ(j["gradient_clipping"], 1.0);
  EXPECT_TRUE(j["steps_per_print"].is_null());
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], true);
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["device"], "cpu");
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["pin_memory"], true);
  EXPECT_EQ(j["zero_optimization"]["max_live_parameters"], 1000000000);
  EXPECT_FALSE(j["zero_optimization"].contains("cpu_offload_param"));
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_FALSE(j.contains("bfloat16"));
  EXPECT_EQ(j["scheduler"]["params"]["warmup_max_lr"], 1e-4);
  EXPECT_EQ(j["optimizer"]["params"]["betas"], Json::parse("[0.9, 0.999]"));
  EXPECT_EQ(j["aio"]["intra_op_parallelism"], 1);
  // Parsing the resolved tree gives the same tree, without warnings.
  ConfigOptions o;
  o.world_size = 4;
  const DsConfig again = parse_ds_config(j, o);
  EXPECT_EQ(again.to_json(), j);
  EXPECT_TRUE(again.warnings.empty());
}

TEST(Summary, NamesTheEssentials) {
  const DsConfig c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW"}, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2},
      "cuda_visible_devices": "0"})",
                           8);
  const std::string s = c.summary();
  EXPECT_TRUE(contains(s, "train_batch_size 32 = micro batch 4 x gradient accumulation 1 x data-parallel 8")) << s;
  EXPECT_TRUE(contains(s, "ZeRO stage 2")) << s;
  EXPECT_TRUE(contains(s, "fp16 (dynamic loss scale 2^16")) << s;
  EXPECT_TRUE(contains(s, "warnings (1)")) << s;
  EXPECT_TRUE(contains(s, "cuda_visible_devices")) << s;
}

TEST(Errors, RootMustBeObject) {
  EXPECT_THROW(parse_ds_config(Json::array(), ConfigOptions{}), Error);
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": 1, "fp16": [1]})"), "fp16 must be a JSON object"));
  EXPECT_TRUE(contains(error_of(R"({"train_batch_size": 1, "optimizer": {"params": {}}})"), "optimizer.type is missing"));
}

}  // namespace
}  // namespace dstrain::config
