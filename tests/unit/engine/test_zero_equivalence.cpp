// The correctness contract of ZeRO (docs/design.md): with the same global batch and seed, stages 0-3 on
// W ranks, with or without activation checkpointing, produce the same losses and parameters as
// stage 0 on ONE rank.
//
// The reference: stage 0, world 1, gradient_accumulation_steps = GAS·W, micro-batch 2, fed the
// global batch slot by slot. Rank r of a W-rank run at micro-step m takes global slot m·W + r (the
// data loader's order, data/data_loader.h), so the reference's micro-step m' takes slot m'.
// Both sides divide each micro-batch's loss by their GAS and the W-rank run averages over the
// ranks, so both compute d(mean loss over the GAS·W micro-batches); only the order of the sums
// (and, in 16-bit, where they are rounded) differs.
//
// The matrix: stage {0,1,2,3} × world {1,2,4} × {fp32, bf16, fp16} × GAS {1,4} × checkpointing
// {off,on}, 3 optimizer steps each, one test case per combination. The ZeRO knobs are small so
// that every mechanism runs: reduce_bucket_size 3000 cuts a block (12704 elements) into 5 chunks
// (and stage 0's all-reduce into buckets), stage3_prefetch_bucket_size 5000 prefetches part of the
// next block, and two variants alternate over the matrix:
//   A: stage3_param_persistence_threshold 5000 — the embedding (4608) and final norm persist, the
//      blocks are gathered per call; stage3_max_reuse_distance 0 (release after every use)
//   B: threshold 0 — every layer is gathered per call; reuse distance 1e9 (keep everything) under
//      stage3_max_live_parameters 30000 < the model's 30.4k, so the live cap evicts
// and overlap_comm is on in half of the cases.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

using Combo = std::tuple<int, int, Precision, int, bool>;  // stage, world, precision, GAS, checkpointing

ZeroKnobs knobs_for(const Combo& c) {
  const auto [stage, world, prec, gas, ckpt] = c;
  ZeroKnobs k;
  k.reduce_bucket_size = 3000;
  k.allgather_bucket_size = 5000;
  k.prefetch_bucket_size = 5000;
  const bool variant_a = ((gas == 4 ? 1 : 0) + static_cast<int>(prec)) % 2 == 0;
  k.persistence_threshold = variant_a ? 5000 : 0;
  k.max_reuse_distance = variant_a ? 0 : 1'000'000'000;
  k.max_live = variant_a ? 1'000'000'000 : 30'000;
  k.overlap_comm = ((gas == 4 ? 1 : 0) + (ckpt ? 1 : 0) + static_cast<int>(prec)) % 2 == 1;
  return k;
}

// One reference per (precision, GAS·W, checkpointing), shared by the cases that need it (within
// one process; ctest runs each case in its own). micro_steps 0: the initial parameters.
const RunResult& reference(Precision p, int micro_steps, bool ckpt, const char* model = kModel) {
  static std::mutex mu;
  static std::map<std::tuple<Precision, int, bool, std::string>, RunResult> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(p, micro_steps, ckpt, std::string(model));
  auto it = cache.find(key);
  if (it == cache.end()) {
    RunSpec s;
    s.stage = 0;
    s.world = 1;
    s.gas = std::max(micro_steps, 1);
    s.steps = micro_steps == 0 ? 0 : s.steps;
    s.precision = p;
    s.ckpt = ckpt;
    s.model = model;
    it = cache.emplace(key, run_zero(s)).first;
  }
  return it->second;
}

// The W-rank run of combination c against stage 0 on one rank, for `model`.
void check_equivalence(const Combo& c, const char* model) {
  const auto [stage, world, prec, gas, ckpt] = c;
  RunSpec s;
  s.model = model;
  s.stage = stage;
  s.world = world;
  s.gas = gas;
  s.precision = prec;
  s.ckpt = ckpt;
  s.knobs = knobs_for(c);
  const RunResult run = run_zero(s);
  const RunResult& ref = reference(prec, gas * world, ckpt, model);
  const Tolerance tol = tolerance(prec);

  // Every rank reports the same (all-reduced) losses and gathers the same parameters, bit for bit.
  for (int r = 1; r < world; ++r) {
    const RankResult& x = run.ranks[static_cast<std::size_t>(r)];
    EXPECT_EQ(x.losses, run.r0().losses) << "rank " << r;
    EXPECT_EQ(x.skipped_steps, run.r0().skipped_steps) << "rank " << r;
    ASSERT_EQ(x.params.size(), run.r0().params.size());
    for (const auto& [name, v] : run.r0().params) ASSERT_EQ(x.params.at(name), v) << "rank " << r << " " << name;
  }
  // Stage 3 under variant B's live cap: the cap held (the model's 30.1-30.3k elements would not fit).
  if (stage == 3) {
    for (const RankResult& x : run.ranks) {
      EXPECT_LE(x.report.peak_gathered_param_elements, s.knobs.max_live);
      EXPECT_GT(x.report.peak_gathered_param_elements, 0);
    }
  }
  // No step overflows (fp16's initial scale 2^8), here or in the reference.
  EXPECT_EQ(run.r0().skipped_steps, 0);
  EXPECT_EQ(ref.r0().skipped_steps, 0);

  ASSERT_EQ(run.r0().losses.size(), ref.r0().losses.size());
  double loss_rel = 0;
  for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) {
    const double a = run.r0().losses[k], b = ref.r0().losses[k];
    loss_rel = std::max(loss_rel, std::abs(a - b) / std::abs(b));
    EXPECT_LE(std::abs(a - b), tol.loss_rtol * std::abs(b)) << "step " << k + 1 << ": loss " << a << ", one rank " << b;
  }
  const RunResult& init = reference(prec, 0, false, model);
  const ParamDiff d = compare_params(run.r0().params, ref.r0().params, init.r0().params, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst parameter " << d.worst_element << ": max |diff| " << d.max_abs << " vs atol " << tol.atol << " + rtol "
                               << tol.rtol << "·|ref|";
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor << " (difference relative to its update)";
  EXPECT_LE(d.update_rel, tol.update_rel) << "all parameters (difference relative to the update)";
  EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs) << "attention key bias";
  ::testing::Test::RecordProperty("loss_rel_diff", std::to_string(loss_rel));
  ::testing::Test::RecordProperty("param_abs_diff", std::to_string(d.max_abs));
  ::testing::Test::RecordProperty("param_update_rel_diff", std::to_string(d.max_update_rel));
  if (std::getenv("DSTRAIN_ZERO_EQ_VERBOSE") != nullptr) {
    std::printf("MEASURE %s %d %d %d %d: loss_rel %.3g abs %.3g upd_rel %.3g keyb %.3g all_upd_rel %.3g worst %s / %s\n", precision_name(prec), stage,
                world, gas, ckpt ? 1 : 0, loss_rel, d.max_abs, d.max_update_rel, d.key_bias_max_abs, d.update_rel, d.worst_element.c_str(),
                d.worst_tensor.c_str());
  }
}

class ZeroEquivalence : public ::testing::TestWithParam<Combo> {};

TEST_P(ZeroEquivalence, MatchesStageZeroOnOneRank) { check_equivalence(GetParam(), kModel); }

// The same contract for the Llama family (kLlamaModel: GQA, RMSNorm, RoPE, SwiGLU, tied embeddings).
class LlamaZeroEquivalence : public ::testing::TestWithParam<Combo> {};

TEST_P(LlamaZeroEquivalence, MatchesStageZeroOnOneRank) { check_equivalence(GetParam(), kLlamaModel); }

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const auto [stage, world, prec, gas, ckpt] = info.param;
  return fmt::format("Stage{}_W{}_{}_GAS{}_{}", stage, world, precision_name(prec), gas, ckpt ? "ckpt" : "nockpt");
}

INSTANTIATE_TEST_SUITE_P(Matrix, ZeroEquivalence,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 4),
                                            ::testing::Values(Precision::fp32, Precision::bf16, Precision::fp16), ::testing::Values(1, 4),
                                            ::testing::Bool()),
                         combo_name);

// Every stage, 2 and 4 ranks, every precision, with and without checkpointing (GAS 2).
INSTANTIATE_TEST_SUITE_P(Matrix, LlamaZeroEquivalence,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 4),
                                            ::testing::Values(Precision::fp32, Precision::bf16, Precision::fp16), ::testing::Values(2),
                                            ::testing::Bool()),
                         combo_name);

// Dropout on: its masks are addressed by (seed, step, layer, micro-batch, element) (docs/design.md "Core
// types"), so that they are "the same ... for any world size": W ranks must draw for global slot
// m·W + r what one rank draws at its micro-step m·W + r, and the runs stay equal (fp32: the same
// reduction-order tolerance as above).
TEST(ZeroEquivalenceDropout, SameMasksForAnyWorldSize) {
  for (const int stage : {0, 3}) {
    RunSpec s;
    s.stage = stage;
    s.world = 2;
    s.gas = 2;
    s.dropout = 0.1f;
    RunSpec r = s;
    r.stage = 0;
    r.world = 1;
    r.gas = 4;
    const RunResult run = run_zero(s), ref = run_zero(r);
    double dmax = 0;
    for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) dmax = std::max(dmax, std::abs(double(run.r0().losses[k]) - ref.r0().losses[k]));
    EXPECT_LE(dmax, 1e-5) << "stage " << stage << ": with dropout on, 2 ranks x GAS 2 differ from 1 rank x GAS 4 by " << dmax
                          << " in the loss (dropout masks keyed by the rank's local micro-step instead of the global slot?)";
  }
}

}  // namespace
}  // namespace dstrain
