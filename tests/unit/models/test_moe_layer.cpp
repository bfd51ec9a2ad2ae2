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
