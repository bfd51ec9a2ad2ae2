// Megatron's sequence parallelism in the norm and dropout regions (models/residual_shards.h,
// docs/parallelism.md §2.3): with TensorParallelRank::shard_residual each tensor-parallel rank
// keeps 1/TP of the residual stream's tokens, the blocks' all-reduces become reduce-scatter /
// all-gather pairs, and training still equals ONE rank at stage 0 with the same global batch within
// the mesh tolerance (mesh_test_util.h's tp_tolerance) — for GPT-2 and Llama (GQA), alone and with
// Ulysses sequence parallelism and data parallelism, ZeRO 0 and 3. Each test fails with the cut
// switched off: the bytes test counts reduce-scatters and all-gathers that the all-reduce path does
// not make, the memory test measures the residual stream's activations at 1/TP.
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "mesh_test_util.h"
#include "zero/communicator.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

constexpr const char* kGpt2Heads4 = "gpt2:L2-C32-H4-V100-T16";
// Llama with 4 key/value heads, so that TP 2 × SP 2 splits them whole.
constexpr const char* kLlamaKv4 = "llama:L2-C32-H8-KV4-I48-V96-T16-tied";

using Combo = std::tuple<int, int, int, int, std::string>;  // tp, sp, dp, stage, model

class MegatronSequenceParallel : public ::testing::TestWithParam<Combo> {};

TEST_P(MegatronSequenceParallel, MatchesOneRank) {
  const auto& [tp, sp, dp, stage, model] = GetParam();
  MeshRun m;
  m.tp = tp;
  m.sp = sp;
  m.dp = dp;
  m.stage = stage;
  m.model = model.c_str();
  m.shard_residual = true;
  check_against_one_rank(m);
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const auto& [tp, sp, dp, stage, model] = info.param;
  return fmt::format("tp{}_sp{}_dp{}_stage{}_{}", tp, sp, dp, stage, model.starts_with("llama") ? "llama" : "gpt2");
}

// B·T = 2·16 tokens per micro-batch (2·8 per Ulysses rank): every TP here divides them.
INSTANTIATE_TEST_SUITE_P(Mesh, MegatronSequenceParallel,
                         ::testing::Values(Combo{2, 1, 2, 0, kGpt2Heads4}, Combo{2, 1, 2, 3, kGpt2Heads4}, Combo{4, 1, 1, 1, kGpt2Heads4},
                                           Combo{2, 2, 1, 2, kGpt2Heads4}, Combo{2, 1, 2, 0, kLlamaModel}, Combo{2, 1, 2, 3, kLlamaModel},
                                           Combo{4, 1, 1, 2, kLlamaModel}, Combo{2, 2, 2, 3, kLlamaKv4}),
                         combo_name);

// Activation checkpointing keeps the blocks' inputs — the rank's rows of the residual stream — and
// recomputes the forward from them; bf16 keeps ZeRO's bf16 tolerance.
TEST(MegatronSequenceParallelPrecision, Bf16AndCheckpointing) {
  for (const char* model : {kGpt2Heads4, kLlamaModel}) {
    SCOPED_TRACE(model);
    MeshRun m;
    m.tp = 2;
    m.dp = 2;
    m.stage = 2;
    m.ckpt = true;
    m.precision = Precision::bf16;
    m.model = model;
    m.shard_residual = true;
    check_against_one_rank(m);
  }
}

// 3 ranks do not divide a micro-batch's 32 tokens: the stream stays whole (the all-reduce path),
// and training still equals one rank.
TEST(MegatronSequenceParallelUneven, TokensThatDoNotDivideStayWhole) {
  EXPECT_FALSE((TensorParallelRank{0, 3, true}.shards_residual(kMicro * kT)));
  EXPECT_TRUE((TensorParallelRank{0, 4, true}.shards_residual(kMicro * kT)));
  EXPECT_FALSE((TensorParallelRank{0, 4, false}.shards_residual(kMicro * kT)));
  MeshRun m;
  m.tp = 3;
  m.model = kLlamaModel;
  m.shard_residual = true;
  check_against_one_rank(m);
}

// The tensor-parallel group's traffic of one step (one micro-batch, B = 2, T = 16, C = 32, fp32,
// L = 2 blocks) with the residual stream cut, counted by the group's communicator, against
// docs/parallelism.md §2.3: each reduce-scatter and all-gather of the (B, T, C) stream sends
// (W−1)/W · B·T·C·4 bytes per rank —
//   per block: forward 2 all-gathers + 2 reduce-scatters; backward 2 all-gathers of d(out) of a
//              row-parallel GEMM, 2 of the norms' outputs again, 2 reduce-scatters: 10
//   embedding: forward 1 reduce-scatter, backward 1 all-gather: 2
//   head:      forward 1 all-gather, backward 1 all-gather again and 1 reduce-scatter: 3
// plus, as without the cut, the cross-entropy's max and (sum, target) all-reduces (3·B·T·4 bytes)
// and the step's fp64 (norm², overflow count), and the norms' gradient sums (all-reduces): GPT-2
// 4C per block + 2C (ln_f), Llama 2C per block + C.
TEST(MegatronSequenceParallelComm, BytesPerStepMatchTheFormula) {
  for (int tp : {2, 4}) {
    for (const char* model : {kGpt2Heads4, kLlamaModel}) {
      SCOPED_TRACE(fmt::format("{} tp {}", model, tp));
      MeshRun m;
      m.tp = tp;
      m.steps = 1;
      m.model = model;
      m.shard_residual = true;
      (void)run_mesh(m);
      const std::uint64_t B = kMicro, T = kT, C = 32, L = 2;
      const bool gpt2 = std::string_view(model).starts_with("gpt2");
      const std::uint64_t stream = (10 * L + 5) * ring_bytes_sent(CollectiveKind::all_gather, B * T * C * 4, tp);
      const std::uint64_t norms = ring_bytes_sent(CollectiveKind::all_reduce, (gpt2 ? 4 * C : 2 * C) * 4, tp) * L +
                                  ring_bytes_sent(CollectiveKind::all_reduce, (gpt2 ? 2 * C : C) * 4, tp);
      const std::uint64_t rest = ring_bytes_sent(CollectiveKind::all_reduce, B * T * 4, tp) + ring_bytes_sent(CollectiveKind::all_reduce, 2 * B * T * 4, tp) +
                                 ring_bytes_sent(CollectiveKind::all_reduce, 16, tp);
      for (std::size_t r = 0; r < g_tp_bytes.size(); ++r) EXPECT_EQ(g_tp_bytes[r], stream + norms + rest) << "rank " << r;
    }
  }
}

// Activation memory per rank: with the cut, the residual stream between the layers and the norm
// regions' activations that a block keeps (x's norm ln1, residual2, ln2: 3·B·T·C, their mean and
// rstd) are 1/TP of the tokens. Measured by the engine's allocator (the activations' buffer, which
// holds every layer's output and saved tensors and the residual gradient), against that count: at
// TP 2 the difference is (1 − 1/TP) of
//   GPT-2: L·(3·BTC·4 + 4·BT·4) + (L + 1)·BTC·4 (outputs) + BTC·4 + 2·BT·4 (ln_f) + BTC·4 (the gradient)
// up to the 64-byte alignment of each tensor.
TEST(MegatronSequenceParallelMemory, ResidualStreamShrinksAsOneOverTp) {
  std::map<bool, double> bytes;
  for (bool cut : {false, true}) {
    MeshRun m;
    m.tp = 2;
    m.steps = 1;
    m.model = kGpt2Heads4;
    m.shard_residual = cut;
    const RunResult run = run_mesh(m);
    bytes[cut] = static_cast<double>(run.r0().memory[MemoryPurpose::activations].current);
  }
  const double B = kMicro, T = kT, C = 32, L = 2, BTC = B * T * C * 4, BT = B * T * 4;
  const double stream = L * (3 * BTC + 4 * BT) + (L + 1) * BTC + BTC + 2 * BT + BTC;
  const double saved = bytes[false] - bytes[true];
  const double tensors = L * 7 + (L + 1) + 3 + 1;
  std::printf("activations per rank at TP 2: whole stream %.0f B, cut %.0f B; saved %.0f B, the count says %.0f B\n", bytes[false], bytes[true], saved,
              stream / 2);
  EXPECT_NEAR(saved, stream / 2, 64 * tensors);
}

}  // namespace
}  // namespace dstrain
