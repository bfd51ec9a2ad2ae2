// The pre-flight's memory estimate (train/memory_estimate.h) on a device mesh (docs/parallelism.md
// §1, §4 "Memory estimate"): a rank's parameters are its tensor-parallel pieces plus the replicated
// ones, ZeRO divides by the DP x SP ranks of its data group, the logits are a rank's tokens and
// vocabulary rows (one ALST tile with sequence parallelism), and the pre-flight refuses by that
// figure. The expected counts are written out here from the models' shapes (AutoTP's n / W +
// (r < n % W) units on rank 0), not taken from the code under test, and held against what the
// engine's allocator holds on a mesh of local ranks. Each test fails with the mesh ignored (the
// whole model per rank, ZeRO over DP alone, the logits of B x T x Vp). Under expert parallelism
// (expert_parallel.autoep_size = EP) a rank stores E / EP experts of every sparse layer, and ZeRO
// partitions them over the W / EP ranks holding the same experts: those tests fail with every
// expert counted on every rank, or the experts partitioned over the whole data group.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "mesh_test_util.h"
#include "models/model_registry.h"
#include "ops/error.h"
#include "train/memory_estimate.h"
#include "train/progress.h"
#include "train/training_plan.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

constexpr const char* kGpt2Heads4 = "gpt2:L2-C32-H4-V100-T16";  // 4 heads of 8; 100 tokens padded to 128 rows
constexpr const char* kLlamaGqa = kLlamaModel;                  // llama:L2-C32-H4-KV2-I48-V96-T16-tied

// Rank 0's units of n over W ranks (AutoTP's spread): n / W, one more while n % W is left.
std::int64_t rank0_units(std::int64_t n, int W) { return n / W + (n % W > 0 ? 1 : 0); }

// GPT-2's parameters on tensor-parallel rank 0 of W, from its shapes (docs/parallelism.md §2):
// wte's vocabulary rows cut; wpe, the LayerNorms and the two c_proj biases whole; per block c_attn's
// q, k, v rows and attn.c_proj's columns in whole heads, c_fc's rows and mlp.c_proj's columns in
// MLP features. The LM head is tied to wte.
struct Gpt2Shape {
  std::int64_t L, C, H, Vp, P;
};
double gpt2_rank0_parameters(const Gpt2Shape& s, int W) {
  const std::int64_t hs = s.C / s.H, q = rank0_units(s.H, W) * hs, ff = rank0_units(4 * s.C, W);
  const double block = 2.0 * s.C                               // ln_1
                       + 3.0 * q * s.C + 3.0 * q               // c_attn weight (3 parts of q rows), bias
                       + static_cast<double>(s.C) * q + s.C    // attn.c_proj weight (q columns), bias (whole)
                       + 2.0 * s.C                             // ln_2
                       + static_cast<double>(ff) * s.C + ff    // c_fc weight, bias
                       + static_cast<double>(s.C) * ff + s.C;  // mlp.c_proj weight, bias (whole)
  return static_cast<double>(rank0_units(s.Vp, W)) * s.C + static_cast<double>(s.P) * s.C + static_cast<double>(s.L) * block + 2.0 * s.C;
}

// The Llama family's, without biases: qkv_proj's rows in whole key/value heads (q in the groups of
// H / KV query heads that share each), o_proj's columns in those query heads, gate / up rows and
// down columns in MLP features, embed_tokens' vocabulary rows (the LM head tied), norms whole.
struct LlamaShape {
  std::int64_t L, C, H, KV, D, I, Vp;
  bool tied;
};
double llama_rank0_parameters(const LlamaShape& s, int W) {
  const std::int64_t kv = rank0_units(s.KV, W), q = kv * (s.H / s.KV), inter = rank0_units(s.I, W);
  const double block = 2.0 * s.C + static_cast<double>((q + 2 * kv) * s.D) * s.C + static_cast<double>(s.C) * (q * s.D) + 3.0 * inter * s.C;
  const double table = static_cast<double>(rank0_units(s.Vp, W)) * s.C;
  return table * (s.tied ? 1.0 : 2.0) + static_cast<double>(s.L) * block + s.C;
}

constexpr Gpt2Shape kGpt2Shape{2, 32, 4, 128, 16};
constexpr LlamaShape kLlamaShape{2, 32, 4, 2, 8, 48, 128, true};
// Owned (untied) tensors: GPT-2 wte, wpe + 12 per block + ln_f's 2; Llama embed_tokens + 7 per
// block (2 norms, qkv, o, gate, up, down) + the final norm.
constexpr std::int64_t kGpt2Tensors = 2 + 12 * 2 + 2, kLlamaTensors = 1 + 7 * 2 + 1;

std::shared_ptr<const Architecture> arch(const char* spec) { return model_architecture(spec); }

config::DsConfig parse(const std::string& json, int world) {
  config::ConfigOptions o;
  o.world_size = world;
  return config::parse_ds_config(config::Json::parse(json), o);
}

// (a) A rank's parameters are tensor-parallel rank 0's pieces plus the replicated parameters: the
// count from the shapes, exactly; in bytes at most the allocator's padding below what the engine's
// allocator holds for rank 0 at stage 0 (fp32). The padding (zero/flat_layout.h, zero_test_util.h's
// padded_numel): each tensor starts 64-byte aligned and each layer's buffer ends so, i.e. at most 15
// fp32 elements = 60 B after each of its tensors, and at one data-parallel rank no more; so
//   0 <= allocator - estimate <= 60 B x tensors.
TEST(MemoryEstimateMesh, ParamsAreTensorParallelRankZerosPiecesAsTheAllocatorHoldsThem) {
  for (const char* model : {kGpt2Heads4, kLlamaGqa}) {
    const bool llama = std::string_view(model).starts_with("llama");
    for (const int tp : {1, 2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << model << " tp " << tp);
      MeshRun m;
      m.tp = tp;
      m.steps = 0;
      m.model = model;
      const RunResult run = run_mesh(m);
      const MemoryEstimate e = estimate_rank_memory(*arch(model), parse(mesh_config_json(m), tp), kT);
      const double expected = llama ? llama_rank0_parameters(kLlamaShape, tp) : gpt2_rank0_parameters(kGpt2Shape, tp);
      EXPECT_EQ(e.rank_parameters, expected);
      EXPECT_EQ(e.parameters, llama ? llama_rank0_parameters(kLlamaShape, 1) : gpt2_rank0_parameters(kGpt2Shape, 1));  // the whole model
      EXPECT_EQ(e.params, 4.0 * expected);
      EXPECT_EQ(e.grads, 4.0 * expected);
      EXPECT_EQ(e.optimizer, 8.0 * expected);  // AdamW's two moments, fp32 without masters apart
      const double held = static_cast<double>(run.r0().memory[MemoryPurpose::params].current);
      const double bound = 60.0 * static_cast<double>(llama ? kLlamaTensors : kGpt2Tensors);
      EXPECT_GE(held, e.params);
      EXPECT_LE(held - e.params, bound);
      // Rank 0 holds the most: no rank of the mesh holds fewer bytes than the estimate's parameters.
      for (const RankResult& r : run.ranks) EXPECT_LE(static_cast<double>(r.memory[MemoryPurpose::params].current), held);
      std::printf("MEASURE %s tp %d: estimate params %.0f B (%.0f parameters), allocator %.0f B (rank 0), padding %.0f B <= %.0f\n", model, tp,
                  e.params, e.rank_parameters, held, held - e.params, bound);
    }
  }
}

// The two-block copy scaled by n_layer equals the count of every block: GPT-2 XL (25 heads of 64,
// 6400 MLP features) over 4 ranks, 7 heads on rank 0.
TEST(MemoryEstimateMesh, ScaledBlocksCountLikeEveryBlockOfALargeModel) {
  for (const int tp : {2, 4, 3}) {
    SCOPED_TRACE(tp);
    const config::DsConfig cfg = parse(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {{"autotp_size": {}}}}})", tp), tp);
    EXPECT_EQ(estimate_rank_memory(*arch("gpt2:d48"), cfg, 1024).rank_parameters, gpt2_rank0_parameters({48, 1600, 25, 50304, 1024}, tp));
    // Untied Llama with grouped-query attention: 8 key/value heads of 128, 32 query heads.
    EXPECT_EQ(estimate_rank_memory(*arch("llama:L32-C4096-H32-KV8-I14336-V128256"), cfg, 1024).rank_parameters,
              llama_rank0_parameters({32, 4096, 32, 8, 128, 14336, 128256, false}, tp));
  }
  // A descriptor too large for int64 arithmetic stays finite and fast: two blocks are built, not 2^32.
  const auto start = std::chrono::steady_clock::now();
  const config::DsConfig cfg = parse(R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}})", 2);
  const MemoryEstimate huge = estimate_rank_memory(*arch("gpt2:L4294967296-C4294967296-H2"), cfg, 16);
  EXPECT_TRUE(std::isfinite(huge.per_rank()));
  EXPECT_LT(huge.rank_parameters, 0.51 * huge.parameters);
  EXPECT_GT(huge.rank_parameters, 0.49 * huge.parameters);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

// (b) ZeRO partitions over the DP x SP ranks of a tensor-parallel index: world 8 at TP 2 (DP 4),
// TP 2 x SP 2 (DP 2: 4 ranks), SP 2 (DP 4: 8 ranks) and TP 4 (DP 2), at stages 1-3 — and on the TP 2 x SP 2 x DP 2
// mesh at stage 3 the engine's partitions are that quarter of rank 0's pieces (up to the padding:
// each layer's buffer a multiple of 64 B per data rank, after the 60 B per tensor above).
TEST(MemoryEstimateMesh, ZeroDividesByTheDataGroup) {
  const double psi_tp2 = gpt2_rank0_parameters(kGpt2Shape, 2), psi = gpt2_rank0_parameters(kGpt2Shape, 1);
  struct Mesh {
    int tp, sp;
    double zero_ranks, rank_parameters;
  };
  for (const Mesh& mesh :
       {Mesh{2, 1, 4.0, psi_tp2}, Mesh{2, 2, 4.0, psi_tp2}, Mesh{1, 2, 8.0, psi}, Mesh{4, 1, 2.0, gpt2_rank0_parameters(kGpt2Shape, 4)}}) {
    for (const int stage : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "world 8, tp " << mesh.tp << " sp " << mesh.sp << " stage " << stage);
      MeshRun m;
      m.tp = mesh.tp;
      m.sp = mesh.sp;
      m.dp = 8 / (mesh.tp * mesh.sp);
      m.stage = stage;
      const MemoryEstimate e = estimate_rank_memory(*arch(kGpt2Heads4), parse(mesh_config_json(m), 8), kT);
      const double W = mesh.zero_ranks, psi_r = mesh.rank_parameters;
      EXPECT_EQ(e.zero_ranks, W);
      EXPECT_EQ(e.params, 4.0 * psi_r / (stage >= 3 ? W : 1.0));
      EXPECT_EQ(e.grads, 4.0 * psi_r / (stage >= 2 ? W : 1.0));
      EXPECT_EQ(e.optimizer, 8.0 * psi_r / W);
    }
  }
  MeshRun m;
  m.tp = 2;
  m.sp = 2;
  m.dp = 2;
  m.stage = 3;
  m.steps = 0;
  m.model = kGpt2Heads4;
  m.persistence_threshold = 0;  // every layer partitioned, none kept whole below the threshold
  const RunResult run = run_mesh(m);
  const MemoryEstimate e = estimate_rank_memory(*arch(kGpt2Heads4), parse(mesh_config_json(m), 8), kT);
  const ZeroReport& z = run.r0().report;
  // Per layer at most 60 B per tensor and 64 B per data rank of padding, shared by the 4 data ranks.
  const double bound = (60.0 * kGpt2Tensors + 64.0 * 3 * 4) / 4.0;
  for (const auto& [held, estimate, what] :
       {std::make_tuple(static_cast<double>(z.param_bytes), e.params, "params"), std::make_tuple(static_cast<double>(z.grad_bytes), e.grads, "grads"),
        std::make_tuple(static_cast<double>(z.optimizer_bytes), e.optimizer, "optimizer")}) {
    const double scale = std::string_view(what) == "optimizer" ? 2.0 : 1.0;  // Adam's two moments
    EXPECT_GE(held, estimate) << what;
    EXPECT_LE(held - estimate, scale * bound) << what;
    std::printf("MEASURE tp 2 x sp 2 x dp 2, stage 3, rank 0 %s: estimate %.0f B, engine %.0f B\n", what, estimate, held);
  }
}

// (c) The logits of one micro-batch (B = 2, fp32 unless said): T / SP tokens of each sequence, Vp /
// TP rows rounded up (rank 0's), and with SP one ALST tile, floor(64 MiB / row bytes) positions.
TEST(MemoryEstimateMesh, LogitsShrinkWithTheRanksTokensAndRows) {
  const auto logits = [](const char* model, int world, int tp, int sp, const char* extra, std::int64_t T) {
    const std::string json =
        fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "tensor_parallel": {{"autotp_size": {}}}, "sequence_parallel_size": {}{}}})", kMicro,
                    tp, sp, extra);
    return estimate_rank_memory(*arch(model), parse(json, world), T).activations;
  };
  // gpt2:L2-C32-H4-V100-T16, Vp = 128, T = 16: B·T·Vp·4 at TP 1, then 64, 43, 32 rows; SP 2: 8 tokens.
  EXPECT_EQ(logits(kGpt2Heads4, 1, 1, 1, "", 16), 2.0 * 16 * 128 * 4);
  EXPECT_EQ(logits(kGpt2Heads4, 2, 2, 1, "", 16), 2.0 * 16 * 64 * 4);
  EXPECT_EQ(logits(kGpt2Heads4, 3, 3, 1, "", 16), 2.0 * 16 * 43 * 4);
  EXPECT_EQ(logits(kGpt2Heads4, 4, 4, 1, "", 16), 2.0 * 16 * 32 * 4);
  EXPECT_EQ(logits(kGpt2Heads4, 2, 1, 2, "", 16), 2.0 * 8 * 128 * 4);
  EXPECT_EQ(logits(kGpt2Heads4, 4, 2, 2, "", 16), 2.0 * 8 * 64 * 4);
  // GPT-2's 50304 rows at T = 1024: one rank's 2 x 512 positions at SP 2 are 206 MB of fp32 logits,
  // so one tile of floor(64 MiB / (50304 x 4 B)) = 333 positions is kept; at TP 2 (25152 rows) a
  // tile holds 667 of the rank's 1024 positions.
  const char* wide = "gpt2:L1-C64-H4-T1024";
  EXPECT_EQ(logits(wide, 1, 1, 1, "", 1024), 2.0 * 1024 * 50304 * 4);
  EXPECT_EQ(logits(wide, 2, 1, 2, "", 1024), 333.0 * 50304 * 4);
  EXPECT_EQ(logits(wide, 4, 2, 2, "", 1024), 667.0 * 25152 * 4);
  EXPECT_EQ(logits(wide, 4, 2, 2, R"(, "bf16": {"enabled": true})", 1024), 1024.0 * 25152 * 2);  // 1334 positions fit: the rank's 1024 whole
  EXPECT_EQ(logits(wide, 8, 2, 4, "", 1024), 512.0 * 25152 * 4);                                 // T / 4 = 256 tokens x 2 sequences
}

// A mixture of experts (test_mesh_moe.cpp's): 8 heads of 4, 4 key/value heads, 4 experts of width
// 24 per layer (gate, up: E x I x C, down: E x C x I), the router E x C, 96 tokens padded to 128 rows
// (the LM head tied).
constexpr const char* kMoeModel = "moe:L2-C32-H8-KV4-E4-K2-I24-V96-T16-tied-norm-aux0.05";
struct MoeShape {
  std::int64_t L, C, H, KV, D, E, I, Vp;
};
constexpr MoeShape kMoeShape{2, 32, 8, 4, 4, 4, 24, 128};
// Owned tensors: embed_tokens + 8 per block (2 norms, qkv, o, the router, 3 expert stacks) + the final norm.
constexpr std::int64_t kMoeTensors = 1 + 8 * 2 + 1;

// The experts' parameters of the whole model: L x E x 3 x I x C.
double moe_expert_parameters(const MoeShape& s) { return static_cast<double>(s.L * s.E * 3 * s.I * s.C); }

// Rank 0's parameters at TP `tp` x EP `ep`: the attention and vocabulary cut as the Llama family's
// (the experts and the router whole across the tensor-parallel ranks), E / EP experts of each layer.
double moe_rank0_parameters(const MoeShape& s, int tp, int ep) {
  const std::int64_t kv = rank0_units(s.KV, tp), q = kv * (s.H / s.KV);
  const double block = 2.0 * s.C + static_cast<double>((q + 2 * kv) * s.D) * s.C + static_cast<double>(s.C) * (q * s.D) +
                       static_cast<double>(s.E * s.C) + 3.0 * static_cast<double>((s.E / ep) * s.I * s.C);
  return static_cast<double>(rank0_units(s.Vp, tp)) * s.C + static_cast<double>(s.L) * block + s.C;
}

// (e) Expert parallelism: a rank stores E / EP experts of every sparse layer (and tensor-parallel rank
// 0's pieces of the rest under TP); at stage 0 that is what the allocator holds, up to its padding.
// World 4: DP 4 with EP 2 and 4, and TP 2 x DP 2 with EP 2.
TEST(MemoryEstimateMesh, ExpertParallelRanksStoreTheirExperts) {
  ASSERT_EQ(moe_rank0_parameters(kMoeShape, 1, 1), arch(kMoeModel)->stored_parameter_count());  // the shapes above are the model's
  struct Mesh {
    int tp, dp, ep;
  };
  for (const Mesh& mesh : {Mesh{1, 4, 2}, Mesh{1, 4, 4}, Mesh{2, 2, 2}}) {
    SCOPED_TRACE(testing::Message() << "tp " << mesh.tp << " dp " << mesh.dp << " ep " << mesh.ep);
    MeshRun m;
    m.tp = mesh.tp;
    m.dp = mesh.dp;
    m.ep = mesh.ep;
    m.steps = 0;
    m.model = kMoeModel;
    const RunResult run = run_mesh(m);
    const MemoryEstimate e = estimate_rank_memory(*arch(kMoeModel), parse(mesh_config_json(m), 4), kT);
    const double expected = moe_rank0_parameters(kMoeShape, mesh.tp, mesh.ep);
    EXPECT_EQ(e.rank_parameters, expected);
    EXPECT_EQ(e.expert_parameters, moe_expert_parameters(kMoeShape) / mesh.ep);
    EXPECT_EQ(e.parameters, moe_rank0_parameters(kMoeShape, 1, 1));
    EXPECT_EQ(e.zero_ranks, mesh.dp);
    EXPECT_EQ(e.expert_zero_ranks, mesh.dp / mesh.ep);
    EXPECT_EQ(e.params, 4.0 * expected);
    EXPECT_EQ(e.grads, 4.0 * expected);
    EXPECT_EQ(e.optimizer, 8.0 * expected);
    const double held = static_cast<double>(run.r0().memory[MemoryPurpose::params].current);
    const double bound = 60.0 * static_cast<double>(kMoeTensors);
    EXPECT_GE(held, e.params);
    EXPECT_LE(held - e.params, bound);
    for (const RankResult& r : run.ranks) EXPECT_LE(static_cast<double>(r.memory[MemoryPurpose::params].current), held);
    std::printf("MEASURE %s tp %d ep %d: estimate params %.0f B (%.0f parameters, %.0f of them experts), allocator %.0f B (rank 0)\n", kMoeModel,
                mesh.tp, mesh.ep, e.params, e.rank_parameters, e.expert_parameters, held);
  }
}

// The one- and two-block copies scaled by n_layer count a large mixture's rank as every block would:
// Mixtral-sized blocks (8 experts of 14336, 32 layers) at EP 4 and 8, TP 1 and 2, in well under a second.
TEST(MemoryEstimateMesh, ScaledBlocksCountTheExpertPiecesOfALargeMixture) {
  const MoeShape mixtral{32, 4096, 32, 8, 128, 8, 14336, 32000};
  const auto model = arch("moe:L32-C4096-H32-KV8-E8-K2-I14336-V32000-T4096-tied");
  ASSERT_EQ(model->stored_parameter_count(), moe_rank0_parameters(mixtral, 1, 1));
  const auto start = std::chrono::steady_clock::now();
  for (const auto& [tp, ep] : {std::pair{1, 4}, std::pair{1, 8}, std::pair{2, 4}}) {
    SCOPED_TRACE(testing::Message() << "tp " << tp << " ep " << ep);
    const config::DsConfig cfg = parse(fmt::format(R"({{"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {{"autotp_size": {}}},
        "expert_parallel": {{"enabled": true, "autoep_size": {}}}}})",
                                                   tp, ep),
                                       8 * tp);
    const MemoryEstimate e = estimate_rank_memory(*model, cfg, 1024);
    EXPECT_EQ(e.rank_parameters, moe_rank0_parameters(mixtral, tp, ep));
    EXPECT_EQ(e.expert_parameters, moe_expert_parameters(mixtral) / ep);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

// ZeRO under expert parallelism: per rank the non-expert parameters / W plus its expert pieces /
// (W / EP) — which is the whole model's experts / W. World 4 = DP 4, EP 2, stages 1-3 from the
// shapes; at stage 3 the engine's partitions are those, up to the padding.
TEST(MemoryEstimateMesh, ZeroPartitionsTheExpertsOverTheExpertDataGroup) {
  const double whole = moe_rank0_parameters(kMoeShape, 1, 1), experts = moe_expert_parameters(kMoeShape);
  const double rank = moe_rank0_parameters(kMoeShape, 1, 2);              // half the experts
  const double share = (whole - experts) / 4.0 + (experts / 2.0) / 2.0;  // non-expert over 4, its experts over 2
  for (const int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    MeshRun m;
    m.dp = 4;
    m.ep = 2;
    m.stage = stage;
    const MemoryEstimate e = estimate_rank_memory(*arch(kMoeModel), parse(mesh_config_json(m), 4), kT);
    EXPECT_EQ(e.params, 4.0 * (stage >= 3 ? share : rank));
    EXPECT_EQ(e.grads, 4.0 * (stage >= 2 ? share : rank));
    EXPECT_EQ(e.optimizer, 8.0 * share);
    EXPECT_EQ(e.zero_partition(), share);
  }
  MeshRun m;
  m.dp = 4;
  m.ep = 2;
  m.stage = 3;
  m.steps = 0;
  m.model = kMoeModel;
  m.persistence_threshold = 0;
  const RunResult run = run_mesh(m);
  const MemoryEstimate e = estimate_rank_memory(*arch(kMoeModel), parse(mesh_config_json(m), 4), kT);
  const ZeroReport& z = run.r0().report;
  // Per layer at most 60 B per tensor and 64 B per data rank of padding (3 layers' worth of units
  // and the expert unit per block), shared by the ranks of a partition.
  const double bound = (60.0 * kMoeTensors + 64.0 * 5 * 4) / 2.0;
  for (const auto& [held, estimate, what] :
       {std::make_tuple(static_cast<double>(z.param_bytes), e.params, "params"), std::make_tuple(static_cast<double>(z.grad_bytes), e.grads, "grads"),
        std::make_tuple(static_cast<double>(z.optimizer_bytes), e.optimizer, "optimizer")}) {
    const double scale = std::string_view(what) == "optimizer" ? 2.0 : 1.0;
    EXPECT_GE(held, estimate) << what;
    EXPECT_LE(held - estimate, scale * bound) << what;
    std::printf("MEASURE dp 4 x ep 2, stage 3, rank 0 %s: estimate %.0f B, engine %.0f B\n", what, estimate, held);
  }
}

// A pipeline stage's rank under expert parallelism stores its stage's layers with E / EP experts,
// the experts counted apart for ZeRO: world 4 = 2 stages x DP 2, EP 2.
TEST(MemoryEstimateMesh, PipelineStagesCountTheirExpertPieces) {
  const char* model = "moe:L2-C32-H8-KV4-E4-K2-I24-V96-T16-tied";  // no aux loss: a pipeline may cut it
  const config::DsConfig cfg = parse(R"({"train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 2},
      "zero_optimization": {"stage": 1}, "expert_parallel": {"enabled": true, "autoep_size": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})",
                                     4);
  const auto a = arch(model);
  const StageParts parts = partition_layers(a->make_layers(), 2, "uniform");
  std::vector<double> experts;
  const std::vector<double> params = pipeline_stage_parameters(*a, cfg, parts, 2, &experts);
  ASSERT_EQ(params.size(), 2u);
  ASSERT_EQ(experts.size(), 2u);
  // Every stage's parameters together: rank 0's of the whole model (the tied table counted on
  // each stage that holds it without its owner); the experts, half of each layer's, all in blocks.
  EXPECT_EQ(experts[0] + experts[1], moe_expert_parameters(kMoeShape) / 2.0);
  EXPECT_GE(params[0] + params[1], moe_rank0_parameters(kMoeShape, 1, 2));
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    const MemoryEstimate e = estimate_pipeline_stage_memory(*a, cfg, kT, params, s, false, experts);
    const std::size_t i = static_cast<std::size_t>(s);
    EXPECT_EQ(e.expert_parameters, experts[i]);
    EXPECT_EQ(e.optimizer, 8.0 * ((params[i] - experts[i]) / 2.0 + experts[i] / 1.0));  // DP 2 per stage, EP 2: the experts' group is one rank
    EXPECT_EQ(estimate_state_memory(params[i], cfg, experts[i]).optimizer, e.optimizer);
  }
}

// (d) The pre-flight (check_plan_memory, what plan_training calls) refuses by the mesh's figure: a
// model that fits in the memory given only because tensor parallelism splits it trains at TP 2, and
// is refused as two data-parallel ranks holding it whole. gpt2:L2-C256-H8-V1024-T16, AdamW in fp32
// at stage 0 (16 B per parameter), B = 2, T = 16; the limit is 1.25 x the two TP ranks' figure from
// the shapes, which the whole model's two copies exceed.
TEST(MemoryEstimateMesh, PreflightRefusesByTheMeshsFigure) {
  const Gpt2Shape shape{2, 256, 8, 1024, 16};
  const double tp_rank = 16.0 * gpt2_rank0_parameters(shape, 2) + 2.0 * 16 * 512 * 4;  // states + logits of 512 rows
  const double whole_rank = 16.0 * gpt2_rank0_parameters(shape, 1) + 2.0 * 16 * 1024 * 4;
  const HostMemoryLimit limit{1.25 * 2.0 * tp_rank, "the test's limit"};
  ASSERT_GT(2.0 * whole_rank, limit.bytes);
  const auto plan = [](int tp) {
    TrainingPlan p;
    p.model_spec = "gpt2:L2-C256-H8-V1024-T16";
    p.model = arch(p.model_spec.c_str());
    p.config = parse(fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3}}}},
        "tensor_parallel": {{"autotp_size": {}}}}})",
                                 tp),
                     2);
    p.world = 2;
    p.mesh = make_mesh_shape(2, tp, 1);
    p.sequence_length = 16;
    return p;
  };
  EXPECT_NO_THROW(check_plan_memory(plan(2), 2, limit));
  try {
    check_plan_memory(plan(1), 2, limit);
    ADD_FAILURE() << "two whole copies were not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in memory"), std::string::npos) << e.what();
  }
  // Refused at TP 2 too when the limit is below its figure, the message names the mesh and rank 0's share.
  try {
    check_plan_memory(plan(2), 2, HostMemoryLimit{tp_rank, "the test's limit"});
    ADD_FAILURE() << "not refused below the TP 2 figure";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("per rank of the mesh (world 2 = data-parallel 1 x tensor-parallel 2"), std::string::npos) << what;
    EXPECT_NE(what.find(fmt::format("{} on tensor-parallel rank 0", format_count(gpt2_rank0_parameters(shape, 2)))), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dstrain
