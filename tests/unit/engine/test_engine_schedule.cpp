// The config's "scheduler" block through the engine: the LR (and OneCycle's betas) each optimizer
// step uses, against the formulas of docs/lr_schedules.md written out here independently of
// engine/lr_schedule.cpp, with the stepping rule "optimizer step k uses it = k - 2, the
// constructor's value for k = 1"; and the parameter update each step actually makes, against a
// naive double AdamW run at those expected values.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "models/gpt2/gpt2_model.h"

#include "engine_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace engine_testing;

// AdamW lr 1e-3, betas (0.9, 0.95), weight decay 0.1, no clipping (the default would clip at 1.0),
// with `scheduler`.
std::string config_with(const std::string& scheduler) {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
    "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}}}},
    "scheduler": {}}})",
                     scheduler);
}

struct Tokens {
  std::vector<std::int32_t> tokens, targets;
  Batch batch() {
    const Shape bt{2, 8};
    return Batch{Tensor(tokens.data(), DType::int32, bt), Tensor(targets.data(), DType::int32, bt)};
  }
};
Tokens tokens_for_step(int k) {
  Tokens t;
  std::uint32_t s = 977u * static_cast<std::uint32_t>(k) + 1u;
  std::vector<std::int32_t> seq(17);
  for (auto& x : seq) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % 61u);
  }
  t.tokens.assign(seq.begin(), seq.end() - 1);
  t.targets.assign(seq.begin() + 1, seq.end());
  return t;
}

// Runs `steps` optimizer steps; returns the LR the engine reported before each (lr()), checking
// that the step then reports having used it (last_step_lr()).
std::vector<double> lrs_used(Engine& e, int steps, std::vector<std::pair<double, double>>* betas = nullptr) {
  std::vector<double> out;
  for (int k = 1; k <= steps; ++k) {
    out.push_back(e.state().lr);
    if (betas) betas->push_back(e.state().betas);
    Tokens tk = tokens_for_step(k);
    e.forward(tk.batch());
    e.backward();
    e.step();
    EXPECT_EQ(e.state().last_step_lr, out.back()) << "step " << k;
  }
  return out;
}

void expect_lrs(const std::vector<double>& got, const std::function<double(int)>& expected_for_step) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int k = static_cast<int>(i) + 1;
    EXPECT_NEAR(got[i], expected_for_step(k), 1e-15) << "optimizer step " << k;
  }
}

TEST(EngineSchedule, NoSchedulerIsTheOptimizersConstantLr) {
  Engine e =
      initialize(make_gpt2_model("gpt2:tiny"), ds(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})"),
                 {.seed = 1, .sequence_length = 8});
  expect_lrs(lrs_used(e, 3), [](int) { return 3e-4; });
}

// WarmupLR, linear, W = 10, min 0, max 2e-3: it < 0 -> min; it < W -> max·it/W; then max.
TEST(EngineSchedule, WarmupLrLinear) {
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_with(R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3,
                          "warmup_num_steps": 10, "warmup_type": "linear"}})")),
                        {.seed = 1, .sequence_length = 8});
  const auto got = lrs_used(e, 14);
  expect_lrs(got, [](int k) {
    const int it = k - 2;
    if (it < 0) return 0.0;
    if (it < 10) return 2e-3 * it / 10.0;
    return 2e-3;
  });
  // Spot values by hand: steps 1, 2 at 0; step 3 at 2e-4; step 12 onwards at the max.
  EXPECT_EQ(got[0], 0.0);
  EXPECT_EQ(got[1], 0.0);
  EXPECT_NEAR(got[2], 2e-4, 1e-18);
  EXPECT_NEAR(got[11], 2e-3, 1e-18);
  EXPECT_NEAR(e.state().lr, 2e-3, 1e-18);  // what step 15 will use
}

// WarmupDecayLR: total 20, W = 5 linear, min 1e-4, max 1e-3; after warm-up
// min + (max - min)·max(0, (T - it) / max(1, T - W)).
TEST(EngineSchedule, WarmupDecayLr) {
  Engine e =
      initialize(make_gpt2_model("gpt2:tiny"), ds(config_with(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 20, "warmup_min_lr": 1e-4,
                          "warmup_max_lr": 1e-3, "warmup_num_steps": 5, "warmup_type": "linear"}})")),
                 {.seed = 1, .sequence_length = 8});
  expect_lrs(lrs_used(e, 24), [](int k) {
    const int it = k - 2;
    const double lo = 1e-4, hi = 1e-3;
    if (it < 0) return lo;
    if (it < 5) return lo + (hi - lo) * it / 5.0;
    return lo + (hi - lo) * std::max(0.0, (20.0 - it) / 15.0);
  });
}

// WarmupCosineLR: org_lr 1e-3, total 12, W = 4 linear, cos_min_ratio 0.1. The first optimizer step
// runs at lr 0, so it leaves every parameter exactly as it was (decoupled decay is lr·wd·θ = 0).
TEST(EngineSchedule, WarmupCosineLrFirstStepAtZero) {
  Engine e =
      initialize(make_gpt2_model("gpt2:tiny"), ds(config_with(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 12, "warmup_num_steps": 4,
                          "warmup_type": "linear", "cos_min_ratio": 0.1}})")),
                 {.seed = 1, .sequence_length = 8});
  std::map<std::string, std::vector<float>> before;
  for (const auto& n : e.param_names()) {
    const Tensor p = e.param(n);
    before[n].assign(p.as<float>(), p.as<float>() + p.numel());
  }
  const auto first = lrs_used(e, 1);
  EXPECT_EQ(first[0], 0.0);
  EXPECT_GT(e.state().grad_norm, 0.0);  // there was a gradient to apply
  for (const auto& n : e.param_names()) {
    const Tensor p = e.param(n);
    ASSERT_EQ(std::vector<float>(p.as<float>(), p.as<float>() + p.numel()), before[n]) << n;
  }
  auto got = first;
  const auto rest = lrs_used(e, 15);
  got.insert(got.end(), rest.begin(), rest.end());
  expect_lrs(got, [](int k) {
    const int it = k - 2;
    if (it < 0) return 0.0;
    if (it < 4) return 1e-3 * it / 4.0;
    const double p = std::min(1.0, (it - 4 + 1) / 8.0);
    return 1e-3 * std::max(0.0, 0.1 + 0.9 * (1.0 + std::cos(std::numbers::pi * p)) / 2.0);
  });
}

// OneCycle: lr 1e-4 .. 1e-3 over F = S = 3, then decay min / (1 + 0.5·d/2); beta1 cycles 0.95 ..
// 0.85 the other way, beta2 forced to 0.99; the constructor's betas are (min_mom, 0.99).
double onecycle_s(int it) {
  const double N = 6.0, rho = 0.5, b = it + 1;
  const double c = std::floor(1.0 + b / N), x = 1.0 + b / N - c;
  return x <= rho ? x / rho : (x - 1.0) / (rho - 1.0);
}
double onecycle_lr(int k) {
  const int it = k - 2;
  if (it < 0) return 1e-4;
  if (it < 6) return 1e-4 + (1e-3 - 1e-4) * onecycle_s(it);
  return 1e-4 / (1.0 + 0.5 * (it - 6 + 1) / 2.0);
}
double onecycle_beta1(int k) {
  const int it = k - 2;
  if (it < 0) return 0.85;
  if (it < 6) return 0.95 - (0.95 - 0.85) * onecycle_s(it);
  return 0.95;
}
const char* kOneCycle = R"({"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
  "cycle_first_step_size": 3, "decay_lr_rate": 0.5, "decay_step_size": 2, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}})";

TEST(EngineSchedule, OneCycleLrAndBetas) {
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(config_with(kOneCycle)), {.seed = 1, .sequence_length = 8});
  std::vector<std::pair<double, double>> betas;
  const auto got = lrs_used(e, 11, &betas);
  expect_lrs(got, onecycle_lr);
  // Hand values: step 4 (it 2, b 3 = F) at the peak lr with the lowest beta1.
  EXPECT_NEAR(got[3], 1e-3, 1e-15);
  for (std::size_t i = 0; i < betas.size(); ++i) {
    const int k = static_cast<int>(i) + 1;
    EXPECT_NEAR(betas[i].first, onecycle_beta1(k), 1e-15) << "step " << k;
    EXPECT_EQ(betas[i].second, 0.99) << "step " << k;
  }
}

// The update of each step is AdamW at the expected lr and betas: three OneCycle steps (lr and
// beta1 change every step, beta2 = 0.99 instead of the optimizer's 0.95) against a naive double
// AdamW fed Gpt2Model's gradients at the naive parameters.
TEST(EngineSchedule, OneCycleUpdatesAreAdamWAtTheScheduledLrAndBetas) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Engine e = initialize(make_gpt2_model(cfg), ds(config_with(kOneCycle)), {.seed = 3, .sequence_length = 8});
  Gpt2Model ref(cfg, DType::fp32, 2, 8);
  ref.init_params(3);
  std::map<std::string, std::vector<double>> theta, m, v;
  for (const auto& p : ref.params()) theta[p.spec.name].assign(p.value.as<float>(), p.value.as<float>() + p.value.numel());
  for (int k = 1; k <= 3; ++k) {
    Tokens tk = tokens_for_step(k);
    e.forward(tk.batch());
    e.backward();
    e.step();
    for (const auto& p : ref.params()) {
      const auto& th = theta[p.spec.name];
      for (std::int64_t i = 0; i < p.value.numel(); ++i) p.value.as<float>()[i] = static_cast<float>(th[static_cast<std::size_t>(i)]);
    }
    ref.zero_grad();
    ref.forward(tk.batch().tokens, tk.batch().targets);
    ref.backward(1.0f);
    const double lr = onecycle_lr(k), b1 = onecycle_beta1(k), b2 = 0.99, eps = 1e-6;
    for (const auto& p : ref.params()) {
      auto& th = theta[p.spec.name];
      auto& mm = m[p.spec.name];
      auto& vv = v[p.spec.name];
      mm.resize(th.size(), 0.0);
      vv.resize(th.size(), 0.0);
      const double wd = decays(p.spec.name) ? 0.1 : 0.0;
      for (std::size_t i = 0; i < th.size(); ++i) {
        const double g = p.grad.as<float>()[i];
        th[i] -= lr * wd * th[i];
        mm[i] = b1 * mm[i] + (1 - b1) * g;
        vv[i] = b2 * vv[i] + (1 - b2) * g * g;
        th[i] -= lr * (mm[i] / (1 - std::pow(b1, k))) / (std::sqrt(vv[i] / (1 - std::pow(b2, k))) + eps);
      }
    }
  }
  for (const auto& [name, th] : theta) {
    const Tensor p = e.param(name);
    for (std::size_t i = 0; i < th.size(); ++i) ASSERT_NEAR(p.as<float>()[i], th[i], 2e-6) << name << "[" << i << "]";
  }
}

}  // namespace
}  // namespace dstrain
