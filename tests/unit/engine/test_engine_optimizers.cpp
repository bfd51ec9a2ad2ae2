// SGD and Lamb from the config's "optimizer" block, through the engine, against naive double
// implementations applied to the engine's own gradients: torch.optim.SGD as _single_tensor_sgd
// computes it (momentum buffer cloned from the gradient at step 1, dampening, Nesterov, coupled L2
// weight decay) and DeepSpeed's FusedLamb transcribed from its Python and CUDA source (one trust
// ratio per parameter tensor, bias correction in the step size). Weight decay applies to the
// parameters the engine's recipe decays (matrices and embeddings), written here independently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_model.h"

#include "engine_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace engine_testing;

using Vec = std::vector<double>;
// One naive update of every parameter tensor (t: 1-based step), from the un-scaled gradients.
using NaiveStep = std::function<void(std::map<std::string, Vec>& theta, const std::map<std::string, Vec>& grads, int t)>;

// Runs `steps` optimizer steps of the engine (micro 2, GAS 2) and of `naive` side by side; the naive
// parameters start from the engine's initial masters and each step uses the engine's gradients,
// divided by the loss scale they carry, and clipped to the default gradient_clipping 1.0 by hand.
// Compares every master after every step.
void compare(const std::string& optimizer_json, const std::string& precision, int steps, const NaiveStep& naive, double rtol) {
  const std::string json = fmt::format(R"({{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "optimizer": {}{}{}}})",
                                       optimizer_json, precision.empty() ? "" : ", ", precision);
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(json), {.seed = 11, .sequence_length = 8});
  std::vector<Tokens> data{random_tokens(2, 8, 61, 1), random_tokens(2, 8, 61, 2)};
  std::map<std::string, Vec> theta;
  for (const auto& n : e.param_names()) theta[n] = widen(e.master_param(n));
  bool clipped = false;
  for (int t = 1; t <= steps; ++t) {
    e.forward(data[0].batch());
    e.backward();
    e.step();
    e.forward(data[1].batch());
    e.backward();
    const double scale = e.state().loss_scale;  // window 1000: no change in these few steps
    std::map<std::string, Vec> grads;
    for (const auto& n : e.param_names()) {
      grads[n] = widen(e.grad(n));
      for (double& g : grads[n]) g /= scale;
    }
    // gradient_clipping (default 1.0, docs/precision.md §7): g *= c / (||g|| + 1e-6) when that is < 1.
    double norm_sq = 0.0;
    for (const auto& [n, g] : grads)
      for (double x : g) norm_sq += x * x;
    const double coef = 1.0 / (std::sqrt(norm_sq) + 1e-6);
    if (coef < 1.0) {
      clipped = true;
      for (auto& [n, g] : grads)
        for (double& x : g) x *= coef;
    }
    e.step();
    ASSERT_EQ(e.state().skipped_steps, 0);
    naive(theta, grads, t);
    for (const auto& n : e.param_names()) {
      const Vec got = widen(e.master_param(n));
      const Vec& want = theta.at(n);
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-7 + rtol * std::fabs(want[i])) << n << "[" << i << "] after step " << t;
      }
    }
  }
  // Make sure both branches of the clip are exercised across the tests.
  if (optimizer_json.find("\"SGD\"") != std::string::npos && precision.empty()) {
    EXPECT_TRUE(clipped) << "SGD runs are meant to clip";
  }
}

// torch.optim.SGD (_single_tensor_sgd), per element.
NaiveStep naive_sgd(double lr, double momentum, double dampening, double wd, bool nesterov) {
  auto buf = std::make_shared<std::map<std::string, Vec>>();
  return [=](std::map<std::string, Vec>& theta, const std::map<std::string, Vec>& grads, int t) {
    for (auto& [name, th] : theta) {
      const Vec& gr = grads.at(name);
      Vec& b = (*buf)[name];
      b.resize(th.size(), 0.0);
      const double w = decays(name) ? wd : 0.0;
      for (std::size_t i = 0; i < th.size(); ++i) {
        double g = gr[i] + w * th[i];
        if (momentum != 0.0) {
          b[i] = t == 1 ? g : momentum * b[i] + (1 - dampening) * g;
          g = nesterov ? g + momentum * b[i] : b[i];
        }
        th[i] -= lr * g;
      }
    }
  };
}

// DeepSpeed's FusedLamb, transcribed from its source (deepspeed/ops/lamb/fused_lamb.py step() and
// csrc/lamb/fused_lamb_cuda_kernel.cu), not from dstrain's kernel, one parameter tensor at a time:
//   fused_lamb.py:  state['step'] += 1; eps_mode = 0 if eps_inside_sqrt else 1 (default 1);
//                   combined_scale = scale (the engine has already un-scaled and clipped: 1 here)
//   fused_lamb_cuda: if bias_correction == 1: bias_correction1 = 1 - pow(beta1, step),
//                    bias_correction2 = 1 - pow(beta2, step), step_size = lr * sqrt(bc2) / bc1
//                    (all `float`), else step_size = lr
//   part1, per j:   scaled_grad = g[j] / grad_scale
//                   m[j] = b1 * m[j] + (1 - b1) * scaled_grad
//                   v[j] = b2 * v[j] + (1 - b2) * scaled_grad * scaled_grad
//                   denom = mode 0 ? sqrtf(v[j] + eps) : sqrtf(v[j]) + eps
//                   update = m[j] / denom + decay * p[j];  reg_u += update²;  reg_w += p[j]²
//   part3:          reg_w = sqrt(w_l2), reg_u = sqrt(u_l2); lamb_coeff = 1.0;
//                   if reg_w != 0 && reg_u != 0: lamb_coeff = reg_w / reg_u, then
//                   if > max_coeff: max_coeff; if < min_coeff: min_coeff
//                   per j: update recomputed from the new m, v and the old p;
//                   p[j] = p[j] - step_size * lamb_coeff * update
// Weight decay goes to the tensors the engine's recipe decays (decays(), written independently).
NaiveStep deepspeed_fused_lamb(double lr, double b1, double b2, double eps, double wd, double max_coeff, double min_coeff,
                               bool eps_inside_sqrt = false, bool bias_correction = true) {
  auto m = std::make_shared<std::map<std::string, Vec>>();
  auto v = std::make_shared<std::map<std::string, Vec>>();
  auto steps = std::make_shared<std::map<std::string, int>>();
  return [=](std::map<std::string, Vec>& theta, const std::map<std::string, Vec>& grads, int /*t*/) {
    const int mode = eps_inside_sqrt ? 0 : 1;
    const double grad_scale = 1.0;  // combined_scale: un-scaling and clipping happened before (compare())
    for (auto& [name, p] : theta) {
      const Vec& g = grads.at(name);
      Vec& exp_avg = (*m)[name];
      Vec& exp_avg_sq = (*v)[name];
      exp_avg.resize(p.size(), 0.0);
      exp_avg_sq.resize(p.size(), 0.0);
      const int step = ++(*steps)[name];
      const double decay = decays(name) ? wd : 0.0;
      double step_size = lr;
      if (bias_correction) {
        const float bias_correction1 = 1.0f - static_cast<float>(std::pow(static_cast<float>(b1), step));
        const float bias_correction2 = 1.0f - static_cast<float>(std::pow(static_cast<float>(b2), step));
        step_size = static_cast<float>(lr) * std::sqrt(bias_correction2) / bias_correction1;
      }
      const auto denom_of = [&](double vj) { return mode == 0 ? std::sqrt(vj + eps) : std::sqrt(vj) + eps; };
      // part1
      double reg_w = 0.0, reg_u = 0.0;
      for (std::size_t j = 0; j < p.size(); ++j) {
        const double scaled_grad = g[j] / grad_scale;
        exp_avg[j] = b1 * exp_avg[j] + (1 - b1) * scaled_grad;
        exp_avg_sq[j] = b2 * exp_avg_sq[j] + (1 - b2) * scaled_grad * scaled_grad;
        const double update = exp_avg[j] / denom_of(exp_avg_sq[j]) + decay * p[j];
        reg_u += update * update;
        reg_w += p[j] * p[j];
      }
      // part3
      reg_w = std::sqrt(reg_w);
      reg_u = std::sqrt(reg_u);
      double lamb_coeff = 1.0;
      if (reg_w != 0 && reg_u != 0) {
        lamb_coeff = reg_w / reg_u;
        if (lamb_coeff > max_coeff) lamb_coeff = max_coeff;
        if (lamb_coeff < min_coeff) lamb_coeff = min_coeff;
      }
      for (std::size_t j = 0; j < p.size(); ++j) {
        const double update = exp_avg[j] / denom_of(exp_avg_sq[j]) + decay * p[j];
        p[j] = p[j] - step_size * lamb_coeff * update;
      }
    }
  };
}

TEST(EngineOptimizers, SgdPlainMatchesTorch) {
  compare(R"({"type": "SGD", "params": {"lr": 0.1, "weight_decay": 0.01}})", "", 3, naive_sgd(0.1, 0.0, 0.0, 0.01, false), 1e-5);
}

TEST(EngineOptimizers, SgdMomentumDampeningMatchesTorch) {
  compare(R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01}})", "", 3,
          naive_sgd(0.1, 0.9, 0.2, 0.01, false), 1e-5);
}

TEST(EngineOptimizers, SgdNesterovMatchesTorch) {
  compare(R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}})", "", 3, naive_sgd(0.1, 0.9, 0.0, 0.0, true), 1e-5);
}

TEST(EngineOptimizers, LambMatchesDeepSpeedFusedLamb) {
  compare(
      R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05, "max_coeff": 10.0, "min_coeff": 0.01}})",
      "", 3, deepspeed_fused_lamb(0.01, 0.9, 0.99, 1e-6, 0.05, 10.0, 0.01), 1e-5);
}

// Under fp16 the master is updated from the scaled 16-bit gradients divided by the loss scale.
// FusedLamb's other modes: eps inside the square root (eps_mode 0) and no bias correction
// (step_size = lr); eps 1e-3 so that where it sits changes the update well above the tolerance.
TEST(EngineOptimizers, LambEpsInsideSqrtWithoutBiasCorrectionMatchesDeepSpeed) {
  compare(R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-3, "weight_decay": 0.05, "eps_inside_sqrt": true,
              "bias_correction": false}})",
          "", 3, deepspeed_fused_lamb(0.01, 0.9, 0.99, 1e-3, 0.05, 10.0, 0.01, /*eps_inside_sqrt=*/true, /*bias_correction=*/false), 1e-5);
}

TEST(EngineOptimizers, LambAndSgdUnderFp16) {
  compare(R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05}})",
          R"("fp16": {"enabled": true, "initial_scale_power": 10})", 2, deepspeed_fused_lamb(0.01, 0.9, 0.99, 1e-6, 0.05, 10.0, 0.01), 1e-5);
  compare(R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})", R"("bf16": {"enabled": true})", 2, naive_sgd(0.1, 0.9, 0.0, 0.0, false),
          1e-5);
}

TEST(EngineOptimizers, SgdChecksAsTorch) {
  const std::string base = R"({"train_micro_batch_size_per_gpu": 2, "optimizer": )";
  EXPECT_THROW(initialize(make_gpt2_model("gpt2:tiny"), ds(base + R"({"type": "SGD", "params": {"lr": 0.1, "nesterov": true}}})"),
                          {.sequence_length = 8}),
               Error);
  EXPECT_THROW(initialize(make_gpt2_model("gpt2:tiny"),
                          ds(base + R"({"type": "Lamb", "params": {"lr": 0.1}}, "fp16": {"enabled": true, "loss_scale": 128}})"),
                          {.sequence_length = 8}),
               Error);
}

}  // namespace
}  // namespace dstrain
