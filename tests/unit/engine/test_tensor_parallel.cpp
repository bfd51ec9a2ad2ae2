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
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/config_checks.h"
#include "engine/tensor_parallel.h"
#include "models/param_split.h"
#include "ops/kernels/device_backend.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

struct MeshRun {
  int tp = 1;
  int dp = 1;
  int stage = 0;
  int gas = 1;
  int steps = 3;
  bool ckpt = false;
  Precision precision = Precision::fp32;
  const char* model = kModel;
  std::string optimizer_json{};  // empty: zero_test_util's AdamW
};

Model build_model(const char* spec, TensorParallelRank tp) {
  std::shared_ptr<const Architecture> arch = std::string_view(spec).starts_with("llama:") ? llama_family().from_spec(spec) : gpt2_family().from_spec(spec);
  return make_model(arch, tp);
}

// Bytes each rank's tensor-parallel communicator sent during training (before the final gather).
std::vector<std::uint64_t> g_tp_bytes;

// Rank results of every mesh rank, in world order (rank = dp·TP + tp).
RunResult run_mesh(const MeshRun& m) {
  const int world = m.tp * m.dp;
  RunSpec s;
  s.stage = m.stage;
  s.world = m.dp;
  s.gas = m.gas;
  s.precision = m.precision;
  s.knobs.optimizer_json = m.optimizer_json;
  s.knobs.allow_untested_optimizer = !m.optimizer_json.empty();
  const std::string json = zero_config_json(s);
  // The groups: one tensor-parallel group per data-parallel index, one data-parallel group per
  // tensor-parallel index (TP innermost, as the device mesh lays ranks out).
  std::vector<std::unique_ptr<LocalGroup>> tp_groups, dp_groups;
  for (int d = 0; d < m.dp; ++d) tp_groups.push_back(std::make_unique<LocalGroup>(m.tp));
  for (int t = 0; t < m.tp; ++t) dp_groups.push_back(std::make_unique<LocalGroup>(m.dp));
  RunResult out;
  out.ranks.resize(static_cast<std::size_t>(world));
  g_tp_bytes.assign(static_cast<std::size_t>(world), 0);
  run_local_ranks(world, [&](Communicator& comm) {
    const int r = comm.rank(), t = r % m.tp, d = r / m.tp;
    LocalCommunicator tp_comm(*tp_groups[static_cast<std::size_t>(d)], t);
    LocalCommunicator dp_comm(*dp_groups[static_cast<std::size_t>(t)], d);
    RankResult& me = out.ranks[static_cast<std::size_t>(r)];
    config::ConfigOptions copts;
    copts.world_size = m.dp;
    const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
    EngineOptions o;
    o.seed = 11;
    o.comm = &dp_comm;
    o.tensor_parallel = &tp_comm;
    o.sequence_length = kT;
    o.checkpoint_activations = m.ckpt;
    Engine e = initialize(build_model(m.model, {t, m.tp}), c, o);
    for (int step = 0; step < m.steps; ++step) {
      for (int g = 0; g < m.gas; ++g) {
        Tokens b = slot_batch(step, g * m.dp + d);
        e.forward(b.batch());
        e.backward();
        e.step();
      }
      me.losses.push_back(e.state().last_step_loss);
      me.grad_norms.push_back(e.state().grad_norm);
    }
    me.report = e.report().zero;
    me.memory = e.report().memory;
    g_tp_bytes[static_cast<std::size_t>(r)] = tp_comm.stats().total_bytes_sent();
    e.gather_master_params([&](const std::string& n, const Tensor& v) { me.params[n] = values(v); });
  });
  return out;
}

const RunResult& one_rank(const char* model, int micro_steps, Precision p, int steps = 3, const std::string& optimizer = {}) {
  static std::map<std::tuple<std::string, int, Precision, int, std::string>, RunResult> cache;
  const auto key = std::make_tuple(std::string(model), micro_steps, p, steps, optimizer);
  auto it = cache.find(key);
  if (it == cache.end()) {
    MeshRun m;
    m.model = model;
    m.optimizer_json = optimizer;
    m.gas = std::max(micro_steps, 1);
    m.steps = micro_steps == 0 ? 0 : steps;
    m.precision = p;
    it = cache.emplace(key, run_mesh(m)).first;
  }
  return it->second;
}

// fp32 against one rank: the row-parallel sums (each rank's partial product, then the group's sum)
// round differently from one GEMM's running sum, in forward activations and in gradients alike;
// Adam then turns that noise, where a gradient element is near zero, into steps of up to ~lr of
// either sign, as zero_test_util.h says of ZeRO's reduction order. Measured over this file's
// matrix (DSTRAIN_TP_VERBOSE=1): loss 2.1e-7 relative, parameters 4.6e-5 absolute, per tensor
// 1.3e-4 and overall 2.8e-5 of the update, key bias 3.1e-5. The bounds are those with a margin of
// about 3; SGD (TensorParallelSgd) shows the underlying difference without Adam: < 1e-5 relative.
// bf16 keeps ZeRO's bf16 tolerance (its rounding of the gradients dominates).
Tolerance tp_tolerance(Precision p) {
  if (p != Precision::fp32) return tolerance(p);
  return {1e-6, 1.5e-4, 0.0, 5e-4, 1e-4, 1e-4};
}

void check_against_one_rank(const MeshRun& m) {
  const RunResult run = run_mesh(m);
  const RunResult& ref = one_rank(m.model, m.gas * m.dp, m.precision, m.steps, m.optimizer_json);
  const RunResult& init = one_rank(m.model, 0, m.precision);
  const Tolerance tol = tp_tolerance(m.precision);
  // Every rank of the mesh reports the same losses and gathers the same whole parameters.
  for (std::size_t r = 1; r < run.ranks.size(); ++r) {
    EXPECT_EQ(run.ranks[r].losses, run.r0().losses) << "rank " << r;
    for (const auto& [name, v] : run.r0().params) ASSERT_EQ(run.ranks[r].params.at(name), v) << "rank " << r << " " << name;
  }
  ASSERT_EQ(run.r0().losses.size(), ref.r0().losses.size());
  for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) {
    const double a = run.r0().losses[k], b = ref.r0().losses[k];
    EXPECT_LE(std::abs(a - b), tol.loss_rtol * std::abs(b)) << "step " << k + 1 << ": loss " << a << ", one rank " << b;
    const double na = run.r0().grad_norms[k], nb = ref.r0().grad_norms[k];
    EXPECT_LE(std::abs(na - nb), (m.precision == Precision::fp32 ? 1e-5 : 1e-2) * std::abs(nb)) << "step " << k + 1 << ": grad norm " << na << ", one rank " << nb;
  }
  ASSERT_EQ(run.r0().params.size(), ref.r0().params.size());
  const ParamDiff d = compare_params(run.r0().params, ref.r0().params, init.r0().params, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  EXPECT_LE(d.update_rel, tol.update_rel);
  EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs) << "attention key bias";
  if (std::getenv("DSTRAIN_TP_VERBOSE") != nullptr) {
    std::printf("MEASURE tp %d dp %d stage %d %s %s: loss %.3g abs %.3g upd_rel %.3g all %.3g keyb %.3g\n", m.tp, m.dp, m.stage, m.model,
                precision_name(m.precision), std::abs(run.r0().losses.back() - ref.r0().losses.back()) / std::abs(ref.r0().losses.back()), d.max_abs,
                d.max_update_rel, d.update_rel, d.key_bias_max_abs);
  }
}

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
// the difference to one rank is the reduction order of the row-parallel sums alone.
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
    std::printf("SGD %s: worst relative difference %.3g\n", model, worst);
    EXPECT_LE(worst, 1e-5);
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
