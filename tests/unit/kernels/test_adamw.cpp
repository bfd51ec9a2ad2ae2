// AdamW against the algorithm in PyTorch's torch.optim.AdamW documentation implemented naively in
// double, the RNE 16-bit copy, and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "adamw_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/adamw.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Tensor f32(std::vector<float>& v) { return Tensor(v.data(), DType::fp32, Shape{static_cast<std::int64_t>(v.size())}); }

// PyTorch AdamW (amsgrad = False, maximize = False), per element, in double:
//   θ_t = θ_{t-1} - γ λ θ_{t-1};  m_t = β1 m + (1-β1) g;  v_t = β2 v + (1-β2) g²
//   m̂ = m_t / (1-β1^t);  v̂ = v_t / (1-β2^t);  θ_t = θ_t - γ m̂ / (sqrt(v̂) + ε)
void ref_step(double& p, double& m, double& v, double g, const AdamWConfig& c, std::int64_t t) {
  g *= c.grad_scale;
  p -= static_cast<double>(c.lr) * static_cast<double>(c.weight_decay) * p;
  m = c.beta1 * m + (1.0 - c.beta1) * g;
  v = c.beta2 * v + (1.0 - c.beta2) * g * g;
  const double mh = m / (1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t)));
  const double vh = v / (1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t)));
  p -= static_cast<double>(c.lr) * mh / (std::sqrt(vh) + c.eps);
}

}  // namespace

class AdamWTest : public ::testing::TestWithParam<DType> {};

TEST_P(AdamWTest, MatchesPyTorchFormula) {
  const DType gdt = GetParam();
  const Tol tol = kAdamWTols.of(gdt);
  std::mt19937_64 rng(71);
  for (const AdamWCase& c : kAdamWCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t n = c.n;
    std::vector<float> p(static_cast<std::size_t>(n)), m(p.size()), v(p.size());
    std::vector<double> rp(p.size()), rm(p.size()), rv(p.size());
    std::uniform_real_distribution<double> u(-1, 1);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] = static_cast<float>(u(rng));
      m[i] = static_cast<float>(0.01 * u(rng));
      v[i] = static_cast<float>(1e-4 * (u(rng) + 1.0));
      rp[i] = p[i];
      rm[i] = m[i];
      rv[i] = v[i];
    }
    const DType lowdt = gdt == DType::fp16 ? DType::fp16 : DType::bf16;
    Buf low(lowdt, n), grad(gdt, n);
    for (int s = 0; s < c.steps; ++s) {
      AdamWConfig cfg = c.config;
      cfg.step = c.config.step + s;
      grad.fill_uniform(rng, -1, 1);
      if (cfg.grad_scale != 1.0f) {
        for (std::int64_t i = 0; i < n; ++i) grad.set(i, grad.get(i) / cfg.grad_scale);
      }
      const auto g = grad.values();
      adamw_update(f32(p), grad.tensor({n}), f32(m), f32(v), low.tensor({n}), cfg);
      for (std::size_t i = 0; i < p.size(); ++i) ref_step(rp[i], rm[i], rv[i], g[i], cfg, cfg.step);
    }
    expect_close(std::vector<double>(p.begin(), p.end()), rp, tol, "params, grads " + dtype_label(gdt));
    expect_close(std::vector<double>(m.begin(), m.end()), rm, tol, "m");
    expect_close(std::vector<double>(v.begin(), v.end()), rv, Tol{1e-9, 1e-5}, "v");
    for (std::int64_t i = 0; i < n; ++i) {
      Buf want(lowdt, 1);
      want.set(0, p[static_cast<std::size_t>(i)]);
      ASSERT_EQ(low.get(i), want.get(0)) << "16-bit copy is the RNE rounding of the master, element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllGradDTypes, AdamWTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(AdamW, NoLowPrecisionCopyAndNoDecay) {
  std::vector<float> p = {1.0f, -2.0f}, m = {0, 0}, v = {0, 0}, g = {0.5f, -0.25f};
  adamw_update(f32(p), f32(g), f32(m), f32(v), Tensor(), AdamWConfig{0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1.0f});
  // First step of Adam moves each parameter by lr * sign(g) (m̂ / sqrt(v̂) = g / |g|).
  EXPECT_NEAR(p[0], 0.9, 1e-6);
  EXPECT_NEAR(p[1], -1.9, 1e-6);
}

TEST(AdamW, BadArgumentsNameTheOpAndShapes) {
  std::vector<float> p(4), m(4), v(3), g(4);
  expect_error([&] { adamw_update(f32(p), f32(g), f32(m), f32(v), Tensor(), AdamWConfig{}); }, {"adamw_update", "'v'", "[3]", "[4]"});
  v.resize(4);
  Buf h(DType::fp16, 4);
  expect_error([&] { adamw_update(h.tensor({4}), f32(g), f32(m), f32(v), Tensor(), AdamWConfig{}); }, {"adamw_update", "params", "fp32"});
  expect_error([&] { adamw_update(f32(p), f32(g), f32(m), f32(v), f32(g), AdamWConfig{}); }, {"adamw_update", "params_lowp", "fp16 or bf16"});
  AdamWConfig bad;
  bad.step = 0;
  expect_error([&] { adamw_update(f32(p), f32(g), f32(m), f32(v), Tensor(), bad); }, {"adamw_update", "step = 0"});
  Tensor gp(p.data(), DType::fp32, Shape{4}, Device::cuda(2));
  expect_error([&] { adamw_update(gp, f32(g), f32(m), f32(v), Tensor(), AdamWConfig{}); }, {"adamw_update", "cuda:2"});
}

// Adam with coupled L2 weight decay (decoupled_weight_decay = false): torch.optim.Adam /
// DeepSpeed FusedAdam with adam_w_mode false, naively in double:
//   g = grad·grad_scale + λ θ;  m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²
//   θ = θ - γ (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)      (bias corrections 1 when disabled)
TEST(AdamL2, MatchesTorchAdamFormula) {
  for (const bool bias_correction : {true, false}) {
    for (const DType gdt : kFloatDTypes) {
      SCOPED_TRACE(dtype_label(gdt) + (bias_correction ? " bias_correction" : " no bias_correction"));
      std::mt19937_64 rng(41);
      const std::int64_t n = 1003;
      std::vector<float> p(static_cast<std::size_t>(n)), m(p.size()), v(p.size());
      std::vector<double> rp(p.size()), rm(p.size()), rv(p.size());
      std::uniform_real_distribution<double> u(-1, 1);
      for (std::size_t i = 0; i < p.size(); ++i) rp[i] = p[i] = static_cast<float>(u(rng));
      Buf grad(gdt, n);
      for (std::int64_t t = 1; t <= 3; ++t) {
        AdamWConfig c{1e-2f, 0.9f, 0.99f, 1e-8f, 0.1f, t, 0.5f};
        c.decoupled_weight_decay = false;
        c.bias_correction = bias_correction;
        grad.fill_uniform(rng, -1, 1);
        const auto g = grad.values();
        adamw_update(f32(p), grad.tensor({n}), f32(m), f32(v), Tensor(), c);
        const double bc1 = bias_correction ? 1 - std::pow(static_cast<double>(0.9f), static_cast<double>(t)) : 1.0;
        const double bc2 = bias_correction ? 1 - std::pow(static_cast<double>(0.99f), static_cast<double>(t)) : 1.0;
        for (std::size_t i = 0; i < p.size(); ++i) {
          const double gi = g[i] * 0.5 + static_cast<double>(0.1f) * rp[i];
          rm[i] = static_cast<double>(0.9f) * rm[i] + (1 - static_cast<double>(0.9f)) * gi;
          rv[i] = static_cast<double>(0.99f) * rv[i] + (1 - static_cast<double>(0.99f)) * gi * gi;
          rp[i] -= static_cast<double>(1e-2f) * (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + static_cast<double>(1e-8f));
        }
      }
      expect_close(std::vector<double>(p.begin(), p.end()), rp, Tol{1e-6, 1e-5}, "params");
      expect_close(std::vector<double>(m.begin(), m.end()), rm, Tol{1e-6, 1e-5}, "m");
    }
  }
}

// Stochastic rounding of the bf16 copy: each element lands on one of its two bf16 neighbours, up
// with probability equal to its distance from the lower one (so the mean over many elements is the
// fp32 value), the same bits for the same key, and element i of a call at offset o equals element
// o + i of a call over the whole buffer (the numbering a ZeRO split keeps).
TEST(AdamW, StochasticRoundingOfTheBf16CopyIsUnbiasedAndReproducible) {
  constexpr std::int64_t n = 40000;
  // Halfway is 1 + 2^-8 (bf16 neighbours 1 and 1 + 2^-7); take a quarter of the way: 1 + 2^-9.
  const float x = 1.0f + 0x1p-9f;
  std::vector<float> p(n, x), g(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  std::vector<bf16_t> low(n);
  AdamWConfig c;
  c.lr = 0.0f;  // the master stays x: only the rounding is under test
  c.stochastic_rounding = true;
  c.rounding_key = RngKey{7, 3, 2, 0, 4};
  const auto run = [&](std::int64_t begin, std::int64_t count, std::int64_t offset) {
    AdamWConfig cc = c;
    cc.rounding_offset = offset;
    adamw_update(Tensor(p.data() + begin, DType::fp32, Shape{count}), Tensor(g.data() + begin, DType::fp32, Shape{count}),
                 Tensor(m.data() + begin, DType::fp32, Shape{count}), Tensor(v.data() + begin, DType::fp32, Shape{count}),
                 Tensor(low.data() + begin, DType::bf16, Shape{count}), cc);
  };
  run(0, n, 0);
  double sum = 0.0;
  std::int64_t up = 0;
  for (const bf16_t b : low) {
    const float f = static_cast<float>(b);
    ASSERT_TRUE(f == 1.0f || f == 1.0f + 0x1p-7f) << f;
    up += f > 1.0f;
    sum += f;
  }
  // P(up) = 1/4: 10,000 expected, standard deviation ~87; 5 sigma.
  EXPECT_NEAR(static_cast<double>(up), 0.25 * n, 5 * std::sqrt(n * 0.25 * 0.75));
  EXPECT_NEAR(sum / n, x, 5 * 0x1p-7 * std::sqrt(0.25 * 0.75 / n));
  const std::vector<bf16_t> whole = low;
  run(0, n, 0);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(low[i].bits, whole[i].bits) << "same key, same bits: element " << i;
  run(1000, 500, 1000);  // a partition: its elements numbered by their place in the whole buffer
  for (std::int64_t i = 1000; i < 1500; ++i) ASSERT_EQ(low[i].bits, whole[i].bits) << "offset numbering: element " << i;
  // Off: round to nearest even (x is below halfway: always down).
  c.stochastic_rounding = false;
  run(0, n, 0);
  for (const bf16_t b : low) ASSERT_EQ(static_cast<float>(b), 1.0f);
}
