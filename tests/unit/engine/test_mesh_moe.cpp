// A mixture-of-experts model (Mixtral-shaped, with the load-balancing loss in the objective) on
// data-parallel x ZeRO 0-3, tensor-parallel (the experts whole on every rank, the attention cut,
// Megatron's cut residual stream) and sequence-parallel (the router statistics summed over the
// group, so the aux loss and its gradient are the whole sequences'), expert-parallel and pipeline
// (the statistics travelling between the stages with each micro-batch) meshes against one rank, in
// fp32 and bf16: the same losses, gradient norms and trained parameters within the bounds of
// mesh_test_util.h. Switching off the statistics' sum over the sequence-parallel group or their
// journey through the pipeline, or any rank routing differently, moves the loss beyond them.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "engine/expert_parallel.h"
#include "mesh_test_util.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

// 4 experts of 24, top-2 renormalised (Mixtral), aux loss weight 0.05 in the objective.
constexpr const char* kMoe = "moe:L2-C32-H8-KV4-E4-K2-I24-V96-T16-tied-norm-aux0.05";

using Mesh = std::tuple<int, int, int, int>;  // tp, sp, dp, ep (ep of the dp ranks split the experts)
using Cell = std::tuple<Mesh, int, Precision>;

class MoeMesh : public ::testing::TestWithParam<Cell> {};

TEST_P(MoeMesh, MatchesOneRank) {
  const auto& [mesh, stage, precision] = GetParam();
  MeshRun m;
  std::tie(m.tp, m.sp, m.dp, m.ep) = mesh;
  m.stage = stage;
  m.precision = precision;
  m.model = kMoe;
  m.shard_residual = true;
  if (precision == Precision::bf16) {
    // As test_mesh_matrix.cpp's bf16 bounds (each rank's partial sums rounded to bf16).
    m.tolerance = Tolerance{1e-3, 0.07, 0.0, 0.4, 0.15, 0.07};
    m.grad_norm_rtol = 5e-2;
  }
  check_against_one_rank(m);
}

std::string cell_name(const ::testing::TestParamInfo<Cell>& info) {
  const Mesh& mesh = std::get<0>(info.param);
  return fmt::format("tp{}_sp{}_dp{}{}_stage{}_{}", std::get<0>(mesh), std::get<1>(mesh), std::get<2>(mesh),
                     std::get<3>(mesh) > 1 ? fmt::format("_ep{}", std::get<3>(mesh)) : "", std::get<1>(info.param), precision_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(DataParallelZero, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{1, 1, 2, 1}), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         cell_name);
INSTANTIATE_TEST_SUITE_P(TensorAndSequenceParallel, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{2, 1, 1, 1}, Mesh{1, 2, 1, 1}, Mesh{2, 2, 1, 1}), ::testing::Values(1),
                                            ::testing::Values(Precision::fp32)),
                         cell_name);

// Expert parallelism (expert_parallel.autoep_size): the experts split across ep of the data-parallel
// ranks, tokens sent to their experts' ranks and back, ZeRO sharding the experts over the
// expert-data-parallel group and the rest over the data group — the same training as one rank.
// Reducing the experts' gradients over the whole data group (different experts averaged together),
// leaving out the 1/EP of their gradients, or counting an expert twice in the norm moves the
// parameters or the norm beyond the bounds.
INSTANTIATE_TEST_SUITE_P(ExpertParallelZero, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{1, 1, 2, 2}), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         cell_name);
INSTANTIATE_TEST_SUITE_P(ExpertParallelFp16, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{1, 1, 2, 2}), ::testing::Values(1, 3), ::testing::Values(Precision::fp16)),
                         cell_name);
INSTANTIATE_TEST_SUITE_P(ExpertParallelWide, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{1, 1, 4, 4}, Mesh{1, 1, 4, 2}), ::testing::Values(1, 3),
                                            ::testing::Values(Precision::fp32)),
                         cell_name);
INSTANTIATE_TEST_SUITE_P(ExpertWithTensorAndSequenceParallel, MoeMesh,
                         ::testing::Combine(::testing::Values(Mesh{2, 1, 2, 2}, Mesh{1, 2, 2, 2}), ::testing::Values(2),
                                            ::testing::Values(Precision::fp32)),
                         cell_name);

// Pipeline parallelism with the load-balancing loss (docs/parallelism.md §7): the loss pools the
// router statistics of every sparse layer, which the stages hold apart, so a micro-batch's statistics
// travel with its activations (each stage adding its layers') and its whole model's come back with
// its gradients (engine/engine_pipeline.cpp). Several micro-batches are in flight on each stage, each
// with its own statistics. The pipeline sums the same statistics in the same layer order as one rank,
// so the bounds are the pipeline's without MoE (mesh_test_util.h's fp32 bounds: loss 1e-6 relative;
// measured: the same losses to the last bit). Measured against the faults the design guards
// against: each stage starting from zeros instead of the statistics it receives (a stage's aux and
// gradient from its own layers only) moves step 1's loss by 1.2e-4 relative and the routers' weights
// by ~95 times the bound; no aux term at all (the refusal merely lifted) moves the loss by 2%.
MeshRun moe_pipeline(int pp, int gas, const char* model = kMoe) {
  MeshRun m;
  m.pp = pp;
  m.gas = gas;
  m.model = model;
  return m;
}

// Two stages (the embedding and layer 0's experts | layer 1's experts and the head), four
// micro-batches per step, two in flight on stage 0.
TEST(MoeMeshPipeline, TwoStagesWithTheLoadBalancingLossMatchOneRank) { check_against_one_rank(moe_pipeline(2, 4)); }

// Four stages of one layer each: the embedding's and the head's stages hold no sparse layer and pass
// the statistics on (stage 0 starts them at zero, stage 3 computes the aux loss from them).
TEST(MoeMeshPipeline, FourStagesMatchOneRank) { check_against_one_rank(moe_pipeline(4, 4)); }

// Megatron's interleaved 1F1B (2 stages x 2 chunks: the statistics go round the ring of ranks twice
// forward and back) and GPipe (every micro-batch in flight at once).
TEST(MoeMeshPipeline, InterleavedAndGPipeMatchOneRank) {
  MeshRun inter = moe_pipeline(2, 4);
  inter.vstages = 2;
  inter.schedule = PipelineScheduleKind::interleaved;
  check_against_one_rank(inter);
  MeshRun gpipe = moe_pipeline(2, 4);
  gpipe.schedule = PipelineScheduleKind::gpipe;
  check_against_one_rank(gpipe);
}

// Sequence parallelism inside each stage (PP 2 x SP 2): each rank's running statistics are its
// tokens'; the last stage sums them over the sequence-parallel group once, and the whole sequences'
// go back. Summing on every stage would count the first stage's layers twice.
TEST(MoeMeshPipeline, WithSequenceParallelMatchesOneRank) {
  MeshRun m = moe_pipeline(2, 2);
  m.sp = 2;
  m.stage = 1;
  check_against_one_rank(m);
}

// Expert parallelism inside each pipeline stage (PP 2 x EP 2 on 4 ranks, ZeRO 0 and 1): each
// stage's data group splits its experts, and each data rank's statistics travel along its own
// pipeline.
TEST(MoeMeshPipeline, PipelineWithExpertParallelMatchesOneRank) {
  for (int stage : {0, 1}) {
    SCOPED_TRACE(fmt::format("ZeRO stage {}", stage));
    MeshRun m = moe_pipeline(2, 2);
    m.dp = 2;
    m.ep = 2;
    m.stage = stage;
    check_against_one_rank(m);
  }
  // Without the load-balancing loss the statistics travel too (for the report), and change nothing.
  MeshRun m = moe_pipeline(2, 2, "moe:L2-C32-H8-KV4-E4-K2-I24-V96-T16-tied-norm");
  m.dp = 2;
  m.ep = 2;
  check_against_one_rank(m);
}

// pipeline.activation_checkpoint_interval 2 on 4 sparse blocks: each stage recomputes its two
// blocks from the segment's kept input before their backward, recording nothing (the statistics
// of the micro-batch are counted once, in its forward), while later micro-batches' forwards have
// run in between.
TEST(MoeMeshPipeline, ActivationCheckpointingMatchesOneRank) {
  MeshRun m = moe_pipeline(2, 4, "moe:L4-C32-H8-KV4-E4-K2-I24-V96-T16-tied-norm-aux0.05");
  m.pp_ckpt_interval = 2;
  check_against_one_rank(m);
}

// bf16 with data parallelism and ZeRO 1 in each stage: the statistics stay fp64 on the way.
TEST(MoeMeshPipeline, DataParallelBf16MatchesOneRank) {
  MeshRun m = moe_pipeline(2, 2);
  m.dp = 2;
  m.stage = 1;
  m.precision = Precision::bf16;
  m.tolerance = Tolerance{1e-3, 0.07, 0.0, 0.4, 0.15, 0.07};  // MoeMesh's bf16 bounds
  m.grad_norm_rtol = 5e-2;
  check_against_one_rank(m);
}

// The per-expert report and validation are the whole model's on every stage. After one step (its
// forwards all from the initial weights, so every token routes as on one rank) each stage reports
// the counts of all sparse layers (the stages' summed by take_moe_report) and the whole model's
// aux loss of the last micro-batch, as one rank does; the evaluation's loss through the pipeline
// includes the load-balancing term over every layer, as Engine::evaluate's.
TEST(MoeMeshPipeline, ReportAndEvaluationAreTheWholeModels) {
  MeshRun ref = moe_pipeline(1, 4);
  ref.pp = 1;
  ref.steps = 1;
  ref.evaluate = true;
  run_mesh(ref);
  const MoeStats::Report want = g_moe_reports[0];
  const float want_eval = g_eval_losses[0];
  ASSERT_EQ(want.layers, 2);
  ASSERT_GT(want.last_aux, 0.0);
  for (int pp : {2, 4}) {
    SCOPED_TRACE(fmt::format("{} stages", pp));
    MeshRun m = moe_pipeline(pp, 4);
    m.steps = 1;
    m.evaluate = true;
    run_mesh(m);
    for (int r = 0; r < pp; ++r) {
      const MoeStats::Report& got = g_moe_reports[static_cast<std::size_t>(r)];
      EXPECT_EQ(got.layers, want.layers) << "stage " << r;
      EXPECT_EQ(got.experts, want.experts) << "stage " << r;
      EXPECT_EQ(got.min, want.min) << "stage " << r;
      EXPECT_EQ(got.max, want.max) << "stage " << r;
      EXPECT_EQ(got.mean, want.mean) << "stage " << r;
      EXPECT_EQ(got.idle, want.idle) << "stage " << r;
      EXPECT_EQ(got.dropped, want.dropped) << "stage " << r;
      EXPECT_EQ(got.last_aux, want.last_aux) << "stage " << r;
      // One step's weights differ from one rank's by the reduction order (the training bounds).
      EXPECT_NEAR(g_eval_losses[static_cast<std::size_t>(r)], want_eval, 1e-6 * std::abs(want_eval)) << "stage " << r;
    }
  }
}

// Activation checkpointing: the recompute exchanges the tokens again, on every rank in the same
// order, and trains as one rank does.
TEST(MoeMeshCheckpointing, ExpertParallelRecomputeMatchesOneRank) {
  MeshRun m;
  m.dp = 2;
  m.ep = 2;
  m.stage = 2;
  m.ckpt = true;
  m.model = kMoe;
  check_against_one_rank(m);
}

// What the engine refuses under expert parallelism before step 1: a group backend that cannot move
// the device's memory, and optimizers whose rule reads each tensor whole.
TEST(ExpertParallelChecks, BackendAndOptimizerAreRefusedNamingTheFix) {
  RunSpec s;
  const config::DsConfig adamw = config::parse_ds_config(config::Json::parse(zero_config_json(s)), config::ConfigOptions{});
  const auto refused = [](const config::DsConfig& c, Device d, const char* backend, std::vector<std::string> parts) {
    try {
      check_expert_parallel_engine(c, d, 2, backend);
      ADD_FAILURE() << backend << " on " << d.str() << " was not refused";
    } catch (const Error& e) {
      for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(adamw, Device::cuda(0), "mpi", {"expert_parallel.autoep_size 2", "mpi backend", "host memory only", "expert-parallel group"});
  refused(adamw, Device::cpu(), "nccl", {"expert_parallel.autoep_size 2", "nccl backend", "GPU memory only"});
  s.knobs.optimizer_json = R"({"type": "Lamb", "params": {"lr": 1e-3}})";
  s.knobs.allow_untested_optimizer = true;
  const config::DsConfig lamb = config::parse_ds_config(config::Json::parse(zero_config_json(s)), config::ConfigOptions{});
  refused(lamb, Device::cpu(), "local", {"optimizer.type \"Lamb\"", "autoep_size 2", "element-wise optimizer"});
  EXPECT_NO_THROW(check_expert_parallel_engine(adamw, Device::cpu(), 2, "local"));
  EXPECT_NO_THROW(check_expert_parallel_engine(adamw, Device::cuda(0), 2, "nccl"));
  EXPECT_NO_THROW(check_expert_parallel_engine(lamb, Device::cpu(), 1, "local"));  // one rank: no group
}

}  // namespace
}  // namespace dstrain
