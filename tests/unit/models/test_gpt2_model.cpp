// The GPT-2 layers, driven by Gpt2Model, against an independent double-precision GPT-2
// (naive_gpt2.h): loss, every parameter's gradient by central differences, dropout determinism,
// 16-bit storage, init statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "model_test_util.h"
#include "naive_gpt2.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/gpt2/gpt2_model.h"
#include "models/param_init.h"

namespace dstrain {
namespace {

using test::fill_test_params;
using test::naive_from;
using test::random_batch;
using test::to_doubles;

// V = 61 padded to 128, C = 16, NH = 2, L = 2, T = 8 (n_positions 8), B = 2.
Gpt2Config tiny() { return model_config_from_spec("gpt2:tiny"); }

TEST(Gpt2Model, TinySpecIsTheStatedShape) {
  const Gpt2Config c = tiny();
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_embd, 16);
  EXPECT_EQ(c.n_head, 2);
  EXPECT_EQ(c.vocab_size, 61);
  EXPECT_EQ(c.padded_vocab_size, 128);
  EXPECT_EQ(c.n_positions, 8);
}

// fp32: reduction order and fp32 rounding only; |loss - naive| <= 5e-6 (loss ~ 5; seen: 4.8e-7).
TEST(Gpt2Model, ForwardLossMatchesNaiveDoubleFp32) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  fill_test_params(m, 1);
  auto b = random_batch(2, 8, 61, 2);
  const float loss = m.forward(b.tokens_tensor(), b.targets_tensor());
  const double ref = naive_from(m).loss(b.tokens, b.targets, 2, 8);
  EXPECT_GT(ref, 1.0);  // not a degenerate case
  EXPECT_NEAR(loss, ref, 5e-6);
}

// 16-bit storage: the naive model reads the same rounded parameters, so the difference is the
// rounding of activations to 8 (bf16) / 11 (fp16) significant bits between kernels.
// Tolerances: bf16 |d| <= 0.03 (seen 0.0064), fp16 |d| <= 0.005 (seen 5.4e-4); loss ~ 5.
TEST(Gpt2Model, ForwardLossMatchesNaiveDouble16Bit) {
  for (const auto& [dtype, tol] : {std::pair{DType::bf16, 0.03}, std::pair{DType::fp16, 0.005}}) {
    Gpt2Model m(tiny(), dtype, 2, 8);
    fill_test_params(m, 1);
    auto b = random_batch(2, 8, 61, 2);
    const float loss = m.forward(b.tokens_tensor(), b.targets_tensor());
    const double ref = naive_from(m).loss(b.tokens, b.targets, 2, 8);
    EXPECT_NEAR(loss, ref, tol) << dtype_name(dtype);
  }
}

TEST(Gpt2Model, PaddedLogitsAndIgnoredTargetsDoNotCount) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  fill_test_params(m, 3);
  auto b = random_batch(2, 8, 61, 4);
  const float loss1 = m.forward(b.tokens_tensor(), b.targets_tensor());
  // Changing the padded rows of wte (>= V) changes no logit that counts.
  Tensor wte = m.param("wte.weight");
  auto* w = wte.as<float>();
  for (std::int64_t i = 61 * 16; i < 128 * 16; ++i) w[i] = 100.0f;
  const float loss2 = m.forward(b.tokens_tensor(), b.targets_tensor());
  EXPECT_EQ(loss1, loss2);
  // The ignored position's target value is irrelevant; all ignored gives 0.
  for (auto& t : b.targets) t = -1;
  EXPECT_EQ(m.forward(b.tokens_tensor(), b.targets_tensor()), 0.0f);
}

// Central differences of the double model (step 1e-5: truncation ~1e-10, rounding ~1e-11) against
// our fp32 analytic gradient, for every parameter tensor: all elements of tensors up to 256
// elements, 48 random ones of larger tensors. Tolerance per tensor: |g - fd| <= 2e-5 * max|fd| +
// 1e-7 (fp32 backward through two blocks; worst seen 7e-7 * max|fd|). The padded rows of wte must get exactly zero gradient.
TEST(Gpt2Model, EveryGradientMatchesFiniteDifferencesOfNaiveDouble) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  fill_test_params(m, 5);
  auto b = random_batch(2, 8, 61, 6);
  m.zero_grad();
  m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward();
  test::NaiveGpt2 naive = naive_from(m);
  std::mt19937_64 rng(7);
  const double h = 1e-5;
  for (const auto& p : m.params()) {
    const std::string& name = p.spec.name;
    const auto grad = to_doubles(p.grad);
    std::int64_t n = p.value.numel();
    if (name == "wte.weight") {
      for (std::int64_t i = 61 * 16; i < n; ++i) ASSERT_EQ(grad[i], 0.0) << "padded row element " << i;
      n = 61 * 16;
    }
    std::vector<std::int64_t> idx;
    if (n <= 256) {
      for (std::int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      std::uniform_int_distribution<std::int64_t> d(0, n - 1);
      for (int k = 0; k < 48; ++k) idx.push_back(d(rng));
    }
    std::vector<double> fd(idx.size());
    auto& w = naive.p[name];
    double fd_max = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      const double w0 = w[idx[k]];
      w[idx[k]] = w0 + h;
      const double lp = naive.loss(b.tokens, b.targets, 2, 8);
      w[idx[k]] = w0 - h;
      const double lm = naive.loss(b.tokens, b.targets, 2, 8);
      w[idx[k]] = w0;
      fd[k] = (lp - lm) / (2 * h);
      fd_max = std::max(fd_max, std::abs(fd[k]));
    }
    EXPECT_GT(fd_max, 1e-6) << name << ": gradient is ~0, the check would be vacuous";
    const double tol = 2e-5 * fd_max + 1e-7;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      EXPECT_NEAR(grad[idx[k]], fd[k], tol) << name << "[" << idx[k] << "]";
    }
  }
}

// Past the tiny shapes: T = 80 crosses the attention kernel's 64-key chunks, head size 16, a
// padded vocabulary of 384 for V = 300. Loss within 2e-5 (fp32), and 4 elements of every
// parameter's gradient against central differences of the double model, |g - fd| <= 1e-4 * max|fd|
// + 1e-7.
TEST(Gpt2Model, LargerShapesMatchNaiveDouble) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:L1-C64-H4-V300-T80");
  Gpt2Model m(cfg, DType::fp32, 2, 80);
  fill_test_params(m, 31);
  auto b = random_batch(2, 80, 300, 32);
  m.zero_grad();
  const float loss = m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward();
  test::NaiveGpt2 naive = naive_from(m);
  EXPECT_NEAR(loss, naive.loss(b.tokens, b.targets, 2, 80), 2e-5);
  std::mt19937_64 rng(33);
  for (const auto& p : m.params()) {
    const auto grad = to_doubles(p.grad);
    const std::int64_t n = p.spec.name == "wte.weight" ? 300 * 64 : p.value.numel();
    std::uniform_int_distribution<std::int64_t> d(0, n - 1);
    auto& w = naive.p[p.spec.name];
    std::vector<std::pair<std::int64_t, double>> fds;
    double fd_max = 0;
    for (int k = 0; k < 4; ++k) {
      const std::int64_t i = d(rng);
      const double w0 = w[i], h = 1e-5;
      w[i] = w0 + h;
      const double lp = naive.loss(b.tokens, b.targets, 2, 80);
      w[i] = w0 - h;
      const double lm = naive.loss(b.tokens, b.targets, 2, 80);
      w[i] = w0;
      fds.emplace_back(i, (lp - lm) / (2 * h));
      fd_max = std::max(fd_max, std::abs(fds.back().second));
    }
    for (const auto& [i, fd] : fds) EXPECT_NEAR(grad[i], fd, 1e-4 * fd_max + 1e-7) << p.spec.name << "[" << i << "]";
  }
}

// Gradients accumulate (+=) over micro-batches.
TEST(Gpt2Model, BackwardAccumulatesGradients) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  fill_test_params(m, 8);
  auto b = random_batch(2, 8, 61, 9);
  m.zero_grad();
  m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward();
  const auto once = to_doubles(m.flat_grads());
  m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward();
  const auto twice = to_doubles(m.flat_grads());
  double mx = 0;
  for (double g : once) mx = std::max(mx, std::abs(g));
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(twice[i], 2 * once[i], 1e-6 * mx) << i;
  // dloss scales the gradient (loss scaling, 1 / accumulation steps).
  m.zero_grad();
  m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward(0.25f);
  const auto quarter = to_doubles(m.flat_grads());
  for (std::size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(quarter[i], 0.25 * once[i], 1e-6 * mx) << i;
}

// 16-bit storage: gradients against the fp32 model's, per tensor,
// ||g16 - g32|| <= tol * ||g32|| with tol bf16 0.05 (worst seen 0.018), fp16 0.01 (seen 0.0017),
// from the same rounded parameters.
TEST(Gpt2Model, Backward16BitCloseToFp32) {
  for (const auto& [dtype, tol] : {std::pair{DType::bf16, 0.05}, std::pair{DType::fp16, 0.01}}) {
    Gpt2Model lo(tiny(), dtype, 2, 8);
    fill_test_params(lo, 10);
    Gpt2Model hi(tiny(), DType::fp32, 2, 8);
    for (std::size_t i = 0; i < lo.params().size(); ++i) test::from_doubles(hi.params()[i].value, to_doubles(lo.params()[i].value));
    auto b = random_batch(2, 8, 61, 11);
    lo.zero_grad();
    hi.zero_grad();
    lo.forward(b.tokens_tensor(), b.targets_tensor());
    lo.backward();
    hi.forward(b.tokens_tensor(), b.targets_tensor());
    hi.backward();
    for (std::size_t i = 0; i < lo.params().size(); ++i) {
      const auto g16 = to_doubles(lo.params()[i].grad), g32 = to_doubles(hi.params()[i].grad);
      double num = 0, den = 0;
      for (std::size_t k = 0; k < g16.size(); ++k) {
        num += (g16[k] - g32[k]) * (g16[k] - g32[k]);
        den += g32[k] * g32[k];
      }
      EXPECT_LE(std::sqrt(num), tol * std::sqrt(den)) << dtype_name(dtype) << " " << lo.params()[i].spec.name;
    }
  }
}

Gpt2Config tiny_dropout() {
  Gpt2Config c = tiny();
  c.embd_pdrop = 0.1f;
  c.resid_pdrop = 0.1f;
  c.attn_pdrop = 0.1f;
  return c;
}

TEST(Gpt2Model, DropoutIsAFunctionOfTheKeys) {
  Gpt2Model m(tiny_dropout(), DType::fp32, 2, 8);
  fill_test_params(m, 12);
  auto b = random_batch(2, 8, 61, 13);
  Gpt2StepOptions o{true, 42, 7, 1};
  const float l1 = m.forward(b.tokens_tensor(), b.targets_tensor(), o);
  const float l2 = m.forward(b.tokens_tensor(), b.targets_tensor(), o);
  EXPECT_EQ(l1, l2);  // recompute with the same keys: bit-identical
  Gpt2StepOptions other_step = o;
  other_step.step = 8;
  Gpt2StepOptions other_mb = o;
  other_mb.micro_batch = 2;
  Gpt2StepOptions other_seed = o;
  other_seed.seed = 43;
  EXPECT_NE(m.forward(b.tokens_tensor(), b.targets_tensor(), other_step), l1);
  EXPECT_NE(m.forward(b.tokens_tensor(), b.targets_tensor(), other_mb), l1);
  EXPECT_NE(m.forward(b.tokens_tensor(), b.targets_tensor(), other_seed), l1);
  // Evaluation turns dropout off: the loss is the dropout-free model's.
  Gpt2StepOptions eval = o;
  eval.train = false;
  const float le = m.forward(b.tokens_tensor(), b.targets_tensor(), eval);
  EXPECT_NE(le, l1);
  EXPECT_NEAR(le, naive_from(m).loss(b.tokens, b.targets, 2, 8), 1e-5);
}

// With dropout on, the backward must apply the forward's masks: central differences of our own
// fp32 model with the same keys (step 1e-2; fp32 loss rounding ~5e-7 / 1e-2 = 5e-5), 12 elements
// per tensor, |g - fd| <= 2e-3 * max|fd| + 2e-4 (worst seen 3.6e-4 * max|fd|).
TEST(Gpt2Model, DropoutGradientMatchesFiniteDifferencesWithSameKeys) {
  Gpt2Model m(tiny_dropout(), DType::fp32, 2, 8);
  fill_test_params(m, 14);
  auto b = random_batch(2, 8, 61, 15);
  const Gpt2StepOptions o{true, 5, 3, 0};
  m.zero_grad();
  m.forward(b.tokens_tensor(), b.targets_tensor(), o);
  m.backward();
  std::mt19937_64 rng(16);
  const float h = 1e-2f;
  for (const auto& p : m.params()) {
    const auto grad = to_doubles(p.grad);
    std::int64_t n = p.value.numel();
    if (p.spec.name == "wte.weight") n = 61 * 16;
    std::uniform_int_distribution<std::int64_t> d(0, n - 1);
    auto* w = p.value.as<float>();
    std::vector<std::pair<std::int64_t, double>> fds;
    double fd_max = 0;
    for (int k = 0; k < 12; ++k) {
      const std::int64_t i = d(rng);
      const float w0 = w[i];
      w[i] = w0 + h;
      const double lp = m.forward(b.tokens_tensor(), b.targets_tensor(), o);
      w[i] = w0 - h;
      const double lm = m.forward(b.tokens_tensor(), b.targets_tensor(), o);
      w[i] = w0;
      const double fd = (lp - lm) / (2.0 * static_cast<double>(h));
      fds.emplace_back(i, fd);
      fd_max = std::max(fd_max, std::abs(fd));
    }
    for (const auto& [i, fd] : fds) EXPECT_NEAR(grad[i], fd, 2e-3 * fd_max + 2e-4) << p.spec.name << "[" << i << "]";
  }
}

// GPT-2 init makes the logits ~0, so the first loss is ~ln(V) = ln(61) = 4.111.
TEST(Gpt2Model, LossAtInitIsLogVocab) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  m.init_params(1234);
  auto b = random_batch(2, 8, 61, 17, false);
  EXPECT_NEAR(m.forward(b.tokens_tensor(), b.targets_tensor()), std::log(61.0), 0.02);
}

// ---- init ----

TEST(Gpt2Init, StatisticsPerTensor) {
  const Gpt2Config c = model_config_from_spec("gpt2:L2-C64-H4-V1000-T64");
  Gpt2Model m(c, DType::fp32, 1, 4);
  m.init_params(99);
  const double resid_std = 0.02 / std::sqrt(4.0);
  for (const auto& p : m.params()) {
    const std::string& n = p.spec.name;
    auto v = to_doubles(p.value);
    if (n == "wte.weight") {
      for (std::size_t i = 1000 * 64; i < v.size(); ++i) ASSERT_EQ(v[i], 0.0) << "padded row element " << i;
      v.resize(1000 * 64);
    }
    const bool is_ln = n.find("ln_") != std::string::npos;
    if (n.ends_with(".bias")) {
      for (double x : v) ASSERT_EQ(x, 0.0) << n;
      EXPECT_FALSE(p.spec.weight_decay) << n;
      continue;
    }
    if (is_ln) {
      for (double x : v) ASSERT_EQ(x, 1.0) << n;
      EXPECT_FALSE(p.spec.weight_decay) << n;
      continue;
    }
    EXPECT_TRUE(p.spec.weight_decay) << n;
    const double expected = (n.ends_with("c_proj.weight")) ? resid_std : 0.02;
    double mean = 0, sq = 0;
    for (double x : v) mean += x;
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    const double sd = std::sqrt(sq / static_cast<double>(v.size()));
    // n >= 4096 samples: the sample std is within ~2.2% (2 sigma) of the truth; allow 6%.
    EXPECT_NEAR(sd, expected, 0.06 * expected) << n << " (" << v.size() << " elements)";
    EXPECT_NEAR(mean, 0.0, 5.0 * expected / std::sqrt(static_cast<double>(v.size()))) << n;
    // Normal, not uniform: about 4.55% of the samples lie beyond 2 std.
    std::size_t tail = 0;
    for (double x : v) tail += std::abs(x - mean) > 2 * expected ? 1 : 0;
    EXPECT_NEAR(static_cast<double>(tail) / static_cast<double>(v.size()), 0.0455, 0.012) << n;
  }
}

TEST(Gpt2Init, DeterministicFromTheSeed) {
  Gpt2Model a(tiny(), DType::fp32, 1, 8), b(tiny(), DType::fp32, 1, 8), c(tiny(), DType::fp32, 1, 8);
  a.init_params(7);
  b.init_params(7);
  c.init_params(8);
  const Tensor fa = a.flat_params(), fb = b.flat_params(), fc = c.flat_params();
  EXPECT_EQ(std::memcmp(fa.data, fb.data, fa.nbytes()), 0);
  EXPECT_NE(std::memcmp(fa.data, fc.data, fa.nbytes()), 0);
  // Different tensors draw different streams (same shape, same std: h.0 vs h.1 c_fc).
  EXPECT_NE(std::memcmp(a.param("h.0.mlp.c_fc.weight").data, a.param("h.1.mlp.c_fc.weight").data, a.param("h.0.mlp.c_fc.weight").nbytes()), 0);
  // Pinned values: the stream is a pure function of (seed, name), identical on every machine.
  // (Box-Muller on Philox4x32-10 words of group 0 of key (7, step fnv1a("wpe.weight"), layer 0, site 0xffff).)
  const RngKey k = param_init_key("wpe.weight", 7);
  const PhiloxCounter w = k.group_bits(0);
  const double u1 = (static_cast<double>(w.v[0] >> 8) + 1.0) * 0x1p-24, u2 = static_cast<double>(w.v[1] >> 8) * 0x1p-24;
  const double z0 = 0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  EXPECT_EQ(a.param("wpe.weight").as<float>()[0], static_cast<float>(z0));
  // And pinned as numbers: a change of the init scheme changes every run's numbers, so it must be
  // deliberate (update these with a note in the commit).
  EXPECT_EQ(a.param("wpe.weight").as<float>()[0], 0x1.dd1286p-6f);
  EXPECT_EQ(a.param("wpe.weight").as<float>()[1], -0x1.27f828p-8f);
  EXPECT_EQ(a.param("h.1.attn.c_proj.weight").as<float>()[5], -0x1.82d93ap-10f);
  // bf16 storage holds the fp32 init rounded once.
  Gpt2Model h(tiny(), DType::bf16, 1, 8);
  h.init_params(7);
  const auto lo = to_doubles(h.param("wpe.weight"));
  EXPECT_EQ(lo[0], static_cast<double>(static_cast<float>(bf16_t(static_cast<float>(z0)))));
}

TEST(Gpt2Layers, TiedHeadWeightHasNoStorageOfItsOwn) {
  Gpt2Model m(tiny(), DType::fp32, 1, 8);
  for (const auto& p : m.params()) EXPECT_NE(p.spec.name, "lm_head.weight");
  EXPECT_EQ(m.param("lm_head.weight").data, m.param("wte.weight").data);
  EXPECT_EQ(m.grad("lm_head.weight").data, m.grad("wte.weight").data);
  std::int64_t owned = 0;
  for (const auto& p : m.params()) owned += p.value.numel();
  EXPECT_EQ(owned, parameter_count_padded(tiny()));
  const auto layers = make_gpt2_layers(tiny());
  ASSERT_EQ(layers.size(), 4u);
  const auto head = layers.back()->params();
  EXPECT_EQ(head.back().tied_to, "wte.weight");
}

// Memory is allocated once, up front, and counted per purpose.
TEST(Gpt2Model, MemoryIsAllocatedUpFrontAndCounted) {
  const MemoryStats before = cpu_allocator().stats();
  Gpt2Model m(tiny(), DType::bf16, 2, 8);
  const MemoryStats after = cpu_allocator().stats();
  const auto grew = [&](MemoryPurpose p) { return after[p].current - before[p].current; };
  EXPECT_EQ(grew(MemoryPurpose::params), m.flat_params().nbytes());
  EXPECT_EQ(grew(MemoryPurpose::grads), m.flat_grads().nbytes());
  EXPECT_GE(m.flat_params().nbytes(), static_cast<std::size_t>(parameter_count_padded(tiny())) * 2);
  EXPECT_LT(m.flat_params().nbytes(), static_cast<std::size_t>(parameter_count_padded(tiny())) * 2 + 40 * 64);  // alignment gaps only
  // Activations: at least every layer's output and saved tensors.
  std::size_t need = 0;
  for (const auto& layer : m.layers()) {
    need += layer->output(m.dims()).nbytes();
    for (const auto& s : layer->saved_activations(m.dims())) need += s.nbytes();
  }
  EXPECT_GE(grew(MemoryPurpose::activations), need);
  auto b = random_batch(2, 8, 61, 1);
  const std::uint64_t allocs = cpu_allocator().stats().total.allocations;
  m.forward(b.tokens_tensor(), b.targets_tensor());
  m.backward();
  EXPECT_EQ(cpu_allocator().stats().total.allocations, allocs) << "forward/backward must not allocate";
}

TEST(Gpt2Model, RejectsBadBatches) {
  Gpt2Model m(tiny(), DType::fp32, 2, 8);
  auto b = random_batch(2, 8, 61, 1);
  b.tokens[5] = 61;  // in the padded range [V, Vp): a data error
  EXPECT_THROW(m.forward(b.tokens_tensor(), b.targets_tensor()), Error);
  auto c = random_batch(1, 8, 61, 1);
  EXPECT_THROW(m.forward(c.tokens_tensor(), c.targets_tensor()), Error);
  EXPECT_THROW(Gpt2Model(tiny(), DType::fp32, 2, 9), Error);  // T > n_positions
  Gpt2Model fresh(tiny(), DType::fp32, 2, 8);
  EXPECT_THROW(fresh.backward(), Error);
}

}  // namespace
}  // namespace dstrain
