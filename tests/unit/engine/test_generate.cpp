// Generation: the sampler against softmax probabilities computed here, the Generator's logits and
// greedy tokens against an independent forward path (Gpt2Model at exactly the context length,
// logits recovered from its cross-entropy losses), and a hand-set GPT-2 whose next-token
// distribution is known in closed form.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "data/byte_tokenizer.h"
#include "engine/generate.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_model.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

// softmax(logits / temperature) restricted to the k largest (k = 0: all), written from the
// definition.
std::vector<double> expected_probs(const std::vector<float>& logits, double temperature, std::size_t k) {
  std::vector<std::size_t> idx(logits.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  if (k == 0 || k > logits.size()) k = logits.size();
  std::vector<double> p(logits.size(), 0.0);
  double z = 0.0;
  for (std::size_t j = 0; j < k; ++j) z += std::exp(logits[idx[j]] / temperature);
  for (std::size_t j = 0; j < k; ++j) p[idx[j]] = std::exp(logits[idx[j]] / temperature) / z;
  return p;
}

// Empirical frequencies of `draws` within 5 sigma of p; ids with p = 0 never drawn.
void expect_frequencies(const std::vector<std::int64_t>& counts, const std::vector<double>& p, std::int64_t draws) {
  for (std::size_t v = 0; v < p.size(); ++v) {
    const double f = static_cast<double>(counts[v]) / static_cast<double>(draws);
    if (p[v] == 0.0) {
      EXPECT_EQ(counts[v], 0) << "id " << v << " has probability 0";
      continue;
    }
    const double sigma = std::sqrt(p[v] * (1.0 - p[v]) / static_cast<double>(draws));
    EXPECT_NEAR(f, p[v], 5.0 * sigma) << "id " << v;
  }
}

TEST(TokenSampler, FrequenciesMatchSoftmax) {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.0f};
  TokenSampler sampler(static_cast<std::int64_t>(logits.size()));
  const std::int64_t draws = 200000;
  for (const float temperature : {1.0f, 0.7f, 2.5f}) {
    for (const std::int64_t k : {0, 3, 1}) {
      std::vector<std::int64_t> counts(logits.size(), 0);
      for (std::int64_t n = 0; n < draws; ++n) {
        const std::int32_t id = sampler.sample(logits, temperature, k, sampling_uniform(42, static_cast<std::uint64_t>(n)));
        ASSERT_GE(id, 0);
        ASSERT_LT(id, static_cast<std::int32_t>(logits.size()));
        ++counts[static_cast<std::size_t>(id)];
      }
      SCOPED_TRACE("temperature " + std::to_string(temperature) + " top_k " + std::to_string(k));
      expect_frequencies(counts, expected_probs(logits, temperature, static_cast<std::size_t>(k)), draws);
    }
  }
}

TEST(TokenSampler, TopKTiesGoToLowerIds) {
  // 2.0 appears at ids 1 and 6; with k = 2 the candidates are ids 4 (3.0) and 1.
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 2.0f};
  TokenSampler sampler(7);
  for (std::int64_t n = 0; n < 2000; ++n) {
    const std::int32_t id = sampler.sample(logits, 1.0f, 2, sampling_uniform(7, static_cast<std::uint64_t>(n)));
    EXPECT_TRUE(id == 4 || id == 1) << id;
  }
}

TEST(TokenSampler, GreedyIsArgmaxWithLowestIdOnTies) {
  TokenSampler sampler(5);
  EXPECT_EQ(sampler.sample(std::vector<float>{0.0f, 4.0f, -2.0f, 4.0f, 3.9f}, 0.0f, 0, 0.999), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-5.0f, -4.0f, -3.0f, -2.0f, -1.0f}, 0.0f, 3, 0.0), 4);
}

TEST(TokenSampler, UniformEndsAndBadArguments) {
  TokenSampler sampler(3);
  const std::vector<float> logits{0.0f, 0.0f, 0.0f};
  EXPECT_EQ(sampler.sample(logits, 1.0f, 0, 0.0), 0);
  EXPECT_EQ(sampler.sample(logits, 1.0f, 0, std::nextafter(1.0, 0.0)), 2);
  EXPECT_EQ(sampler.sample(logits, 1.0f, 0, 0.5), 1);
  EXPECT_THROW(sampler.sample(logits, -1.0f, 0, 0.5), Error);
  EXPECT_THROW(sampler.sample(logits, std::numeric_limits<float>::quiet_NaN(), 0, 0.5), Error);
  EXPECT_THROW(sampler.sample(logits, 1.0f, -1, 0.5), Error);
  EXPECT_THROW(sampler.sample(std::vector<float>{0.0f, 1.0f}, 1.0f, 0, 0.5), Error);
}

TEST(TokenSampler, UniformIsInRangeAndSpread) {
  double lo = 1.0, hi = 0.0, sum = 0.0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = sampling_uniform(3, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1.0 - 1e-3);
  EXPECT_NEAR(sum / n, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / n));
  EXPECT_EQ(sampling_uniform(3, 17), sampling_uniform(3, 17));
  EXPECT_NE(sampling_uniform(3, 17), sampling_uniform(4, 17));
}

// ---- the Generator on gpt2:tiny (V = 61, Vp = 128, n_positions = 8) -----------------------------

// The logits of the last position of `context` by an independent path: a Gpt2Model of exactly
// T = context length, with the params copied in; the head's loss with only the last target set to
// v is lse - logit_v, so logit_v - logit_0 = loss_0 - loss_v.
std::vector<double> reference_logit_differences(const Gpt2Model& weights, const std::vector<std::int32_t>& context) {
  const Gpt2Config& cfg = weights.config();
  const auto T = static_cast<std::int64_t>(context.size());
  Gpt2Model m(cfg, DType::fp32, 1, T);
  copy_tensor(m.flat_params(), weights.flat_params());
  std::vector<std::int32_t> tokens = context, targets(context.size(), -1);
  const Tensor tok(tokens.data(), DType::int32, Shape{1, T});
  const Tensor tgt(targets.data(), DType::int32, Shape{1, T});
  std::vector<double> loss(static_cast<std::size_t>(cfg.vocab_size));
  for (std::int64_t v = 0; v < cfg.vocab_size; ++v) {
    targets.back() = static_cast<std::int32_t>(v);
    loss[static_cast<std::size_t>(v)] = m.forward(tok, tgt, {.train = false});
  }
  std::vector<double> diff(loss.size());
  for (std::size_t v = 0; v < loss.size(); ++v) diff[v] = loss[0] - loss[v];
  return diff;
}

std::int32_t argmax(const std::vector<double>& x) { return static_cast<std::int32_t>(std::max_element(x.begin(), x.end()) - x.begin()); }

TEST(Generator, LogitsAndGreedyMatchAnIndependentForward) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model model(cfg, DType::fp32, 1, cfg.n_positions);
  model.init_params(1234);
  // Larger weights than GPT-2's init, so the logits are far apart and argmax is well defined.
  auto* w = model.flat_params().as<float>();
  for (std::int64_t i = 0; i < model.flat_params().numel(); ++i) w[i] *= 20.0f;
  LayerStackGenerationViews views(model, model.config().vocab_size, model.config().n_positions);
  Generator gen(views.model());
  EXPECT_EQ(gen.window(), 8);

  // Logits at several context lengths (1, 3 -> bucket 4, 5 -> bucket 8, 8) and past the window.
  const std::vector<std::int32_t> base{5, 17, 42, 3, 60, 0, 9, 33, 21, 7, 11};
  for (const std::size_t len : {1u, 3u, 5u, 8u, 11u}) {
    const std::vector<std::int32_t> ctx(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(len));
    const std::vector<std::int32_t> window(ctx.end() - std::min<std::ptrdiff_t>(8, static_cast<std::ptrdiff_t>(len)), ctx.end());
    const std::vector<double> ref = reference_logit_differences(model, window);
    const std::span<const float> logits = gen.next_token_logits(ctx);
    ASSERT_EQ(logits.size(), 61u);
    for (std::size_t v = 0; v < logits.size(); ++v)
      EXPECT_NEAR(static_cast<double>(logits[v]) - logits[0], ref[v], 2e-4 * (1.0 + std::fabs(ref[v]))) << "len " << len << " id " << v;
  }

  // Greedy: each new token is the argmax of the independent logits of the window so far; 14 new
  // tokens from a 3-token prompt run past n_positions = 8 (sliding window).
  const std::vector<std::int32_t> prompt{5, 17, 42};
  SamplingOptions opt;
  opt.max_new_tokens = 14;
  opt.temperature = 0.0f;
  const std::vector<std::int32_t> out = gen.generate(prompt, opt);
  ASSERT_EQ(out.size(), 14u);
  std::vector<std::int32_t> seq = prompt;
  for (std::size_t n = 0; n < out.size(); ++n) {
    const std::vector<std::int32_t> window(seq.end() - std::min<std::ptrdiff_t>(8, static_cast<std::ptrdiff_t>(seq.size())), seq.end());
    EXPECT_EQ(out[n], argmax(reference_logit_differences(model, window))) << "token " << n;
    seq.push_back(out[n]);
  }
}

TEST(Generator, PromptLongerThanTheWindowUsesItsTail) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model model(cfg, DType::fp32, 1, cfg.n_positions);
  model.init_params(7);
  LayerStackGenerationViews views(model, model.config().vocab_size, model.config().n_positions);
  Generator gen(views.model());
  std::vector<std::int32_t> prompt(30);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 13 + 1) % 61);
  const std::vector<std::int32_t> tail(prompt.end() - 8, prompt.end());
  const std::vector<float> a(gen.next_token_logits(prompt).begin(), gen.next_token_logits(prompt).end());
  const std::span<const float> b = gen.next_token_logits(tail);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  SamplingOptions opt;
  opt.max_new_tokens = 5;
  opt.seed = 99;
  EXPECT_EQ(gen.generate(prompt, opt), gen.generate(tail, opt));

  // A smaller window than n_positions: only the last 3 tokens count.
  Generator small(views.model(), 3);
  EXPECT_EQ(small.window(), 3);
  const std::vector<std::int32_t> last3(prompt.end() - 3, prompt.end());
  const std::vector<float> c(small.next_token_logits(prompt).begin(), small.next_token_logits(prompt).end());
  const std::span<const float> d = gen.next_token_logits(last3);
  // T = 3 there, T = 4 (the next power of two) here: equal up to the kernels' rounding.
  for (std::size_t v = 0; v < c.size(); ++v) EXPECT_NEAR(c[v], d[v], 1e-5 * (1.0 + std::fabs(d[v])));
  EXPECT_THROW(Generator(views.model(), 9), Error);
}

// A GPT-2 whose next-token distribution does not depend on the context: ln_f.weight = 0 and
// ln_f.bias = e_0 make the final features e_0 at every position, so logit_v = wte[v][0]. The
// padding rows of wte get a huge logit: a sampler that looked past V would pick them.
struct KnownDistributionModel {
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model model{cfg, DType::fp32, 1, cfg.n_positions};
  std::vector<float> logits;  // the real vocabulary's

  KnownDistributionModel() {
    model.init_params(3);
    zero_tensor(model.param("ln_f.weight"));
    Tensor bias = model.param("ln_f.bias");
    zero_tensor(bias);
    bias.as<float>()[0] = 1.0f;
    float* wte = model.param("wte.weight").as<float>();
    const std::int64_t C = cfg.n_embd;
    for (std::int64_t v = 0; v < cfg.padded_vocab_size; ++v) {
      float value = 100.0f;  // padding
      if (v < cfg.vocab_size) {
        value = -8.0f;                                           // most ids: ~never
        if (v % 10 == 3) value = static_cast<float>(v) / 20.0f;  // ids 3, 13, ..., 53
        logits.push_back(value);
      }
      wte[v * C] = value;
    }
  }
};

TEST(Generator, SamplesTheKnownDistributionAndNeverPadding) {
  KnownDistributionModel k;
  LayerStackGenerationViews views(k.model, k.model.config().vocab_size, k.model.config().n_positions);
  Generator gen(views.model());
  for (const auto& [temperature, top_k] : {std::pair{1.0f, std::int64_t{0}}, std::pair{0.8f, std::int64_t{4}}}) {
    SamplingOptions opt;
    opt.max_new_tokens = 6000;
    opt.temperature = temperature;
    opt.top_k = top_k;
    opt.seed = 2024;
    opt.eot_token = 0;
    const std::vector<std::int32_t> out = gen.generate({}, opt);  // prompt: <|endoftext|>...
    ASSERT_EQ(out.size(), 6000u);
    std::vector<std::int64_t> counts(k.logits.size(), 0);
    for (const std::int32_t id : out) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, k.cfg.vocab_size) << "a padding column was sampled";
      ++counts[static_cast<std::size_t>(id)];
    }
    SCOPED_TRACE("temperature " + std::to_string(temperature) + " top_k " + std::to_string(top_k));
    expect_frequencies(counts, expected_probs(k.logits, temperature, static_cast<std::size_t>(top_k)), 6000);
  }
}

TEST(Generator, DefaultPromptIsEndOfText) {
  // gpt2:tiny has V = 61, so GPT-2's 50256 is out of range: say so instead of indexing wte past V.
  KnownDistributionModel k;
  LayerStackGenerationViews views(k.model, k.model.config().vocab_size, k.model.config().n_positions);
  Generator gen(views.model());
  SamplingOptions opt;
  opt.max_new_tokens = 3;
  EXPECT_THROW(gen.generate({}, opt), Error);
  opt.eot_token = 60;
  const std::vector<std::int32_t> with_default = gen.generate({}, opt);
  const std::vector<std::int32_t> explicit_eot = gen.generate(std::vector<std::int32_t>{60}, opt);
  EXPECT_EQ(with_default, explicit_eot);
  EXPECT_THROW(gen.generate(std::vector<std::int32_t>{61}, opt), Error);
  EXPECT_THROW(gen.generate(std::vector<std::int32_t>{-1}, opt), Error);
  opt.max_new_tokens = 0;
  EXPECT_TRUE(gen.generate(std::vector<std::int32_t>{1}, opt).empty());
}

TEST(Generator, DeterministicForASeed) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model model(cfg, DType::fp32, 1, cfg.n_positions);
  model.init_params(5);
  LayerStackGenerationViews views(model, model.config().vocab_size, model.config().n_positions);
  Generator gen(views.model());
  Generator other(views.model());
  SamplingOptions opt;
  opt.max_new_tokens = 40;
  opt.top_k = 20;
  opt.seed = 11;
  const std::vector<std::int32_t> prompt{1, 2, 3};
  const auto a = gen.generate(prompt, opt);
  EXPECT_EQ(a, gen.generate(prompt, opt));    // the same Generator again
  EXPECT_EQ(a, other.generate(prompt, opt));  // another Generator
  opt.seed = 12;
  EXPECT_NE(a, gen.generate(prompt, opt));  // 40 draws over ~20 candidates: a collision is ~impossible
}

TEST(Generator, Bf16Model) {
  // 16-bit storage: the logits row is widened from bf16; the greedy token is still the argmax.
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model model(cfg, DType::bf16, 1, cfg.n_positions);
  model.init_params(8);
  LayerStackGenerationViews views(model, model.config().vocab_size, model.config().n_positions);
  Generator gen(views.model());
  const std::span<const float> logits = gen.next_token_logits(std::vector<std::int32_t>{4, 5});
  SamplingOptions opt;
  opt.temperature = 0.0f;
  opt.max_new_tokens = 1;
  const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(gen.generate(std::vector<std::int32_t>{4, 5}, opt).at(0), best);
}

TEST(Generator, DecodeForPrint) {
  const ByteTokenizer tok;
  EXPECT_EQ(decode_for_print(tok, std::vector<std::int32_t>{72, 105, 300, 33}), "Hi<|300|>!");
  EXPECT_EQ(decode_for_print(tok, std::vector<std::int32_t>{}), "");
}

}  // namespace
}  // namespace dstrain
