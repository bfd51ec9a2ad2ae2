// A mixture-of-experts model (Mixtral-shaped, with the load-balancing loss in the objective) on
// data-parallel x ZeRO 0-3, tensor-parallel (the experts whole on every rank, the attention cut,
// Megatron's cut residual stream) and sequence-parallel (the router statistics summed over the
// group, so the aux loss and its gradient are the whole sequences') meshes against one rank, in
// fp32 and bf16: the same losses, gradient norms and trained parameters within the bounds of
// mesh_test_util.h. Switching off the statistics' sum over the sequence-parallel group, or any rank
// routing differently, moves the loss beyond them.
//
// OLMoE (its q/k RMSNorm over the whole q and k projections) on the same meshes: tensor
// parallelism cuts the norms with the heads, each token's sum of squares (and in backward its
// Σ w·dy·x̂) summed over the group. Without those sums a rank normalises by its own heads' share of
// the row and the loss is off by far more than the bounds.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <tuple>

#include "engine/expert_parallel.h"
#include "mesh_test_util.h"
#include "olmoe_test_model.h"

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

// ---- OLMoE under tensor parallelism ----
enum class OlmoeModel { gqa, heads8, uneven };  // olmoe_test_model.h

struct OlmoeCell {
  const char* name;
  OlmoeModel model = OlmoeModel::gqa;
  Mesh mesh{1, 1, 1, 1};
  int stage = 1;
  Precision precision = Precision::fp32;
  bool ckpt = false;
  bool shard_residual = true;
};

void PrintTo(const OlmoeCell& c, std::ostream* os) { *os << c.name; }

class OlmoeMesh : public ::testing::TestWithParam<OlmoeCell> {};

TEST_P(OlmoeMesh, MatchesOneRank) {
  const OlmoeCell& c = GetParam();
  MeshRun m;
  std::tie(m.tp, m.sp, m.dp, m.ep) = c.mesh;
  m.stage = c.stage;
  m.precision = c.precision;
  m.ckpt = c.ckpt;
  m.shard_residual = c.shard_residual;
  m.model = c.model == OlmoeModel::uneven   ? olmoe_testing::uneven_model()
            : c.model == OlmoeModel::heads8 ? olmoe_testing::heads8_model()
                                            : olmoe_testing::gqa_model();
  if (c.precision == Precision::bf16) {
    m.tolerance = Tolerance{1e-3, 0.07, 0.0, 0.4, 0.15, 0.07};  // as MoeMesh's bf16 cells
    m.grad_norm_rtol = 5e-2;
  }
  check_against_one_rank(m);
}

INSTANTIATE_TEST_SUITE_P(
    TensorParallelQkNorm, OlmoeMesh,
    ::testing::Values(OlmoeCell{"tp2", OlmoeModel::gqa, Mesh{2, 1, 1, 1}},
                      OlmoeCell{"tp4_two_ranks_without_heads", OlmoeModel::gqa, Mesh{4, 1, 1, 1}},
                      OlmoeCell{"tp2_dp2_stage3", OlmoeModel::gqa, Mesh{2, 1, 2, 1}, 3}, OlmoeCell{"tp2_sp2", OlmoeModel::heads8, Mesh{2, 2, 1, 1}},
                      OlmoeCell{"sp2", OlmoeModel::gqa, Mesh{1, 2, 1, 1}}, OlmoeCell{"tp2_ep2", OlmoeModel::gqa, Mesh{2, 1, 2, 2}, 2},
                      OlmoeCell{"tp2_checkpointing_whole_stream", OlmoeModel::gqa, Mesh{2, 1, 1, 1}, 1, Precision::fp32, true, false},
                      OlmoeCell{"tp2_stage2_bf16", OlmoeModel::gqa, Mesh{2, 1, 1, 1}, 2, Precision::bf16},
                      OlmoeCell{"uneven_heads_tp2_stage0", OlmoeModel::uneven, Mesh{2, 1, 1, 1}, 0}),
    [](const ::testing::TestParamInfo<OlmoeCell>& cell) { return std::string(cell.param.name); });

// Expert parallelism inside each pipeline stage (PP 2 x EP 2 on 4 ranks; the load-balancing loss
// off, which a pipeline refuses): each stage's data group splits its experts.
TEST(MoeMeshPipeline, PipelineWithExpertParallelMatchesOneRank) {
  for (int stage : {0, 1}) {
    SCOPED_TRACE(fmt::format("ZeRO stage {}", stage));
    MeshRun m;
    m.pp = 2;
    m.dp = 2;
    m.ep = 2;
    m.gas = 2;
    m.stage = stage;
    m.model = "moe:L2-C32-H8-KV4-E4-K2-I24-V96-T16-tied-norm";
    check_against_one_rank(m);
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
