// Sequence parallelism's correctness contract (DeepSpeed-Ulysses, docs/parallelism.md): a
// DP x SP (x TP) mesh of local ranks, each rank holding T / SP tokens of every sequence, trains
// like ONE rank at stage 0 with the same global batch — the same losses (the mean over the whole
// sequences' targets, also when the ranks' shares hold different numbers of ignored targets) and
// the same parameters, within the tensor-parallel tolerance (mesh_test_util.h; the all-to-alls
// move values without arithmetic, so the differences come from the gradient sums over the
// sequence shards and, with TP, the row-parallel sums) — for GPT-2 (positions from s·T) and the
// Llama family (RoPE at the global positions, GQA), composed with ZeRO 0-3 and tensor parallelism.
// The group's bytes per step are counted against the formula of docs/parallelism.md.
#include <map>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "mesh_test_util.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

constexpr const char* kGpt2Heads4 = "gpt2:L2-C32-H4-V100-T16";
// 8 query heads over 4 key/value heads (head_dim 4): TP 2 x SP 2 leaves each rank 2 query heads
// over 1 key/value head.
constexpr const char* kLlamaKv4 = "llama:L2-C32-H8-KV4-I48-V96-T16-tied";

using Combo = std::tuple<int, int, int, int, std::string>;  // tp, sp, dp, stage, model

class SequenceParallel : public ::testing::TestWithParam<Combo> {};

TEST_P(SequenceParallel, MatchesOneRank) {
  const auto& [tp, sp, dp, stage, model] = GetParam();
  MeshRun m;
  m.tp = tp;
  m.sp = sp;
  m.dp = dp;
  m.stage = stage;
  m.model = model.c_str();
  check_against_one_rank(m);
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  return fmt::format("tp{}_sp{}_dp{}_stage{}_{}", std::get<0>(info.param), std::get<1>(info.param), std::get<2>(info.param), std::get<3>(info.param),
                     std::get<4>(info.param).starts_with("llama") ? "llama" : "gpt2");
}

// The meshes of the issue with SP > 1 — (TP, SP, DP) = (1,2,2), (1,4,1), (2,2,1), (2,2,2) — each at
// ZeRO 0 and 3, and (1,2,2) at every stage.
INSTANTIATE_TEST_SUITE_P(Mesh, SequenceParallel,
                         ::testing::Values(Combo{1, 2, 2, 0, kGpt2Heads4}, Combo{1, 2, 2, 1, kGpt2Heads4}, Combo{1, 2, 2, 2, kGpt2Heads4},
                                           Combo{1, 2, 2, 3, kGpt2Heads4}, Combo{1, 4, 1, 0, kGpt2Heads4}, Combo{1, 4, 1, 3, kGpt2Heads4},
                                           Combo{2, 2, 1, 0, kGpt2Heads4}, Combo{2, 2, 1, 3, kGpt2Heads4}, Combo{2, 2, 2, 0, kGpt2Heads4},
                                           Combo{2, 2, 2, 3, kGpt2Heads4}, Combo{1, 2, 2, 0, kLlamaKv4}, Combo{1, 2, 2, 1, kLlamaKv4},
                                           Combo{1, 2, 2, 2, kLlamaKv4}, Combo{1, 2, 2, 3, kLlamaKv4}, Combo{1, 4, 1, 0, kLlamaKv4},
                                           Combo{1, 4, 1, 3, kLlamaKv4}, Combo{2, 2, 1, 0, kLlamaKv4}, Combo{2, 2, 1, 3, kLlamaKv4},
                                           Combo{2, 2, 2, 0, kLlamaKv4}, Combo{2, 2, 2, 3, kLlamaKv4}),
                         combo_name);

// Ignored targets (-1) in one rank's share only: the loss is still the mean over the whole
// sequences' targets (the group's count), not a mean of the ranks' means.
TEST(SequenceParallelLoss, IgnoredTargetsInOneShareAreWeightedExactly) {
  for (const char* model : {kGpt2Heads4, kLlamaKv4}) {
    SCOPED_TRACE(model);
    MeshRun m;
    m.sp = 2;
    m.dp = 2;
    m.model = model;
    m.ignored = {1, 2, 3, 5, 6};  // positions of sequence 0 in the first half (sp rank 0's share)
    check_against_one_rank(m);
  }
}

// The same with SGD, where nothing amplifies rounding noise: the parameters agree to rounding.
TEST(SequenceParallelLoss, IgnoredTargetsWithSgdMatchToRounding) {
  for (const char* model : {kGpt2Heads4, kLlamaKv4}) {
    SCOPED_TRACE(model);
    MeshRun m;
    m.sp = 2;
    m.dp = 2;
    m.model = model;
    m.ignored = {1, 2, 3, 5, 6};
    m.optimizer_json = R"({"type": "SGD", "params": {"lr": 0.5}})";
    const RunResult run = run_mesh(m);
    const RunResult& ref = one_rank(m.model, m.gas * m.dp, m.precision, m.steps, m.optimizer_json, m.ignored);
    double worst = 0;
    for (const auto& [name, want] : ref.r0().params) {
      const std::vector<float>& got = run.r0().params.at(name);
      for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1e-3 + std::abs(double(want[i]))));
    }
    EXPECT_LE(worst, 3e-5);
    for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) EXPECT_NEAR(run.r0().losses[k], ref.r0().losses[k], 1e-6 * ref.r0().losses[k]);
  }
}

TEST(SequenceParallelPrecision, Bf16AndCheckpointing) {
  MeshRun m;
  m.sp = 2;
  m.dp = 2;
  m.stage = 2;
  m.ckpt = true;
  m.precision = Precision::bf16;
  m.model = kLlamaKv4;
  check_against_one_rank(m);
}

// Per block, forward: one all-to-all of the (B, Tl, 3C) qkv rows and one of the (B, Tl, C)
// attention output; backward the same two; each sends (SP−1)/SP of its buffer. Per micro-batch
// the engine adds two fp64 all-reduces (the group's target count and loss sum). GPT-2: W = 3C.
TEST(SequenceParallelComm, BytesPerStepMatchTheFormula) {
  for (int sp : {2, 4}) {
    MeshRun m;
    m.sp = sp;
    m.steps = 1;
    m.model = kGpt2Heads4;
    (void)run_mesh(m);
    const std::uint64_t B = kMicro, Tl = static_cast<std::uint64_t>(kT / sp), C = 32, L = 2, S = static_cast<std::uint64_t>(sp);
    const std::uint64_t all_to_all = 2 * L * ((S - 1) * B * Tl * (3 * C) * 4 / S + (S - 1) * B * Tl * C * 4 / S);
    const std::uint64_t scalars = 2 * ring_bytes_sent(CollectiveKind::all_reduce, 8, sp);
    for (std::size_t r = 0; r < g_sp_bytes.size(); ++r) EXPECT_EQ(g_sp_bytes[r], all_to_all + scalars) << "sp " << sp << " rank " << r;
  }
}

// Activation memory per rank (the allocator's peak for activations over a step) shrinks with SP:
// every activation is a rank's Tl = T/SP tokens, or 1/SP of the heads over all T tokens.
TEST(SequenceParallelMemory, ActivationsShrinkWithSp) {
  std::map<int, double> peak;
  for (int sp : {1, 2, 4}) {
    MeshRun m;
    m.sp = sp;
    m.steps = 1;
    m.model = kLlamaKv4;
    const RunResult run = run_mesh(m);
    peak[sp] = static_cast<double>(run.r0().memory[MemoryPurpose::activations].peak);
  }
  EXPECT_LT(peak[2], 0.57 * peak[1]);  // measured 0.53 (0.60 when the rank's qkv was kept beside qkv_heads)
  EXPECT_LT(peak[4], 0.29 * peak[1]);  // measured 0.27
  std::printf("activation peak per rank: SP 1 %.0f B, SP 2 %.0f B (%.2f), SP 4 %.0f B (%.2f)\n", peak[1], peak[2], peak[2] / peak[1], peak[4],
              peak[4] / peak[1]);
}

// ALST's tiled loss: the head's logits in tiles of 5 positions (a micro-batch's 32, or 16 / 8 per
// SP rank, cut unevenly), never whole. The first step's loss is the untiled one bit for bit (the
// same row-wise kernels, the same ordered sum); training matches one untiled rank within the mesh
// tolerance (d(W) sums the tiles' products in tile order); the logits are no longer an activation.
TEST(SequenceParallelTiledLoss, TilesMatchTheWholeLogits) {
  for (const char* model : {kGpt2Heads4, kLlamaKv4}) {
    for (const auto& [tp, sp] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
      SCOPED_TRACE(fmt::format("{} tp {} sp {}", model, tp, sp));
      MeshRun m;
      m.tp = tp;
      m.sp = sp;
      m.dp = 4 / (tp * sp);
      m.model = model;
      m.loss_tile_rows = 5;
      check_against_one_rank(m);
      MeshRun untiled = m;
      untiled.loss_tile_rows = 0;
      untiled.steps = 1;
      m.steps = 1;
      const RunResult a = run_mesh(m), b = run_mesh(untiled);
      EXPECT_EQ(a.r0().losses, b.r0().losses);
      // (B, T/SP, Vp) fp32 logits fewer (the tile (5, Vp) is scratch), in the activations' peak.
      const double logits = static_cast<double>(kMicro * (kT / sp) * 128 * 4 / tp);
      EXPECT_LE(static_cast<double>(a.r0().memory[MemoryPurpose::activations].peak),
                static_cast<double>(b.r0().memory[MemoryPurpose::activations].peak) - 0.9 * logits);
    }
  }
}

// ALST's tiled MLP: the blocks' MLP in tiles of 5 positions (a micro-batch's 32, or 16 / 8 per SP
// rank, cut unevenly), its hidden features never kept. Training matches one untiled rank within the
// mesh tolerance (d(W) sums the tiles' products in tile order), also with Megatron's cut residual
// stream; the first step's loss equals the untiled one (each position's features come from the same
// row-wise GEMM). The MLP's saved activations are gone from the activations' buffer: exactly
// L · (B·T/SP) · (GPT-2: 2 · 4C; Llama: 3 · I / TP) · 4 bytes fewer (the tiles are scratch).
TEST(SequenceParallelTiledMlp, TilesMatchTheWholeMlp) {
  for (const char* model : {kGpt2Heads4, kLlamaKv4}) {
    const bool gpt2 = std::string_view(model).starts_with("gpt2");
    for (const auto& [tp, sp, cut] : {std::tuple{1, 1, false}, std::tuple{1, 2, false}, std::tuple{2, 2, true}}) {
      SCOPED_TRACE(fmt::format("{} tp {} sp {} cut {}", model, tp, sp, cut));
      MeshRun m;
      m.tp = tp;
      m.sp = sp;
      m.dp = 4 / (tp * sp);
      m.model = model;
      m.mlp_tile_rows = 5;
      m.shard_residual = cut;
      check_against_one_rank(m);
      MeshRun untiled = m;
      untiled.mlp_tile_rows = 0;
      untiled.steps = 1;
      m.steps = 1;
      const RunResult a = run_mesh(m), b = run_mesh(untiled);
      EXPECT_NEAR(a.r0().losses[0], b.r0().losses[0], 1e-6 * std::abs(b.r0().losses[0]));
      const double L = 2, tokens = kMicro * (kT / sp), features = gpt2 ? 2 * 4 * 32 / tp : 3 * 48 / tp;
      const double saved = static_cast<double>(b.r0().memory[MemoryPurpose::activations].current) -
                           static_cast<double>(a.r0().memory[MemoryPurpose::activations].current);
      EXPECT_NEAR(saved, L * tokens * features * 4, 64 * 3 * L);
    }
  }
}

// Heads that do not divide by the sequence-parallel size are refused before step 1, naming the key.
TEST(SequenceParallelRefusals, HeadsNotDivisibleBySp) {
  const auto arch = gpt2_family().from_spec("gpt2:L2-C48-H6-V100-T16");
  try {
    arch->check_sequence_parallel(4, 1);
    FAIL() << "6 heads over 4 sequence-parallel ranks were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence_parallel_size 4"), std::string::npos) << e.what();
  }
  const auto llama = llama_family().from_spec(kLlamaModel);  // 2 key/value heads
  EXPECT_THROW(llama->check_sequence_parallel(4, 1), Error);
  EXPECT_NO_THROW(llama->check_sequence_parallel(2, 1));
}

}  // namespace
}  // namespace dstrain
