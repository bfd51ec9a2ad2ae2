// What each ZeRO stage holds per rank, measured by the allocator (report().zero), against the table
// of zero/model_states.h with Ψ computed here from the model's ParamSpecs and the layout rules of
// zero/flat_layout.h (each parameter 64-byte aligned, each layer padded to a multiple of
// W · 64 bytes when its states split over W ranks, stage 0 over 1):
//
//   stage  params (s)   grads (s)   fp32 master (mixed only) + Adam m, v
//   0      Ψ            Ψ           Ψ
//   1      Ψ            Ψ           Ψ/W
//   2      Ψ            Ψ/W         Ψ/W
//   3      Ψ/W          Ψ/W         Ψ/W          (stage3_param_persistence_threshold 0)
//
// and stage 3's cap on gathered parameters (stage3_max_live_parameters), measured both by the
// coordinator's counter and by the allocator's peak of parameter memory.
#include <algorithm>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "ops/error.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

constexpr int kW = 4;

struct Expected {
  std::int64_t psi = 0;  // padded elements, all layers
  std::uint64_t params = 0, grads = 0, optimizer = 0;
};

// `optimizer_states`: the per-element fp32 buffers the optimizer declares (Adam's m and v: 2).
Expected expected(int stage, Precision p, std::int64_t persistence_threshold = 0, std::uint64_t optimizer_states = 2) {
  const auto specs = model_specs();
  const std::size_t s = storage_bytes(p);
  const int pw = stage >= 1 ? kW : 1;
  Expected e;
  std::int64_t params_elems = 0;
  for (const auto& layer : specs) {
    const std::int64_t n = padded_numel(layer, pw, s);
    e.psi += n;
    const bool persistent = owned_params(layer) < persistence_threshold;
    params_elems += stage == 3 && !persistent ? n / kW : n;
  }
  const std::uint64_t psi = static_cast<std::uint64_t>(e.psi);
  e.params = static_cast<std::uint64_t>(params_elems) * s;
  e.grads = (stage >= 2 ? psi / kW : psi) * s;
  const std::uint64_t fp32_copies = optimizer_states + (p == Precision::fp32 ? 0 : 1);  // the states (+ master)
  e.optimizer = fp32_copies * 4 * (stage >= 1 ? psi / kW : psi);
  return e;
}

RunSpec memory_run(int stage, Precision p) {
  RunSpec s;
  s.stage = stage;
  s.world = kW;
  s.gas = 2;
  s.precision = p;
  s.steps = 2;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.persistence_threshold = 0;
  return s;
}

class ZeroMemory : public ::testing::TestWithParam<std::tuple<int, Precision>> {};

TEST_P(ZeroMemory, StatesMatchTheTable) {
  const auto [stage, prec] = GetParam();
  const RunResult run = run_zero(memory_run(stage, prec));
  const Expected e = expected(stage, prec);
  for (int r = 0; r < kW; ++r) {
    const ZeroReport& z = run.ranks[static_cast<std::size_t>(r)].report;
    SCOPED_TRACE(testing::Message() << "rank " << r);
    EXPECT_EQ(z.stage, stage);
    EXPECT_EQ(z.rank, r);
    EXPECT_EQ(z.world_size, kW);
    EXPECT_EQ(z.padded_param_elements, e.psi);
    EXPECT_EQ(z.param_bytes, e.params);
    EXPECT_EQ(z.grad_bytes, e.grads);
    EXPECT_EQ(z.optimizer_bytes, e.optimizer);
    if (stage < 3) {
      EXPECT_EQ(z.peak_gathered_param_elements, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(W4, ZeroMemory, ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(Precision::fp32, Precision::bf16)),
                         [](const auto& pinfo) {
                           return fmt::format("Stage{}_{}", std::get<0>(pinfo.param), precision_name(std::get<1>(pinfo.param)));
                         });

// The optimizer partition holds exactly the states the optimizer declares (docs/training_state.md
// §1): SGD without momentum none (fp32: no optimizer bytes at all; bf16: only the masters), SGD
// with momentum one buffer, where Adam holds two.
TEST(ZeroMemoryOptimizerStates, SgdHoldsOnlyWhatItDeclares) {
  for (const auto& [json, states] : {std::pair<const char*, std::uint64_t>{R"({"type": "SGD", "params": {"lr": 0.1}})", 0},
                                     std::pair<const char*, std::uint64_t>{R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})", 1}}) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      for (const int stage : {0, 2}) {
        SCOPED_TRACE(testing::Message() << json << " " << precision_name(p) << " stage " << stage);
        RunSpec s = memory_run(stage, p);
        s.knobs.optimizer_json = json;
        s.knobs.allow_untested_optimizer = true;
        const RunResult run = run_zero(s);
        const Expected e = expected(stage, p, 0, states);
        for (const RankResult& r : run.ranks) EXPECT_EQ(r.report.optimizer_bytes, e.optimizer);
        if (states == 0 && p == Precision::fp32) {
          EXPECT_EQ(e.optimizer, 0u);
        }
      }
    }
  }
}

// Stage 3 on 4 ranks holds a quarter of each state of stage 0 (up to the padding to 4 · 64 bytes
// per layer: under 2% here).
TEST(ZeroMemoryStage3, AboutAQuarterOfStageZero) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    const ZeroReport z0 = run_zero(memory_run(0, p)).r0().report;
    const ZeroReport z3 = run_zero(memory_run(3, p)).r0().report;
    for (const auto& [b0, b3, what] :
         {std::make_tuple(z0.param_bytes, z3.param_bytes, "params"), std::make_tuple(z0.grad_bytes, z3.grad_bytes, "grads"),
          std::make_tuple(z0.optimizer_bytes, z3.optimizer_bytes, "optimizer")}) {
      const double ratio = static_cast<double>(b3) / static_cast<double>(b0);
      EXPECT_GE(ratio, 0.25) << what;
      EXPECT_LE(ratio, 0.25 * 1.02) << what << ": " << b3 << " of " << b0;
    }
  }
}

// Layers below the persistence threshold keep their whole parameters on every rank: the embedding
// (4608 elements) and the final norm (64) under a threshold of 5000; the blocks (12704) split.
TEST(ZeroMemoryStage3, PersistentLayersStayWhole) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    RunSpec s = memory_run(3, p);
    s.knobs.persistence_threshold = 5000;
    const RunResult run = run_zero(s);
    const Expected e = expected(3, p, 5000);
    const Expected all_split = expected(3, p, 0);
    EXPECT_GT(e.params, all_split.params);
    for (const RankResult& r : run.ranks) {
      EXPECT_EQ(r.report.param_bytes, e.params);
      EXPECT_EQ(r.report.grad_bytes, e.grads);
      EXPECT_EQ(r.report.optimizer_bytes, e.optimizer);
    }
  }
}

// The gathered-parameter elements of each layer's calls at W = 4 (fp32): what a stage-3 layer call
// needs at once.
struct Needs {
  std::int64_t largest_need = 0, all = 0;
};
Needs needs_fp32() {
  const auto specs = model_specs();
  const auto needs = layer_needs(specs);
  Needs n;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    std::int64_t t = 0;
    for (std::size_t o : needs[i]) t += padded_numel(specs[o], kW, 4);
    n.largest_need = std::max(n.largest_need, t);
    n.all += padded_numel(specs[i], kW, 4);
  }
  return n;
}

// stage3_max_live_parameters is a hard cap: with prefetch of everything and reuse distance 1e9
// (keep everything) the live set would grow to the whole model; with the cap it never exceeds it,
// by the coordinator's count and by the allocator's peak of parameter memory (shard + gathered).
TEST(ZeroMemoryStage3, MaxLiveParametersBoundsTheGatheredPeak) {
  const Needs n = needs_fp32();
  ASSERT_GT(n.all, n.largest_need);
  for (const std::int64_t max_live : {std::int64_t{1'000'000'000}, n.largest_need + 1000, n.largest_need}) {
    SCOPED_TRACE(testing::Message() << "max_live " << max_live);
    RunSpec s = memory_run(3, Precision::fp32);
    s.knobs.prefetch_bucket_size = 1'000'000'000;
    s.knobs.max_reuse_distance = 1'000'000'000;
    s.knobs.max_live = max_live;
    s.knobs.overlap_comm = true;
    const RunResult run = run_zero(s);
    for (const RankResult& r : run.ranks) {
      const std::int64_t peak = r.report.peak_gathered_param_elements;
      EXPECT_LE(peak, std::min(max_live, n.all));
      EXPECT_GE(peak, n.largest_need);
      if (max_live >= n.all) {
        EXPECT_EQ(peak, n.all);  // no cap: everything stays gathered
      }
      // Measured: the most parameter bytes ever held beyond the shards.
      const std::uint64_t held_peak = r.memory[MemoryPurpose::params].peak;
      ASSERT_GE(held_peak, r.report.param_bytes);
      EXPECT_LE(static_cast<std::int64_t>((held_peak - r.report.param_bytes) / 4), std::min(max_live, n.all));
    }
  }
}

TEST(ZeroMemoryStage3, TooSmallMaxLiveNamesTheKey) {
  const Needs n = needs_fp32();
  RunSpec s = memory_run(3, Precision::fp32);
  s.world = kW;
  s.knobs.max_live = n.largest_need - 1;
  try {
    run_zero(s);
    ADD_FAILURE() << "no error for stage3_max_live_parameters " << s.knobs.max_live << " < " << n.largest_need;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage3_max_live_parameters"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(n.largest_need)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dstrain
