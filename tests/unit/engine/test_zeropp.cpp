// ZeRO++ (qwZ, hpZ, qgZ) and MiCS on local ranks modelled as two nodes (Communicator::set_nodes):
// the bytes of each collective kind per step, and the bytes that cross the node boundary, against
// the formulas of docs/zero.md §10, computed here from the model's layout; and the training each
// one gives against plain ZeRO-3 on the same global batch.
//
// Setting: GPT-2 L2-C32 (zero_test_util.h), stage 3 with every layer partitioned
// (persistence threshold 0) and released after each call (reuse distance 0), one chunk per layer,
// bf16 (s = 2 bytes), GAS 1. W ranks on N nodes of L. Per step, with n = a layer's padded elements
// / W (a rank's piece), ring convention (zero/communicator.h), the node-crossing bytes those a
// rank addresses to ranks on other nodes:
//   plain   all_gather  (W−1)·n·s per gather            crossing (W−L)·n·s
//           reduce_scatter (W−1)·n·s per layer          crossing (W−L)·n·s
//   qwZ     all_gather  (W−1)·q8(n) per gather           crossing (W−L)·q8(n)     q8(n) = int8 piece bytes + scales
//   hpZ     a pass's first gather of a layer as plain; every later one within h = L ranks:
//           (h−1)·(W·n/h)·s, crossing 0
//   qgZ     all_to_all  (L−1)·q4(N·n) + (N−1)·q4(n) per layer, crossing (N−1)·q4(n); no reduce_scatter
//   MiCS s  gathers and reduce-scatters over the s ranks of a shard group (n = padded/s); at the
//           boundary one all_reduce of the gradient partition over the R = W/s replicas:
//           2·(R−1)·B/R (B: the partition's bytes)
//   MiCS hierarchical (s = W): all_gather (N−1)·n·s across + (L−1)·N·n·s within, crossing (N−1)·n·s
// plus the step's all_reduce of 3 fp64 values over the W ranks: 2·(W−1)·24/W, crossing 2·(W−L)·24/W.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "models/gpt2/gpt2_family.h"
#include "ops/kernels/quantize.h"
#include "train/memory_estimate.h"
#include "zero/zeropp_collectives.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

constexpr std::size_t kS = 2;  // bf16

struct Expected {
  std::uint64_t all_gather = 0, reduce_scatter = 0, all_to_all = 0, all_reduce = 0;
  std::uint64_t cross_all_gather = 0, cross_reduce_scatter = 0, cross_all_to_all = 0, cross_all_reduce = 0;
};

struct Features {
  bool qwz = false, hpz = false, qgz = false;
  int mics = 0;  // shard size; 0: off
  bool hierarchical = false;
};

std::string zero_keys(const Features& f, int h) {
  std::string k;
  const auto add = [&](const std::string& s) { k += (k.empty() ? "" : ", ") + s; };
  if (f.qwz) add(R"("zero_quantized_weights": true)");
  if (f.hpz) add(fmt::format(R"("zero_hpz_partition_size": {})", h));
  if (f.qgz) add(R"("zero_quantized_gradients": true)");
  if (f.mics > 0) add(fmt::format(R"("mics_shard_size": {})", f.mics));
  if (f.hierarchical) add(R"("mics_hierarchical_params_gather": true)");
  return k;
}

RunSpec zeropp_spec(const Features& f, int w, int per_node, Precision prec = Precision::bf16, int steps = 2) {
  RunSpec spec;
  spec.stage = 3;
  spec.world = w;
  spec.gas = 1;
  spec.precision = prec;
  spec.steps = steps;
  spec.ranks_per_node = per_node;
  spec.knobs.persistence_threshold = 0;
  spec.knobs.max_reuse_distance = 0;
  spec.knobs.zero_extra_json = zero_keys(f, per_node);
  return spec;
}

std::uint64_t u(std::int64_t x) { return static_cast<std::uint64_t>(x); }
std::uint64_t q8(std::int64_t n) { return u(quantized_piece_bytes(n, 8, deepspeed_weight_quant_block(n))); }
std::uint64_t q4(std::int64_t n) { return u(quantized_piece_bytes(n, 4, kGradientQuantBlock)); }

Expected expected(const Features& f, int W, int L) {
  const int N = W / L;
  Expected e;
  e.all_reduce = 2 * u(W - 1) * 24 / u(W);
  e.cross_all_reduce = 2 * u(W - L) * 24 / u(W);
  const int P = f.mics > 0 ? f.mics : W;  // the ranks a layer partitions over
  const auto specs = model_specs();
  // Gathers.
  for (const Stage3Gather& g : stage3_gathers(P, kS)) {
    const std::int64_t n = g.elements / P;
    if (f.hpz && g.again) {
      e.all_gather += u(L - 1) * u(g.elements / L) * kS;
    } else if (f.qwz) {
      e.all_gather += u(P - 1) * q8(n);
      e.cross_all_gather += u(P - L) * q8(n);
    } else if (f.hierarchical) {
      e.all_gather += u(N - 1) * u(n) * kS + u(L - 1) * u(N) * u(n) * kS;
      e.cross_all_gather += u(N - 1) * u(n) * kS;
    } else {
      e.all_gather += u(P - 1) * u(n) * kS;
      if (P > L) e.cross_all_gather += u(P - L) * u(n) * kS;
    }
  }
  // Gradient reduction, one chunk per layer; MiCS's replica all-reduce of the partition.
  std::int64_t partition = 0;
  for (const auto& l : specs) {
    const std::int64_t padded = padded_numel(l, P, kS);
    if (padded == 0) continue;
    const std::int64_t n = padded / P;
    partition += n;
    if (f.qgz) {
      e.all_to_all += u(L - 1) * q4(N * n) + u(N - 1) * q4(n);
      e.cross_all_to_all += u(N - 1) * q4(n);
    } else {
      e.reduce_scatter += u(P - 1) * u(n) * kS;
      if (P > L) e.cross_reduce_scatter += u(P - L) * u(n) * kS;
    }
  }
  if (f.mics > 0 && f.mics < W) {
    const int R = W / f.mics;
    const std::uint64_t B = u(partition) * kS;
    e.all_reduce += 2 * u(R - 1) * B / u(R);
    // The replicas of a shard group that fills a node are on the other nodes.
    e.cross_all_reduce += 2 * u(R - 1) * B / u(R);
  }
  return e;
}

void expect_bytes(const Features& f, int W, int L) {
  const RunResult run = run_zero(zeropp_spec(f, W, L));
  const Expected e = expected(f, W, L);
  for (const RankResult& r : run.ranks) {
    const CommStats& c = r.report.step_comm;
    SCOPED_TRACE(testing::Message() << "rank " << r.report.rank);
    EXPECT_EQ(c.bytes_sent(CollectiveKind::all_gather), e.all_gather);
    EXPECT_EQ(c.bytes_sent(CollectiveKind::reduce_scatter), e.reduce_scatter);
    EXPECT_EQ(c.bytes_sent(CollectiveKind::all_to_all), e.all_to_all);
    EXPECT_EQ(c.bytes_sent(CollectiveKind::all_reduce), e.all_reduce);
    EXPECT_EQ(c.cross_node_bytes_sent(CollectiveKind::all_gather), e.cross_all_gather);
    EXPECT_EQ(c.cross_node_bytes_sent(CollectiveKind::reduce_scatter), e.cross_reduce_scatter);
    EXPECT_EQ(c.cross_node_bytes_sent(CollectiveKind::all_to_all), e.cross_all_to_all);
    EXPECT_EQ(c.cross_node_bytes_sent(CollectiveKind::all_reduce), e.cross_all_reduce);
  }
}

struct ByteCase {
  const char* name;
  Features f;
  int world, per_node;
};

void PrintTo(const ByteCase& c, std::ostream* os) { *os << c.name; }

class ZeroPlusPlusBytes : public ::testing::TestWithParam<ByteCase> {};

TEST_P(ZeroPlusPlusBytes, MatchTheFormulas) { expect_bytes(GetParam().f, GetParam().world, GetParam().per_node); }

INSTANTIATE_TEST_SUITE_P(TwoNodes, ZeroPlusPlusBytes,
                         ::testing::Values(ByteCase{"Plain_W4", {}, 4, 2}, ByteCase{"Qwz_W4", {.qwz = true}, 4, 2},
                                           ByteCase{"Hpz_W4", {.hpz = true}, 4, 2}, ByteCase{"Qgz_W4", {.qgz = true}, 4, 2},
                                           ByteCase{"All_W4", {.qwz = true, .hpz = true, .qgz = true}, 4, 2}, ByteCase{"Mics_W4", {.mics = 2}, 4, 2},
                                           ByteCase{"MicsHierarchical_W4", {.mics = 4, .hierarchical = true}, 4, 2}, ByteCase{"Plain_W8", {}, 8, 4},
                                           ByteCase{"Qwz_W8", {.qwz = true}, 8, 4}, ByteCase{"Hpz_W8", {.hpz = true}, 8, 4},
                                           ByteCase{"Qgz_W8", {.qgz = true}, 8, 4}, ByteCase{"All_W8", {.qwz = true, .hpz = true, .qgz = true}, 8, 4},
                                           ByteCase{"Mics_W8", {.mics = 4}, 8, 4},
                                           ByteCase{"MicsHierarchical_W8", {.mics = 8, .hierarchical = true}, 8, 4}),
                         [](const auto& p) { return std::string(p.param.name); });

// The paper's claims, from the same formulas: against plain ZeRO-3 on 8 ranks as 2 nodes, qwZ
// halves the forward gather of bf16 weights (plus its scales), hpZ takes the later gathers off the
// nodes' link, qgZ sends about 1/4 of the gradients' bf16 bytes.
TEST(ZeroPlusPlusBytes, PaperRatios) {
  const Expected plain = expected({}, 8, 4), qwz = expected({.qwz = true}, 8, 4), hpz = expected({.hpz = true}, 8, 4),
                 qgz = expected({.qgz = true}, 8, 4);
  const double gather = static_cast<double>(qwz.all_gather) / static_cast<double>(plain.all_gather);
  EXPECT_GT(gather, 0.5);
  EXPECT_LT(gather, 0.6);
  EXPECT_LT(hpz.cross_all_gather, plain.cross_all_gather * 0.6);
  const double grads = static_cast<double>(qgz.all_to_all) / static_cast<double>(plain.reduce_scatter);
  EXPECT_GT(grads, 0.25);
  EXPECT_LT(grads, 0.3);
}

// ---- training against plain ZeRO-3 ----

std::map<std::string, std::vector<float>> initial_params() {
  RunSpec s = zeropp_spec({}, 1, 0, Precision::fp32, 0);
  return run_zero(s).r0().params;
}

// hpZ gathers the same bits from the secondary shards: bit for bit plain ZeRO-3.
TEST(ZeroPlusPlusTraining, HpzIsExact) {
  const RunResult plain = run_zero(zeropp_spec({}, 4, 2, Precision::bf16, 3));
  const RunResult hpz = run_zero(zeropp_spec({.hpz = true}, 4, 2, Precision::bf16, 3));
  EXPECT_EQ(hpz.r0().losses, plain.r0().losses);
  EXPECT_EQ(hpz.r0().params, plain.r0().params);
  EXPECT_GT(hpz.r0().report.secondary_param_bytes, 0u);
}

// zero_hpz_partition_size larger than the group (DeepSpeed's tutorial sets 16): min(h, W) ranks, as
// DeepSpeed's _create_zero_param_parallel_group takes them — here the whole group of 4, so each
// rank keeps a quarter of the gathered weights.
TEST(ZeroPlusPlusTraining, HpzLargerThanTheGroupIsTheGroup) {
  RunSpec s = zeropp_spec({.hpz = true}, 4, 2, Precision::bf16, 2);
  s.knobs.zero_extra_json = R"("zero_hpz_partition_size": 16)";
  const RunResult hpz = run_zero(s);
  const RunResult plain = run_zero(zeropp_spec({}, 4, 2, Precision::bf16, 2));
  EXPECT_EQ(hpz.r0().losses, plain.r0().losses);
  std::int64_t partitioned = 0;
  for (const auto& l : model_specs()) partitioned += padded_numel(l, 4, kS);
  EXPECT_EQ(hpz.r0().report.secondary_param_bytes, u(partitioned) * kS / 4);
}

// The pre-flight estimate (train/memory_estimate.h): hpZ adds Ψ·b/h of secondary weights on the
// device; MiCS partitions over its shard group, so the params, grads and states are ZeRO-3's over s
// ranks. The bytes per padded element the estimate gives for the secondary shard are the engine's.
TEST(ZeroPlusPlusMemory, EstimateCountsTheSecondaryShardAndTheShardGroup) {
  const auto estimate = [](const Features& f) {
    config::ConfigOptions o;
    o.world_size = 4;
    const RunSpec s = zeropp_spec(f, 4, 2);
    return estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(s)), o), kT);
  };
  const MemoryEstimate plain = estimate({}), hpz = estimate({.hpz = true}), mics = estimate({.mics = 2});
  const double psi_b = plain.parameters * 2.0;  // bf16
  EXPECT_DOUBLE_EQ(hpz.secondary_params, psi_b / 2.0);
  EXPECT_DOUBLE_EQ(hpz.params_device - plain.params_device, psi_b / 2.0);
  EXPECT_DOUBLE_EQ(mics.zero_ranks, 2.0);
  EXPECT_DOUBLE_EQ(mics.params, psi_b / 2.0);
  EXPECT_DOUBLE_EQ(mics.optimizer, 2.0 * plain.optimizer);
  // Against the engine: the secondary shard holds 1/h of the padded partitioned elements.
  const RunResult run = run_zero(zeropp_spec({.hpz = true}, 4, 2));
  EXPECT_DOUBLE_EQ(hpz.secondary_params / plain.parameters * static_cast<double>(run.r0().report.padded_param_elements),
                   static_cast<double>(run.r0().report.secondary_param_bytes));
}

// MiCS: every rank's parameters equal plain ZeRO-3's on the same global batch within the
// reduction-order tolerance of fp32 (each shard group's replicas average the same gradients).
// With gradient accumulation the replicas average once, at the boundary, over the partition's
// accumulated gradients.
TEST(ZeroPlusPlusTraining, MicsMatchesZero3) {
  for (const int gas : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "GAS " << gas);
    const auto spec = [gas](const Features& f) {
      RunSpec s = zeropp_spec(f, 4, 2, Precision::fp32, 3);
      s.gas = gas;
      return s;
    };
    const RunResult plain = run_zero(spec({}));
    const RunResult mics = run_zero(spec({.mics = 2}));
    const RunResult hier = run_zero(spec({.mics = 4, .hierarchical = true}));
    const Tolerance tol = tolerance(Precision::fp32);
    const auto init = initial_params();
    for (const RunResult* r : {&mics, &hier}) {
      for (const RankResult& rank : r->ranks) {
        const ParamDiff d = compare_params(rank.params, plain.r0().params, init, tol.atol, tol.rtol);
        EXPECT_LE(d.max_excess, 1.0) << d.worst_element;
        for (std::size_t i = 0; i < rank.losses.size(); ++i)
          EXPECT_NEAR(rank.losses[i], plain.r0().losses[i], tol.loss_rtol * std::abs(plain.r0().losses[i]));
      }
    }
  }
}

// qwZ and qgZ change the numbers by their quantization error, no more. The first step's loss is
// computed with the int8 weights: off plain's by at most the first-order effect of moving every
// weight by half its block's step, Σ|g_i|·max_i δ_i <= √P·‖g‖₂·(max|w|/255 + 1 ulp), and not
// equal to it (the feature is on). qgZ leaves the first loss alone (the weights are exact) and
// moves the parameters after it. Both stay within the sanity bound of two 3-step Adam
// trajectories (each parameter moves at most ~lr = 1e-2 per step, so two runs differ by < 2·3·lr),
// the bound test_zero_equivalence uses for bf16, and differ from plain (the feature is on).
TEST(ZeroPlusPlusTraining, QuantizedWithinTheirError) {
  const RunResult plain = run_zero(zeropp_spec({}, 4, 2, Precision::bf16, 3));
  const RunResult qwz = run_zero(zeropp_spec({.qwz = true}, 4, 2, Precision::bf16, 3));
  const RunResult qgz = run_zero(zeropp_spec({.qgz = true}, 4, 2, Precision::bf16, 3));
  const auto init = initial_params();
  double wmax = 0;
  std::int64_t P = 0;
  for (const auto& [name, v] : init) {
    P += static_cast<std::int64_t>(v.size());
    for (const float x : v) wmax = std::max(wmax, static_cast<double>(std::abs(x)));
  }
  const double bound = std::sqrt(static_cast<double>(P)) * plain.r0().grad_norms[0] * (wmax / 255.0 + wmax * 0x1p-8);
  const double d0 = std::abs(static_cast<double>(qwz.r0().losses[0]) - plain.r0().losses[0]);
  EXPECT_GT(d0, 0.0);
  EXPECT_LE(d0, bound);
  EXPECT_EQ(qgz.r0().losses[0], plain.r0().losses[0]);
  for (const RunResult* r : {&qwz, &qgz}) {
    const ParamDiff d = compare_params(r->r0().params, plain.r0().params, init, 2 * 3 * 1e-2, 0.0);
    EXPECT_LE(d.max_excess, 1.0) << d.worst_element;
    EXPECT_GT(d.max_abs, 0.0);  // the quantization changed something
    EXPECT_TRUE(d.finite);
  }
}

// Offload composes (DeepSpeed runs ZeRO++ with offload_param / offload_optimizer; only MiCS's
// replicas refuse it): the partition fetched from host memory is what the gathers send, so the
// run is bit for bit the one without offload, as offload is on the CPU.
TEST(ZeroPlusPlusTraining, OffloadIsBitForBit) {
  const Features all{.qwz = true, .hpz = true, .qgz = true};
  const RunResult plain = run_zero(zeropp_spec(all, 4, 2, Precision::bf16, 2));
  RunSpec off = zeropp_spec(all, 4, 2, Precision::bf16, 2);
  off.knobs.zero_extra_json += R"(, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"})";
  const RunResult offloaded = run_zero(off);
  EXPECT_EQ(offloaded.r0().losses, plain.r0().losses);
  EXPECT_EQ(offloaded.r0().params, plain.r0().params);
  EXPECT_GT(offloaded.r0().report.host_optimizer_bytes, 0u);
}

// An fp16 overflow on one rank still skips the step on every rank through qgZ's int4 blocks (a
// block holding an inf dequantizes to NaN).
TEST(ZeroPlusPlusTraining, QgzKeepsOverflowDetection) {
  RunSpec s = zeropp_spec({.qgz = true}, 4, 2, Precision::fp16, 3);
  s.inject_overflow = {{}, {2}, {}, {}};
  const RunResult run = run_zero(s);
  for (const RankResult& r : run.ranks) {
    EXPECT_EQ(r.skipped_steps, 1);
    for (const float l : r.losses) EXPECT_TRUE(std::isfinite(l));
  }
}

// Refused before step 1, naming the key: sizes that do not divide the ranks, a hierarchical gather
// on one node, a hierarchy whose nodes hold different numbers of ranks.
TEST(ZeroPlusPlusErrors, BeforeStepOne) {
  const auto error = [](const RunSpec& s) {
    try {
      run_zero(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(zeropp_spec({.mics = 3}, 4, 2)).find("mics_shard_size 3"), std::string::npos);
  RunSpec hpz = zeropp_spec({.hpz = true}, 4, 2);
  hpz.knobs.zero_extra_json = R"("zero_hpz_partition_size": 3)";
  EXPECT_NE(error(hpz).find("zero_hpz_partition_size 3"), std::string::npos);
  EXPECT_NE(error(zeropp_spec({.mics = 4, .hierarchical = true}, 4, 4)).find("mics_hierarchical_params_gather"), std::string::npos);
  RunSpec uneven = zeropp_spec({.qgz = true}, 4, 3);  // nodes of 3 and 1 ranks
  EXPECT_NE(error(uneven).find("zero_quantized_gradients"), std::string::npos);
}

}  // namespace
}  // namespace dstrain
