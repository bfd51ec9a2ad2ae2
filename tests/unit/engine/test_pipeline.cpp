// Pipeline parallelism (docs/parallelism.md §5) against one rank: a model cut into stages (and
// virtual stages), run by the 1F1B, interleaved and GPipe schedules over local ranks, trains as one
// rank at stage 0 does on the same global batch (mesh_test_util.h's reference): the same losses and
// gradient norms, and parameters within the reduction-order tolerance. The reference knows nothing of
// stages, so each test fails if a stage drops a micro-batch's gradient, a shared parameter's copies
// drift apart, the norm or overflow decision is a stage's own, or the activations sent are not the
// ones the next stage needs.
#include <algorithm>

#include <gtest/gtest.h>

#include "engine/pipeline_engine.h"
#include "mesh_test_util.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

MeshRun pipeline(int pp, int dp, int gas) {
  MeshRun m;
  m.pp = pp;
  m.dp = dp;
  m.gas = gas;
  return m;
}

// GPT-2 (kModel: embedding, 2 blocks, head; the head's weight tied to the embedding's) on 2 stages:
// the embedding and a block on stage 0, a block and the head on stage 1, which holds a copy of the
// tied weight.
TEST(Pipeline, TwoStagesMatchOneRank) { check_against_one_rank(pipeline(2, 1, 4)); }

TEST(Pipeline, FourStagesMatchOneRank) { check_against_one_rank(pipeline(4, 1, 8)); }

// With data parallelism inside each stage, ZeRO 1 and 2 partition each stage's state over its data
// group (the shared weight's pieces differ between the stages' layouts).
TEST(Pipeline, WithDataParallelZero1MatchesOneRank) {
  MeshRun m = pipeline(2, 2, 2);
  m.stage = 1;
  check_against_one_rank(m);
}

TEST(Pipeline, WithDataParallelZero2MatchesOneRank) {
  MeshRun m = pipeline(2, 2, 4);
  m.stage = 2;
  check_against_one_rank(m);
}

// 3D: pipeline x data x tensor parallel on 8 ranks, in bf16.
TEST(Pipeline, ThreeDimensionsBf16MatchOneRank) {
  MeshRun m = pipeline(2, 2, 2);
  m.tp = 2;
  m.stage = 1;
  m.precision = Precision::bf16;
  check_against_one_rank(m);
}

// Megatron's interleaved 1F1B: 2 stages of 2 chunks each (virtual stages 0 and 2 on rank 0).
TEST(Pipeline, InterleavedMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 4);
  m.vstages = 2;
  m.schedule = PipelineScheduleKind::interleaved;
  check_against_one_rank(m);
}

// The schedules order the same arithmetic differently: bit-identical results.
TEST(Pipeline, SchedulesAgreeBitForBit) {
  MeshRun a = pipeline(2, 1, 4);
  MeshRun b = a;
  b.schedule = PipelineScheduleKind::gpipe;
  const RunResult ra = merge_pipeline_params(run_mesh(a));
  const RunResult rb = merge_pipeline_params(run_mesh(b));
  EXPECT_EQ(ra.r0().losses, rb.r0().losses);
  EXPECT_EQ(ra.r0().params, rb.r0().params);
}

TEST(Pipeline, LlamaMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 2);
  m.model = kLlamaModel;
  check_against_one_rank(m);
}

// fp16 with an overflow injected on the last stage only: every stage skips the step (the same
// parameters as a run of the remaining steps, the loss scale halved everywhere).
TEST(Pipeline, OverflowOnOneStageSkipsTheStepOnAll) {
  MeshRun m = pipeline(2, 1, 2);
  m.precision = Precision::fp16;
  m.inject_overflow = {2};
  const RunResult run = run_mesh(m);
  for (const RankResult& r : run.ranks) EXPECT_EQ(r.skipped_steps, 1);
  MeshRun clean = m;
  clean.inject_overflow = {};
  const RunResult ref = run_mesh(clean);
  for (const RankResult& r : ref.ranks) EXPECT_EQ(r.skipped_steps, 0);
  // The skipped step changed nothing: its neighbours' losses agree with a clean run's first one.
  EXPECT_EQ(run.r0().losses[0], ref.r0().losses[0]);
  EXPECT_NE(run.r0().params, ref.r0().params);
}

// pipeline.activation_checkpoint_interval 1: every block recomputed from its kept input.
TEST(Pipeline, ActivationCheckpointingMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 4);
  m.pp_ckpt_interval = 1;
  check_against_one_rank(m);
}

}  // namespace
}  // namespace dstrain
