// Tensor parallelism's correctness contract (docs/parallelism.md): a DP x TP mesh of local ranks,
// ZeRO along the data-parallel axis, trains like ONE rank at stage 0 with the same global batch —
// the same losses and the same whole parameters (gathered from the pieces), within the tolerance of
// a different reduction order — for GPT-2 and the Llama family (GQA, tied embeddings), with heads,
// key/value heads, MLP features and vocabulary rows split evenly and unevenly, and with more
// tensor-parallel ranks than key/value heads.
//
// The reference is test_zero_equivalence.cpp's: stage 0, one rank, GAS·DP micro-steps fed the
// global batch slot by slot. Rank (dp, tp) feeds slot m·DP + dp at micro-step m: the ranks of one
// tensor-parallel group see the same micro-batch.
#include <cmath>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "engine/config_checks.h"
#include "mesh_test_util.h"
#include "ops/kernels/device_backend.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

// GPT-2 with 4 heads (so that 4 ranks hold one each and 3 ranks hold 2/1/1) and a vocabulary of 100
// (padded to 128: the last rank's rows are partly padding).
constexpr const char* kGpt2Heads4 = "gpt2:L2-C32-H4-V100-T16";
// Llama with 4 query heads over 2 key/value heads, tied embeddings: 4 ranks leave 2 without heads.
constexpr const char* kLlamaGqa = kLlamaModel;

using Combo = std::tuple<int, int, int, std::string>;  // tp, dp, stage, model

class TensorParallel : public ::testing::TestWithParam<Combo> {};

TEST_P(TensorParallel, MatchesOneRank) {
  const auto& [tp, dp, stage, model] = GetParam();
  MeshRun m;
  m.tp = tp;
  m.dp = dp;
  m.stage = stage;
  m.model = model.c_str();
  check_against_one_rank(m);
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const int tp = std::get<0>(info.param), dp = std::get<1>(info.param), stage = std::get<2>(info.param);
  return fmt::format("tp{}_dp{}_stage{}_{}", tp, dp, stage, std::get<3>(info.param).starts_with("llama") ? "llama" : "gpt2");
}

INSTANTIATE_TEST_SUITE_P(Mesh, TensorParallel,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(std::string(kGpt2Heads4), std::string(kLlamaGqa))),
                         combo_name);

// Uneven splits: 3 ranks over 4 heads (2/1/1), 128 vocabulary rows (43/43/42), 128 MLP features
// (43/43/42); the Llama model's 2 key/value heads over 3 ranks (1/1/0) and 48 features (16 each).
TEST(TensorParallelUneven, ThreeRanksMatchOneRank) {
  for (const char* model : {kGpt2Heads4, kLlamaGqa}) {
    SCOPED_TRACE(model);
    MeshRun m;
    m.tp = 3;
    m.model = model;
    check_against_one_rank(m);
  }
}

// More tensor-parallel ranks than GPT-2 heads (2 heads over 4 ranks, as AutoTP allows): the
// surplus ranks hold no attention weights, add zeros, and form the replicated attn.c_proj bias's
// gradient from the same d(out) as every rank (matmul_backward with an input of no columns).
TEST(TensorParallelUneven, MoreRanksThanGpt2Heads) {
  MeshRun m;
  m.tp = 4;
  m.model = kModel;  // gpt2:L2-C32-H2-V96-T16
  check_against_one_rank(m);
}

TEST(TensorParallelPrecision, Bf16AndCheckpointing) {
  MeshRun m;
  m.tp = 2;
  m.dp = 2;
  m.stage = 2;
  m.ckpt = true;
  m.precision = Precision::bf16;
  m.model = kLlamaGqa;
  check_against_one_rank(m);
}

// SGD (no Adam normalisation to amplify near-zero gradients' rounding noise into lr-sized steps):
// the difference to one rank is the reduction order of the row-parallel sums alone. The bound is
// the textbook one for two summation orders of an n-term fp32 sum, 2·γ_n with γ_n = n·u/(1 − n·u)
// and u = 2⁻²⁴, over the longest split contraction (the MLP's 4C = 128 features), once per step:
// 2·γ_128·3 ≈ 4.6e-5. Measured: 7.2e-6 (g++ Release) to 1.02e-5 (clang ASan build in
// CI); a tensor-parallel group that dropped a piece's sum is off by O(1).
TEST(TensorParallelSgd, MatchesOneRankToRounding) {
  for (const char* model : {kGpt2Heads4, kLlamaGqa}) {
    SCOPED_TRACE(model);
    MeshRun m;
    m.tp = 4;
    m.dp = 2;
    m.stage = 3;
    m.model = model;
    m.optimizer_json = R"({"type": "SGD", "params": {"lr": 0.5}})";
    const RunResult run = run_mesh(m);
    const RunResult& ref = one_rank(m.model, m.gas * m.dp, m.precision, m.steps, m.optimizer_json);
    double worst = 0;
    for (const auto& [name, want] : ref.r0().params) {
      const std::vector<float>& got = run.r0().params.at(name);
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1e-3 + std::abs(double(want[i]))));
    }
    const double u = std::ldexp(1.0, -24), n = 4 * 32;
    const double bound = 2 * (n * u / (1 - n * u)) * m.steps;
    std::printf("SGD %s: worst relative difference %.3g (bound %.3g)\n", model, worst, bound);
    EXPECT_LE(worst, bound);
  }
}

// The tensor-parallel group's traffic of one optimizer step (one micro-batch, B = 2, T = 16,
// C = 32, fp32, 2 blocks) is docs/parallelism.md's formula, counted by the group's communicator:
// 2(W−1)/W · [(4L + 2)·B·T·C·4 + 3·B·T·4 + 16] bytes per rank — the blocks' four all-reduces, the
// embedding's and the head's, the cross-entropy's max and (sum, target) and the step's fp64
// (norm², overflow count).
TEST(TensorParallelComm, BytesPerStepMatchTheFormula) {
  for (int tp : {2, 4}) {
    for (const char* model : {kGpt2Heads4, kLlamaGqa}) {
      MeshRun m;
      m.tp = tp;
      m.steps = 1;
      m.model = model;
      (void)run_mesh(m);
      const double B = kMicro, T = kT, C = 32, L = 2;
      const double ring = 2.0 * (tp - 1) / tp;
      const double want = ring * ((4 * L + 2) * B * T * C * 4 + 3 * B * T * 4 + 16);
      for (std::size_t r = 0; r < g_tp_bytes.size(); ++r) EXPECT_EQ(static_cast<double>(g_tp_bytes[r]), want) << model << " tp " << tp << " rank " << r;
    }
  }
}

// Per-rank memory (the engine's allocator statistics): a rank's parameters, gradients and AdamW
// states are its pieces plus the replicated parameters — the elements its layers' specs declare,
// laid out as zero/flat_layout.h pads them (zero_test_util.h's padded_numel, written out from the
// specs) — and the pieces shrink as 1/TP.
TEST(TensorParallelMemory, StatesShrinkAsThePiecesSay) {
  std::map<int, std::int64_t> params_bytes;
  for (int tp : {1, 2, 4}) {
    MeshRun m;
    m.tp = tp;
    m.steps = 1;
    m.model = kGpt2Heads4;
    const RunResult run = run_mesh(m);
    for (int r = 0; r < tp; ++r) {
      const Model model = build_model(kGpt2Heads4, {r, tp}, {});
      std::int64_t expected = 0, whole_cut = 0, replicated = 0;
      for (const auto& layer : model.layers) {
        expected += padded_numel(layer->params(), 1, 4) * 4;
        for (const ParamSpec& p : layer->params()) {
          if (p.tied()) continue;
          (p.is_piece() ? whole_cut : replicated) += p.whole_shape().numel();
        }
      }
      const MemoryStats& mem = run.ranks[static_cast<std::size_t>(r)].memory;
      EXPECT_EQ(static_cast<std::int64_t>(mem[MemoryPurpose::params].current), expected) << "tp " << tp << " rank " << r;
      EXPECT_EQ(mem[MemoryPurpose::grads].current, mem[MemoryPurpose::params].current);
      EXPECT_EQ(mem[MemoryPurpose::optimizer].current, 2 * mem[MemoryPurpose::params].current);  // AdamW's m and v
      if (r == 0) params_bytes[tp] = expected;
      // The cut parameters' share: at most ceil(1/TP) of the whole (whole heads / rows per rank),
      // plus the 64-byte alignment of each tensor.
      (void)whole_cut;
      (void)replicated;
    }
  }
  // From TP 1 to 2 to 4 the cut parameters (all but the norms, biases and positions) halve.
  EXPECT_LT(params_bytes[2], 0.56 * static_cast<double>(params_bytes[1]));
  EXPECT_LT(params_bytes[4], 0.56 * static_cast<double>(params_bytes[2]));
}

// The pieces tile the whole parameter: each rank's piece is its part of the one-rank initial value
// (the init draws the whole parameter and keeps the piece).
TEST(TensorParallelPieces, InitialPiecesAreTheWholeParameterCut) {
  const RunResult& whole = one_rank(kGpt2Heads4, 0, Precision::fp32);
  const RunResult run = [] {
    MeshRun m;
    m.tp = 3;
    m.steps = 0;
    m.model = kGpt2Heads4;
    return run_mesh(m);
  }();
  for (const auto& [name, v] : whole.r0().params) EXPECT_EQ(run.r0().params.at(name), v) << name;
}

// The engine's host values over the tensor-parallel group (the step's norm², whole parameters) go
// through the training device's memory on a GPU (NCCL reads device memory only). The same code
// with a host allocator as the staging memory: the values through staging buffers equal the
// values in place, bit for bit.
TEST(TensorParallelStaging, AllReduceAndGatherThroughStagingBuffersEqualInPlace) {
  const ParamSpec whole{"w", Shape{7, 3}, ParamInit::zeros(), true, {}, ParamSplit::rows()};
  run_local_ranks(3, [&](Communicator& comm) {
    const std::unique_ptr<Allocator> staging = make_device_allocator(Device::cpu());
    const int r = comm.rank();
    double direct[2] = {1.5 * (r + 1), 0.25 * r}, staged[2] = {direct[0], direct[1]};
    all_reduce_host(comm, Tensor(direct, DType::fp64, Shape{2}), ReduceOp::sum, nullptr);
    all_reduce_host(comm, Tensor(staged, DType::fp64, Shape{2}), ReduceOp::sum, staging.get());
    EXPECT_EQ(direct[0], 9.0);
    EXPECT_EQ(direct[1], 0.75);
    EXPECT_EQ(staged[0], direct[0]);
    EXPECT_EQ(staged[1], direct[1]);
    // Rows 7 over 3 ranks: pieces of 3, 2 and 2 rows; element e of the whole is e.
    const ParamSpec piece = piece_spec(whole, {r, 3});
    std::vector<float> full(21), mine(static_cast<std::size_t>(piece.shape.numel()));
    for (std::size_t e = 0; e < full.size(); ++e) full[e] = static_cast<float>(e);
    copy_whole_to_piece(Tensor(full.data(), DType::fp32, whole.shape), Tensor(mine.data(), DType::fp32, piece.shape), piece.split, 3, r, "w");
    std::vector<float> got_direct(21, -1.0f), got_staged(21, -1.0f);
    gather_whole(comm, piece, Tensor(mine.data(), DType::fp32, piece.shape), Tensor(got_direct.data(), DType::fp32, whole.shape));
    gather_whole(comm, piece, Tensor(mine.data(), DType::fp32, piece.shape), Tensor(got_staged.data(), DType::fp32, whole.shape), staging.get());
    EXPECT_EQ(got_direct, full);
    EXPECT_EQ(got_staged, full);
  });
}

// A tensor-parallel group whose backend cannot communicate the training device's memory is refused
// before step 1, naming the backend and the fix; the nccl and local backends on a GPU are not.
TEST(TensorParallelChecks, BackendMustCommunicateTheDeviceMemory) {
  RunSpec s;
  const config::DsConfig c = config::parse_ds_config(config::Json::parse(zero_config_json(s)), config::ConfigOptions{});
  const auto refused = [&](Device d, const char* backend, std::vector<std::string> parts) {
    try {
      check_tensor_parallel_engine(c, d, 2, backend);
      ADD_FAILURE() << backend << " on " << d.str() << " was not refused";
    } catch (const Error& e) {
      for (const std::string& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(Device::cuda(0), "mpi", {"tensor parallelism (2 ranks)", "mpi backend", "host memory only"});
  refused(Device::cpu(), "nccl", {"tensor parallelism (2 ranks)", "nccl backend", "GPU memory only"});
  EXPECT_NO_THROW(check_tensor_parallel_engine(c, Device::cuda(0), 2, "nccl"));
  EXPECT_NO_THROW(check_tensor_parallel_engine(c, Device::cuda(0), 2, "local"));
  EXPECT_NO_THROW(check_tensor_parallel_engine(c, Device::cpu(), 2, "mpi"));
  EXPECT_NO_THROW(check_tensor_parallel_engine(c, Device::cuda(0), 1, "mpi"));  // one rank: no group
}

}  // namespace
}  // namespace dstrain
