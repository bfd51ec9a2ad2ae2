// The pipeline side of the pre-flight (train/pipeline_plan.h): the schedule and virtual stages
// checked against the config, the errors before step 1 (each naming the flag or key, the values and
// the fix), the bubble warning, the layers of each stage and the lines printed at the start of a run,
// and the memory estimate of a stage's rank (train/memory_estimate.h).
//
// The parameter counts are written out from GPT-2's shapes (C = 32, Vp = 256, 32 positions):
//   embedding  wte Vp·C + wpe 32·C           = 8192 + 1024        = 9216
//   block      12C² + 13C                     = 12288 + 416        = 12704
//   head       ln_f 2C + the tied LM head Vp·C = 64 + 8192          = 8256 (a real copy on its stage)
// and the "parameters" partitions by hand from DeepSpeed's rule (the split whose heaviest and
// lightest stages differ least).
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "models/model_registry.h"
#include "ops/error.h"
#include "train/memory_estimate.h"
#include "train/pipeline_plan.h"
#include "train/training_plan.h"

namespace dstrain {
namespace {

constexpr const char* kL2 = "gpt2:L2-C32-H2-V256-T32";  // embedding, h.0, h.1, head
constexpr const char* kL6 = "gpt2:L6-C32-H2-V256-T32";  // embedding, h.0-h.5, head
constexpr double kEmbedding = 9216, kBlock = 12704, kHead = 8256;

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string batch(int gas, const std::string& extra = "") {
  return fmt::format(
      R"({{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": {}, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}}{}}})",
      gas, extra);
}

config::DsConfig parse(const std::string& json, int world, int stages) {
  config::ConfigOptions o;
  o.world_size = world;
  if (stages > 0) o.pipeline_stages = stages;
  return config::parse_ds_config(config::Json::parse(json), o);
}

struct Planned {
  TrainingPlan plan;
  std::vector<std::string> warnings;
};

Planned plan_of(const char* spec, const std::string& json, int world, int stages, int virtual_stages = 1, const std::string& schedule = "") {
  Planned p;
  p.plan.model_spec = spec;
  p.plan.model = model_architecture(spec);
  p.plan.config = parse(json, world, stages);
  p.plan.world = world;
  p.plan.sequence_length = 32;
  p.plan.mesh = make_mesh_shape(world, static_cast<int>(p.plan.config.tensor_parallel_size),
                                static_cast<int>(p.plan.config.sequence_parallel_world_size), static_cast<int>(p.plan.config.pipeline_parallel_size));
  TrainerOptions o;
  o.pipeline_stages = stages;
  o.pipeline_virtual_stages = virtual_stages;
  o.pipeline_schedule = schedule;
  p.warnings = plan_pipeline(p.plan, o);
  return p;
}

std::string error_of(const char* spec, const std::string& json, int world, int stages, int virtual_stages = 1, const std::string& schedule = "") {
  try {
    (void)plan_of(spec, json, world, stages, virtual_stages, schedule);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(PipelinePlan, WithoutAPipelineOnePieceOfEveryLayer) {
  const Planned p = plan_of(kL2, batch(1), 2, 0);
  EXPECT_EQ(p.plan.mesh.pp, 1);
  EXPECT_EQ(p.plan.stage_parts, (StageParts{0, 4}));
  EXPECT_EQ(p.plan.pipeline_schedule, "1f1b");
  EXPECT_EQ(p.plan.pipeline_virtual_stages, 1);
  EXPECT_TRUE(p.warnings.empty());
  EXPECT_TRUE(describe_pipeline_partition(p.plan).empty());
  EXPECT_EQ(plan_of(kL6, batch(1), 1, 0).plan.stage_parts, (StageParts{0, 8}));
}

// PP 2 over [9216, 12704, 12704, 8256]: {0,1 | 2,3} differs by 21920 - 20960 = 960, the least.
TEST(PipelinePlan, TwoStagesByParameters) {
  const Planned p = plan_of(kL2, batch(4, R"(, "pipeline": {"activation_checkpoint_interval": 1})"), 2, 2);
  EXPECT_EQ(p.plan.mesh.pp, 2);
  EXPECT_EQ(p.plan.mesh.dp, 1);
  EXPECT_EQ(p.plan.stage_parts, (StageParts{0, 2, 4}));
  EXPECT_EQ(p.plan.pipeline_partition, "parameters");
  EXPECT_EQ(p.plan.pipeline_checkpoint_interval, 1);
  EXPECT_TRUE(p.warnings.empty());
  const std::vector<double> params = pipeline_stage_parameters(*p.plan.model, p.plan.config, p.plan.stage_parts, 2);
  EXPECT_EQ(params, (std::vector<double>{kEmbedding + kBlock, kBlock + kHead}));
  const std::vector<std::string> lines = describe_pipeline_partition(p.plan);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "pipeline: 2 stages (1F1B), partition \"parameters\" over 4 layers");
  // fp32 AdamW at ZeRO stage 0: params 4 + grads 4 + two moments 8 = 16 B per parameter.
  EXPECT_EQ(lines[1], fmt::format("stage 0: layers 0-1 (embedding, h.0; 21,920 parameters, ~{})", format_estimate_bytes(21920.0 * 16)));
  EXPECT_EQ(lines[2], fmt::format("stage 1: layers 2-3 (h.1, head; 20,960 parameters, ~{})", format_estimate_bytes(20960.0 * 16)));
}

// The memory a stage's rank holds is divided over the stage's data-parallel ranks as ZeRO does:
// world 4 = pipeline 2 x data-parallel 2, ZeRO-1 in fp32: 4 + 4 + 8 / 2 = 12 B per parameter.
TEST(PipelinePlan, StageMemoryIsZeroOverTheStagesDataGroup) {
  const Planned p = plan_of(kL2, batch(4, R"(, "zero_optimization": {"stage": 1})"), 4, 2);
  EXPECT_EQ(p.plan.mesh.dp, 2);
  const std::vector<std::string> lines = describe_pipeline_partition(p.plan);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(has(lines[1], fmt::format("21,920 parameters, ~{})", format_estimate_bytes(21920.0 * 12)))) << lines[1];
}

// PP 2 x V 2 over [9216, 12704 x 6, 8256]: 4 pieces {0,2,4,6,8} (21920, 25408, 25408, 20960: they
// differ by 4448, the least); piece v on stage v % 2.
TEST(PipelinePlan, VirtualStagesInterleaveTheChunks) {
  const Planned p = plan_of(kL6, batch(4), 2, 2, 2);
  EXPECT_EQ(p.plan.pipeline_schedule, "interleaved");
  EXPECT_EQ(p.plan.pipeline_virtual_stages, 2);
  EXPECT_EQ(p.plan.stage_parts, (StageParts{0, 2, 4, 6, 8}));
  const std::vector<double> params = pipeline_stage_parameters(*p.plan.model, p.plan.config, p.plan.stage_parts, 2);
  EXPECT_EQ(params, (std::vector<double>{kEmbedding + kBlock + 2 * kBlock, 2 * kBlock + kBlock + kHead}));
  const std::vector<std::string> lines = describe_pipeline_partition(p.plan);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "pipeline: 2 stages x 2 virtual stages (interleaved 1F1B), partition \"parameters\" over 8 layers");
  EXPECT_EQ(lines[1], fmt::format("stage 0: chunk 0 layers 0-1 (embedding, h.0), chunk 1 layers 4-5 (h.3-h.4); 47,328 parameters, ~{}",
                                  format_estimate_bytes(47328.0 * 16)));
  EXPECT_EQ(lines[2], fmt::format("stage 1: chunk 0 layers 2-3 (h.1-h.2), chunk 1 layers 6-7 (h.5, head); 46,368 parameters, ~{}",
                                  format_estimate_bytes(46368.0 * 16)));
  // The same on the small model: one layer a piece, stage 0 the embedding and h.1.
  const Planned small = plan_of(kL2, batch(2), 2, 2, 2);
  EXPECT_EQ(small.plan.stage_parts, (StageParts{0, 1, 2, 3, 4}));
  EXPECT_EQ(pipeline_stage_parameters(*small.plan.model, small.plan.config, small.plan.stage_parts, 2),
            (std::vector<double>{kEmbedding + kBlock, kBlock + kHead}));
}

TEST(PipelinePlan, UniformAndTypePartitions) {
  EXPECT_EQ(plan_of(kL6, batch(4, R"(, "pipeline": {"partition": "uniform"})"), 3, 3).plan.stage_parts, (StageParts{0, 3, 6, 8}));
  // type:GPT2Block weighs the 6 blocks 1 and the rest 0: two blocks a stage.
  const Planned t = plan_of(kL6, batch(4, R"(, "pipeline": {"partition": "type:gpt2block"})"), 3, 3);
  const StageParts& parts = t.plan.stage_parts;
  ASSERT_EQ(parts.size(), 4u);
  for (std::size_t s = 0; s < 3; ++s) {
    int blocks = 0;
    for (std::size_t i = parts[s]; i < parts[s + 1]; ++i) blocks += i >= 1 && i <= 6 ? 1 : 0;
    EXPECT_EQ(blocks, 2) << "stage " << s;
  }
}

TEST(PipelinePlan, MorePiecesThanLayersIsAnError) {
  std::string e = error_of(kL2, batch(4), 4, 4, 2);
  EXPECT_TRUE(has(e, "--pipeline-stages 4 x --pipeline-virtual-stages 2 = 8 pieces of the model, but gpt2:L2-C32-H2-V256-T32 has 4 layers")) << e;
  EXPECT_TRUE(has(e, "embedding, h.0-h.1, head")) << e;
  e = error_of(kL2, batch(8, R"(, "pipeline": {"stages": 8})"), 8, 0);
  EXPECT_TRUE(has(e, "pipeline.stages 8 = 8 pieces")) << e;
  EXPECT_TRUE(has(e, "give at most 4 pipeline stages")) << e;
}

TEST(PipelinePlan, ATypeRegexThatFindsNoLayerNamesPipelinePartition) {
  const std::string e = error_of(kL2, batch(2, R"(, "pipeline": {"partition": "type:LlamaDecoderLayer"})"), 2, 2);
  EXPECT_TRUE(has(e, "pipeline.partition \"type:LlamaDecoderLayer\"")) << e;
  EXPECT_TRUE(has(e, "found no layers")) << e;
  EXPECT_TRUE(has(e, "GPT2Block")) << e;  // the types there are
}

TEST(PipelinePlan, StagesThatDoNotDivideTheWorldNameTheFlagOrKey) {
  std::string e;
  try {
    (void)parse(batch(1), 6, 4);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_TRUE(has(e, "--pipeline-stages 4 does not divide the world size 6")) << e;
  try {
    (void)parse(batch(1, R"(, "pipeline": {"stages": 4})"), 6, 0);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_TRUE(has(e, "pipeline.stages 4 does not divide the world size 6")) << e;
}

TEST(PipelinePlan, InterleavingNeedsMicroBatchesInWholeGroupsOfTheStages) {
  const std::string e = error_of(kL6, batch(3), 2, 2, 2);
  EXPECT_TRUE(has(e, "--pipeline-virtual-stages 2 with gradient_accumulation_steps 3")) << e;
  EXPECT_TRUE(has(e, "set gradient_accumulation_steps to 4")) << e;
  EXPECT_EQ(error_of(kL6, batch(4), 2, 2, 2), "<no error>");
}

TEST(PipelinePlan, ScheduleAndVirtualStagesMustAgree) {
  for (const char* s : {"1f1b", "gpipe"}) {
    const std::string e = error_of(kL6, batch(4), 2, 2, 2, s);
    EXPECT_TRUE(has(e, fmt::format("--pipeline-schedule {} with --pipeline-virtual-stages 2", s))) << e;
  }
  std::string e = error_of(kL6, batch(4), 2, 2, 1, "interleaved");
  EXPECT_TRUE(has(e, "--pipeline-schedule interleaved with --pipeline-virtual-stages 1")) << e;
  e = error_of(kL6, batch(4), 2, 0, 2);
  EXPECT_TRUE(has(e, "--pipeline-virtual-stages 2 without pipeline stages")) << e;
  e = error_of(kL6, batch(4), 2, 2, 0);
  EXPECT_TRUE(has(e, "--pipeline-virtual-stages 0")) << e;
  EXPECT_EQ(plan_of(kL6, batch(4), 2, 2, 1, "gpipe").plan.pipeline_schedule, "gpipe");
}

TEST(PipelinePlan, ZeroStage3IsRefusedWithWhatItWouldCost) {
  const std::string e = error_of(kL2, batch(4, R"(, "zero_optimization": {"stage": 3})"), 2, 2);
  EXPECT_TRUE(has(e, "zero_optimization.stage 3 with 2 pipeline stages")) << e;
  EXPECT_TRUE(has(e, "2 x gradient_accumulation_steps = 8 all-gathers of the stage's parameters per step instead of once")) << e;
  EXPECT_TRUE(has(e, "set zero_optimization.stage to 0, 1 or 2")) << e;
  // Without pipeline stages ZeRO-3 is what it always was.
  EXPECT_EQ(error_of(kL2, batch(4, R"(, "zero_optimization": {"stage": 3})"), 2, 0), "<no error>");
  // ZeRO-2 trains, with DeepSpeed's refusal said.
  const Planned z2 = plan_of(kL2, batch(4, R"(, "zero_optimization": {"stage": 2})"), 2, 2);
  EXPECT_TRUE(std::any_of(z2.warnings.begin(), z2.warnings.end(), [](const std::string& w) { return has(w, "asserts ZeRO stage < 2"); }));
}

// The 1-bit optimizers train with a pipeline (each stage's compressed exchange over its data group;
// tests/unit/engine/test_pipeline.cpp): planned without an error.
TEST(PipelinePlan, OneBitOptimizersArePlanned) {
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    const std::string json = fmt::format(
        R"({{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "fp16": {{"enabled": true}}, "optimizer": {{"type": "{}", "params": {{"lr": 1e-3}}}}}})",
        type);
    EXPECT_EQ(error_of(kL2, json, 2, 2), "<no error>") << type;
  }
}

TEST(PipelinePlan, FewerMicroBatchesThanStagesWarnsOfTheBubble) {
  // P 4, M 2: (4-1)/(2+4-1) = 3/5 = 60%.
  const Planned p = plan_of(kL6, batch(2), 4, 4);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(has(p.warnings[0], "the bubble dominates: (P-1)/(M+P-1) = 3/5 = 60% of each step idle; raise gradient_accumulation_steps"))
      << p.warnings[0];
  EXPECT_TRUE(plan_of(kL6, batch(4), 4, 4).warnings.empty());
}

// A stage's rank: its layers' states and the activations of the micro-batches it holds. L2, fp32
// AdamW (16 B per parameter), B 1, T 32, C 32, M 4, P 2: stage 0 holds min(2, 4) = 2 hidden states of
// 1 x 32 x 32 x 4 B; stage 1 one, and the logits 32 x 256 x 4 B.
TEST(PipelinePlan, MemoryEstimateOfAStage) {
  const Planned p = plan_of(kL2, batch(4), 2, 2);
  const std::vector<double> params = pipeline_stage_parameters(*p.plan.model, p.plan.config, p.plan.stage_parts, 2);
  const MemoryEstimate s0 = estimate_pipeline_stage_memory(*p.plan.model, p.plan.config, 32, params, 0, false);
  const MemoryEstimate s1 = estimate_pipeline_stage_memory(*p.plan.model, p.plan.config, 32, params, 1, false);
  EXPECT_EQ(s0.per_rank(), 21920.0 * 16 + 2 * 4096.0);
  EXPECT_EQ(s1.per_rank(), 20960.0 * 16 + 4096.0 + 32 * 256 * 4.0);
  // GPipe keeps all M = 4 on stage 0.
  EXPECT_EQ(estimate_pipeline_stage_memory(*p.plan.model, p.plan.config, 32, params, 0, true).activations, 4 * 4096.0);
  // The pre-flight: the heaviest stage fits where the whole model does not. Whole model, data-parallel:
  // 34688 stored parameters x 16 + the logits 32768 = 587776 B per rank.
  const HostMemoryLimit limit{380000.0, "the test's limit"};
  const TrainingPlan& pipelined = p.plan;
  EXPECT_NO_THROW(check_plan_memory(pipelined, 1, limit));
  const Planned flat = plan_of(kL2, batch(4), 2, 0);
  std::string e;
  try {
    check_plan_memory(flat.plan, 1, limit);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_TRUE(has(e, "does not fit in memory")) << e;
  // All the world's ranks in one process: both stages' ranks count.
  try {
    e.clear();
    check_plan_memory(pipelined, 2, HostMemoryLimit{700000.0, "the test's limit"});
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_TRUE(has(e, "the 2 ranks of all 2 stages in this process")) << e;
}

// A descriptor of absurd depth is refused by its layer count, before the partition builds any layer
// (building 10^8 blocks took minutes and gigabytes).
TEST(PipelinePlan, AnAbsurdlyDeepModelIsRefusedBeforeItsLayersAreBuilt) {
  const std::string e = error_of("gpt2:L100000000-C8-H1-V96-T16", batch(4), 2, 2);
  EXPECT_TRUE(has(e, "100000002 layers; the engine trains at most 65536")) << e;
}

}  // namespace
}  // namespace dstrain
