// The mixture-of-experts feed-forward's routing edge cases at the model level (LlamaModel with
// sparse layers): a router that scores every expert alike sends every token to the lowest-index
// experts (the stated tie rule), the others receive no token — their gradients are exactly zero and
// the model does not depend on their weights —, and the chosen ones get every token. Numbers against
// an independent implementation are in tests/integration/test_moe_vs_pytorch.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "models/llama/llama_config.h"
#include "models/llama/llama_model.h"
#include "models/moe_config.h"
#include "models/moe_stats.h"

namespace dstrain {
namespace {

constexpr std::int64_t B = 2, T = 8, E = 4;

LlamaConfig moe_config(std::int64_t top_k, bool renormalize) {
  LlamaConfig c = llama_config_from_spec("llama:L2-C32-H2-I24-V61-T8");
  c.model_type = "mixtral";
  c.moe.num_experts = E;
  c.moe.top_k = top_k;
  c.moe.expert_intermediate_size = 24;
  c.moe.norm_topk_prob = renormalize;
  return c;
}

void randomize(LlamaModel& m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (const auto& p : m.params()) {
    float* v = static_cast<float*>(p.value.data);
    for (std::int64_t i = 0; i < p.value.numel(); ++i) v[i] = p.spec.name.find("norm") != std::string::npos ? 1.0f + d(rng) : d(rng);
  }
}

// Every router weight 0: all logits 0, every expert scores alike.
void flat_routers(LlamaModel& m) {
  for (const auto& p : m.params())
    if (p.spec.name.ends_with("mlp.gate.weight")) std::memset(p.value.data, 0, p.value.nbytes());
}

// Sum of |x| over block e of a stacked (E, a, b) tensor.
double block_abs_sum(const Tensor& t, std::int64_t e) {
  const std::int64_t n = t.numel() / t.shape[0];
  const float* v = static_cast<const float*>(t.data) + e * n;
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += std::fabs(v[i]);
  return s;
}

struct Batch2 {
  std::vector<std::int32_t> tokens, targets;
  Tensor tt, tg;
  Batch2() : tokens(B * T), targets(B * T) {
    for (std::int64_t i = 0; i < B * T; ++i) {
      tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % 61);
      targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 11 + 5) % 61);
    }
    tt = Tensor(tokens.data(), DType::int32, Shape{B, T});
    tg = Tensor(targets.data(), DType::int32, Shape{B, T});
  }
};

const char* kExperts[] = {"experts.gate_proj.weight", "experts.up_proj.weight", "experts.down_proj.weight"};

TEST(MoeLayer, TiedScoresSendEveryTokenToTheLowestExpertsAndTheOthersGetNoGradient) {
  for (const std::int64_t k : {1, 2}) {
    SCOPED_TRACE("top_k " + std::to_string(k));
    LlamaModel m(moe_config(k, true), DType::fp32, B, T);
    randomize(m, 7);
    flat_routers(m);
    Batch2 b;
    m.zero_grad();
    const float loss = m.forward(b.tt, b.tg);
    ASSERT_TRUE(std::isfinite(loss));
    m.backward();
    for (int layer = 0; layer < 2; ++layer)
      for (const char* w : kExperts) {
        const std::string name = "model.layers." + std::to_string(layer) + ".mlp." + w;
        const Tensor g = m.grad(name);
        for (std::int64_t e = 0; e < E; ++e) {
          if (e < k) {
            EXPECT_GT(block_abs_sum(g, e), 0.0) << name << " expert " << e << " receives every token";
          } else {
            EXPECT_EQ(block_abs_sum(g, e), 0.0) << name << " expert " << e << " receives no token";
          }
        }
      }
    // The idle experts' weights do not enter the model: changing them changes nothing, bit for bit.
    for (const auto& p : m.params())
      if (p.spec.name.find("experts.") != std::string::npos) {
        const std::int64_t n = p.value.numel() / E;
        float* v = static_cast<float*>(p.value.data);
        for (std::int64_t i = k * n; i < E * n; ++i) v[i] += 1.0f;
      }
    EXPECT_EQ(m.forward(b.tt, b.tg), loss);
    // ... while changing a chosen expert does.
    for (const auto& p : m.params())
      if (p.spec.name.ends_with("experts.down_proj.weight")) static_cast<float*>(p.value.data)[0] += 1.0f;
    EXPECT_NE(m.forward(b.tt, b.tg), loss);
  }
}

TEST(MoeLayer, RenormalisedSingleChoiceLeavesTheRouterWithoutGradientButNotOtherwise) {
  // top-1 renormalised: the weight is s/s = 1 whatever the scores, so d(loss)/d(router) = 0 (as in
  // Hugging Face's Mixtral with k = 1); without renormalising the weight is the softmax score and
  // the router learns.
  for (const bool renorm : {true, false}) {
    LlamaModel m(moe_config(1, renorm), DType::fp32, B, T);
    randomize(m, 11);
    Batch2 b;
    m.zero_grad();
    m.forward(b.tt, b.tg);
    m.backward();
    const Tensor g = m.grad("model.layers.0.mlp.gate.weight");
    double s = 0.0;
    for (std::int64_t i = 0; i < g.numel(); ++i) s += std::fabs(static_cast<const float*>(g.data)[i]);
    if (renorm) {
      EXPECT_LT(s, 1e-6) << "renormalised top-1";
    } else {
      EXPECT_GT(s, 1e-3) << "softmax-weighted top-1";
    }
  }
}

TEST(MoeLayer, TheAuxLossEntersTheLossOnlyWhenTheConfigAsksForIt) {
  LlamaConfig c = moe_config(2, true);
  LlamaModel plain(c, DType::fp32, B, T);
  randomize(plain, 5);
  c.moe.router_aux_loss_coef = 0.5;
  c.moe.output_router_logits = true;
  LlamaModel with_aux(c, DType::fp32, B, T);
  for (std::size_t i = 0; i < plain.params().size(); ++i)
    std::memcpy(with_aux.params()[i].value.data, plain.params()[i].value.data, plain.params()[i].value.nbytes());
  Batch2 b;
  const float l0 = plain.forward(b.tt, b.tg);
  const float l1 = with_aux.forward(b.tt, b.tg);
  const double aux = with_aux.last_aux_loss();
  EXPECT_DOUBLE_EQ(plain.last_aux_loss(), aux);  // computed either way, for the report
  // aux >= 1 for a top-k router (E · Σ f·P with Σ f = k... at least k/E·E·min P: here > 0 surely)
  EXPECT_GT(aux, 0.0);
  EXPECT_NEAR(l1, l0 + 0.5 * aux, 1e-5 * std::fabs(l1));
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

TEST(MoeConfigCount, SparseLayersCountedMatchesEnumeration) {
  // sparse_layers counts arithmetically (a descriptor may ask for billions of layers); against
  // is_sparse_layer enumerated over small models.
  for (std::int64_t step = 1; step <= 3; ++step)
    for (std::int64_t first = 0; first <= 3; ++first)
      for (const std::vector<std::int64_t>& only : {std::vector<std::int64_t>{}, {1}, {0, 2, 2, 5, 9}}) {
        MoeConfig m;
        m.num_experts = 4;
        m.decoder_sparse_step = step;
        m.first_k_dense = first;
        m.mlp_only_layers = only;
        for (std::int64_t n = 0; n <= 9; ++n) {
          std::int64_t want = 0;
          for (std::int64_t i = 0; i < n; ++i) want += m.is_sparse_layer(i) ? 1 : 0;
          EXPECT_EQ(m.sparse_layers(n), want) << "step " << step << " first " << first << " n " << n;
        }
      }
  MoeConfig big;
  big.num_experts = 8;
  EXPECT_EQ(big.sparse_layers(std::int64_t{1} << 40), std::int64_t{1} << 40);  // at once, not enumerated
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

// MoeStats's per-expert report against counts summed by hand: two sparse layers (1 and 3, a dense
// one between them records nothing) of E = 4 experts, N = 4 tokens of top-2 each.
void record(MoeStats& s, std::int64_t layer, std::vector<double> assigned, std::vector<double> prob, std::vector<std::int32_t> kept, std::int64_t dropped) {
  s.record(layer, assigned, prob, kept, dropped, 4, 0.0);
}

TEST(MoeStats, TheReportSumsEachLayersKeptTokensOverTheMicroBatchesAndStartsAgain) {
  MoeStats s;
  s.begin();
  record(s, 1, {3, 1, 0, 4}, {1.5, 0.5, 0.5, 1.5}, {3, 1, 0, 4}, 2);
  record(s, 3, {2, 2, 2, 2}, {1, 1, 1, 1}, {2, 2, 2, 2}, 0);
  s.begin();
  record(s, 1, {2, 1, 1, 4}, {1.0, 0.5, 0.5, 2.0}, {1, 0, 0, 3}, 1);
  record(s, 3, {1, 3, 2, 2}, {0.5, 1.5, 1.0, 1.0}, {0, 4, 1, 3}, 0);
  s.report_aux(s.aux_loss());  // the engine's part, once a training micro-batch's aux is known
  // An evaluation micro-batch: its statistics make an aux loss, but its tokens do not count.
  s.begin(false);
  record(s, 1, {8, 0, 0, 0}, {4, 0, 0, 0}, {8, 0, 0, 0}, 5);
  record(s, 3, {8, 0, 0, 0}, {4, 0, 0, 0}, {8, 0, 0, 0}, 5);
  // Kept per (layer, expert): layer 1 {3+1, 1+0, 0+0, 4+3} = {4, 1, 0, 7}, layer 3 {2, 6, 3, 5}:
  // min 0, max 7, mean 28 / 8 = 3.5, one idle pair, 2 + 1 dropped.
  MoeStats::Report r = s.take_report();
  EXPECT_EQ(r.layers, 2);
  EXPECT_EQ(r.experts, 4);
  EXPECT_EQ(r.min, 0.0);
  EXPECT_EQ(r.max, 7.0);
  EXPECT_EQ(r.mean, 3.5);
  EXPECT_EQ(r.imbalance(), 2.0);
  EXPECT_EQ(r.idle, 1);
  EXPECT_EQ(r.dropped, 3);
  // The last training micro-batch's aux: A = {3, 4, 3, 6}, P = {1.5, 2, 1.5, 3} over L·N = 8 rows,
  // E · Σ (A/8)(P/8) = 4 · (4.5 + 8 + 4.5 + 18) / 64 = 2.1875 (not the evaluation's).
  EXPECT_DOUBLE_EQ(r.last_aux, 2.1875);
  // Taken: the next report starts from nothing.
  r = s.take_report();
  EXPECT_EQ(r.layers, 0);
  EXPECT_EQ(r.max, 0.0);
  EXPECT_EQ(r.mean, 0.0);
  EXPECT_EQ(r.dropped, 0);
  s.begin();
  record(s, 1, {2, 2, 2, 2}, {1, 1, 1, 1}, {1, 1, 1, 1}, 4);
  record(s, 3, {2, 2, 2, 2}, {1, 1, 1, 1}, {2, 0, 0, 2}, 4);
  s.report_aux(s.aux_loss());
  r = s.take_report();
  EXPECT_EQ(r.layers, 2);
  EXPECT_EQ(r.min, 0.0);
  EXPECT_EQ(r.max, 2.0);
  EXPECT_EQ(r.mean, 1.0);
  EXPECT_EQ(r.idle, 2);
  EXPECT_EQ(r.dropped, 8);
  EXPECT_DOUBLE_EQ(r.last_aux, 2.0);  // perfectly even: E · Σ (4/8)(2/8) = 2 = top_k
}

// take_report(sum_over_ranks): the vector handed to the sum, and the report from its sums — here a
// "group" of three ranks with the same counts (the sum triples every count and the rank count).
TEST(MoeStats, TheReportSummedOverRanksCountsEveryRanksTokens) {
  MoeStats s;
  s.begin();
  record(s, 1, {3, 1, 0, 4}, {1.5, 0.5, 0.5, 1.5}, {3, 1, 0, 4}, 2);
  record(s, 3, {2, 2, 2, 2}, {1, 1, 1, 1}, {2, 2, 2, 2}, 0);
  const double aux = s.aux_loss();
  s.report_aux(aux);
  std::vector<double> handed;
  const MoeStats::Report r = s.take_report([&](std::span<double> v) {
    handed.assign(v.begin(), v.end());
    for (double& x : v) x *= 3;
  });
  EXPECT_EQ(handed, (std::vector<double>{1, aux, 2, 3, 1, 0, 4, 2, 2, 2, 2}));
  EXPECT_EQ(r.min, 0.0);
  EXPECT_EQ(r.max, 12.0);
  EXPECT_EQ(r.mean, 3.0 * 16 / 8);
  EXPECT_EQ(r.dropped, 6);
  EXPECT_DOUBLE_EQ(r.last_aux, aux);  // the ranks' mean
}

}  // namespace
}  // namespace dstrain
