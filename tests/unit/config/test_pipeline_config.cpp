// pipeline (DeepSpeed 0.19's get_pipeline_config: defaults overlaid by the user's keys, unknown keys
// kept; PipelineEngine's bool assertions), the stage count from pipeline.stages or --pipeline-stages
// (ConfigOptions::pipeline_stages), and the batch arithmetic of a pipeline: DeepSpeed's PipelineEngine
// passes its grid as the mpu, so the data-parallel size is world / (stages x tensor-parallel x
// sequence-parallel), computed here by hand per case (docs/config.md §8.6, docs/batch.md §1).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::find_warning;

DsConfig parse_with(const std::string& json, std::int64_t world, std::optional<std::int64_t> stages = std::nullopt) {
  ConfigOptions o;
  o.world_size = world;
  o.pipeline_stages = stages;
  return parse_ds_config(Json::parse(json), o);
}

std::string error_with(const std::string& json, std::int64_t world = 1, std::optional<std::int64_t> stages = std::nullopt) {
  try {
    (void)parse_with(json, world, stages);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string with_pipeline(const std::string& section, const std::string& extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 1)" + extra + R"(, "pipeline": )" + section + "}";
}

TEST(PipelineConfig, AbsentSectionIsOneStageAndNotWritten) {
  const DsConfig c = parse_with(R"({"train_micro_batch_size_per_gpu": 1})", 4);
  EXPECT_FALSE(c.pipeline.present);
  EXPECT_EQ(c.pipeline_parallel_size, 1);
  EXPECT_EQ(c.data_parallel_world_size, 4);
  EXPECT_FALSE(c.to_json().contains("pipeline"));
  EXPECT_EQ(find_warning(c, "pipeline.stages"), nullptr);
}

TEST(PipelineConfig, EmptySectionHasDeepSpeedsDefaults) {
  const DsConfig c = parse_with(with_pipeline("{}"), 2, 2);
  const PipelineConfig& p = c.pipeline;
  // get_pipeline_config: stages "auto", partition "best", seed_layers False, activation_checkpoint_interval 0,
  // pipe_partitioned True, grad_partitioned True; PipelineEngine: use_reentrant True when unset.
  EXPECT_TRUE(p.present);
  EXPECT_EQ(p.stages, 0);
  EXPECT_EQ(p.partition, "parameters");  // "best" is read as "parameters"
  EXPECT_FALSE(p.seed_layers);
  EXPECT_EQ(p.activation_checkpoint_interval, 0);
  EXPECT_TRUE(p.pipe_partitioned);
  EXPECT_TRUE(p.grad_partitioned);
  EXPECT_TRUE(p.use_reentrant);
  const Json r = c.to_json()["pipeline"];
  EXPECT_EQ(r["stages"], "auto");
  EXPECT_EQ(r["partition"], "best");
  EXPECT_EQ(r["pipe_partitioned"], true);
  EXPECT_EQ(r["use_reentrant"], true);
}

TEST(PipelineConfig, ValuesAreRead) {
  const DsConfig c = parse_with(with_pipeline(R"({"stages": 2, "partition": "uniform", "seed_layers": true, "activation_checkpoint_interval": 3,
      "pipe_partitioned": false, "grad_partitioned": false, "use_reentrant": false})"),
                                4);
  const PipelineConfig& p = c.pipeline;
  EXPECT_EQ(p.stages, 2);
  EXPECT_EQ(c.pipeline_parallel_size, 2);
  EXPECT_EQ(p.partition, "uniform");
  EXPECT_TRUE(p.seed_layers);
  EXPECT_EQ(p.activation_checkpoint_interval, 3);
  EXPECT_FALSE(p.pipe_partitioned);
  EXPECT_FALSE(p.grad_partitioned);
  EXPECT_FALSE(p.use_reentrant);
  EXPECT_EQ(parse_with(with_pipeline(R"({"partition": "Parameters"})"), 1).pipeline.partition, "parameters");
  EXPECT_EQ(parse_with(with_pipeline(R"({"partition": "BEST"})"), 1).pipeline.partition, "parameters");
  EXPECT_EQ(parse_with(with_pipeline(R"({"partition": "type:GPT2Block"})"), 1).pipeline.partition, "type:GPT2Block");
}

TEST(PipelineConfig, UnknownKeysAreKeptAndWarned) {
  const DsConfig c = parse_with(with_pipeline(R"({"stages": 1, "micro_batches": 8})"), 1);
  EXPECT_EQ(c.to_json()["pipeline"]["micro_batches"], 8);  // DeepSpeed's dict keeps it
  EXPECT_NE(find_warning(c, "pipeline.micro_batches", "unknown key"), nullptr);
}

TEST(PipelineConfig, BadValuesNameTheKeyTheValueAndTheFix) {
  std::string e = error_with(with_pipeline(R"({"stages": "two"})"));
  EXPECT_TRUE(contains(e, "pipeline.stages is \"two\"")) << e;
  EXPECT_TRUE(contains(e, "\"auto\"")) << e;
  e = error_with(with_pipeline(R"({"stages": 0})"));
  EXPECT_TRUE(contains(e, "pipeline.stages is 0")) << e;
  EXPECT_TRUE(contains(e, ">= 1")) << e;
  e = error_with(with_pipeline(R"({"stages": 1.5})"));
  EXPECT_TRUE(contains(e, "pipeline.stages is 1.5")) << e;
  e = error_with(with_pipeline(R"({"partition": "greedy"})"));
  EXPECT_TRUE(contains(e, "pipeline.partition is \"greedy\"")) << e;
  EXPECT_TRUE(contains(e, "\"parameters\" (or \"best\"), \"uniform\" or \"type:<regex>\"")) << e;
  e = error_with(with_pipeline(R"({"partition": 3})"));
  EXPECT_TRUE(contains(e, "pipeline.partition is 3")) << e;
  e = error_with(with_pipeline(R"({"partition": "type:(["})"));
  EXPECT_TRUE(contains(e, "pipeline.partition is \"type:([\"")) << e;
  EXPECT_TRUE(contains(e, "not a valid regular expression")) << e;
  e = error_with(with_pipeline(R"({"activation_checkpoint_interval": -1})"));
  EXPECT_TRUE(contains(e, "pipeline.activation_checkpoint_interval")) << e;
  e = error_with(with_pipeline(R"({"activation_checkpoint_interval": "2"})"));
  EXPECT_TRUE(contains(e, "pipeline.activation_checkpoint_interval")) << e;
  for (const char* k : {"pipe_partitioned", "grad_partitioned"}) {
    e = error_with(with_pipeline(fmt::format(R"({{"{}": 1}})", k)));
    EXPECT_TRUE(contains(e, fmt::format("pipeline.{} is 1: it must be a boolean", k))) << e;
  }
  e = error_with(with_pipeline("[2]"));
  EXPECT_TRUE(contains(e, "pipeline must be an object")) << e;
}

TEST(PipelineConfig, AutoStagesWithoutTheFlagIsOneStageAndSaysSo) {
  const DsConfig c = parse_with(with_pipeline(R"({"stages": "auto"})"), 4);
  EXPECT_EQ(c.pipeline_parallel_size, 1);
  EXPECT_EQ(c.data_parallel_world_size, 4);
  EXPECT_NE(find_warning(c, "pipeline.stages",
                         "pipeline.stages is \"auto\": DeepSpeed takes num_stages from PipelineModule; give --pipeline-stages N"),
            nullptr);
  // The flag gives the count: no warning.
  const DsConfig f = parse_with(with_pipeline(R"({"stages": "auto"})"), 4, 2);
  EXPECT_EQ(f.pipeline_parallel_size, 2);
  EXPECT_EQ(find_warning(f, "pipeline.stages"), nullptr);
}

TEST(PipelineConfig, TheFlagOverridesTheSectionAndWorksWithoutIt) {
  const DsConfig c = parse_with(with_pipeline(R"({"stages": 2})"), 8, 4);
  EXPECT_EQ(c.pipeline_parallel_size, 4);
  EXPECT_EQ(c.data_parallel_world_size, 2);
  EXPECT_NE(find_warning(c, "pipeline.stages", "replaced by --pipeline-stages 4"), nullptr);
  const DsConfig n = parse_with(R"({"train_micro_batch_size_per_gpu": 1})", 8, 2);
  EXPECT_EQ(n.pipeline_parallel_size, 2);
  EXPECT_EQ(n.data_parallel_world_size, 4);
  EXPECT_TRUE(contains(n.mesh_description(), "pipeline 2 x data-parallel 4"));
}

// train_batch_size = micro x GAS x world / (pp x tp x sp), each by hand.
TEST(PipelineConfig, BatchArithmeticCountsDataParallelRanksOnly) {
  // world 8, pp 2: dp 4 -> 2 x 3 x 4 = 24.
  DsConfig c = parse_with(R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3})", 8, 2);
  EXPECT_EQ(c.train_batch_size, 24);
  // world 16, pp 2, tp 2, sp 2: dp 2 -> 1 x 4 x 2 = 8.
  c = parse_with(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "sequence_parallel_size": 2,
      "tensor_parallel": {"autotp_size": 2}, "pipeline": {"stages": 2}})",
                 16);
  EXPECT_EQ(c.data_parallel_world_size, 2);
  EXPECT_EQ(c.train_batch_size, 8);
  // train_batch_size given: GAS = 32 / (2 x dp 2) = 8 at world 8, pp 4.
  c = parse_with(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2})", 8, 4);
  EXPECT_EQ(c.data_parallel_world_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  // A triple that holds for the world but not for the data-parallel ranks names the mesh.
  const std::string e = error_with(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1})", 8, 2);
  EXPECT_TRUE(contains(e, "pipeline 2 x data-parallel 4")) << e;
}

TEST(PipelineConfig, StagesThatDoNotDivideTheWorldAreRefusedNamingTheSource) {
  std::string e = error_with(R"({"train_micro_batch_size_per_gpu": 1})", 6, 4);
  EXPECT_TRUE(contains(e, "--pipeline-stages 4 does not divide the world size 6")) << e;
  EXPECT_TRUE(contains(e, "give --pipeline-stages a divisor of 6 (e.g. 3)")) << e;
  e = error_with(with_pipeline(R"({"stages": 4})"), 6);
  EXPECT_TRUE(contains(e, "pipeline.stages 4 does not divide the world size 6")) << e;
  // A stage's ranks must hold whole tensor-parallel groups.
  e = error_with(with_pipeline(R"({"stages": 2})", R"(, "tensor_parallel": {"autotp_size": 4})"), 4);
  EXPECT_TRUE(contains(e, "ranks of a pipeline stage")) << e;
  EXPECT_TRUE(contains(e, "tensor_parallel.autotp_size is 4")) << e;
  e = error_with(R"({"train_micro_batch_size_per_gpu": 1})", 4, 0);
  EXPECT_TRUE(contains(e, "--pipeline-stages 0")) << e;
}

}  // namespace
}  // namespace dstrain::config
