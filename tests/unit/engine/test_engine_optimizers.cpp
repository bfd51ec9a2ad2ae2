// SGD and Lamb from the config's "optimizer" block, through the engine, against naive double
// implementations applied to the engine's own gradients: torch.optim.SGD as _single_tensor_sgd
// computes it (momentum buffer cloned from the gradient at step 1, dampening, Nesterov, coupled L2
// weight decay) and the Lamb formula stated in ops/kernels/lamb.h (DeepSpeed FusedLamb: one trust
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
#include "ops/transformer/gpt2_model.h"

#include "engine_test_util.h"

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
    const double scale = e.loss_scale();  // window 1000: no change in these few steps
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
    ASSERT_EQ(e.skipped_steps(), 0);
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

// ops/kernels/lamb.h's formula (eps outside the sqrt, bias correction on), per tensor.
NaiveStep naive_lamb(double lr, double b1, double b2, double eps, double wd, double max_coeff, double min_coeff) {
  auto m = std::make_shared<std::map<std::string, Vec>>();
  auto v = std::make_shared<std::map<std::string, Vec>>();
  return [=](std::map<std::string, Vec>& theta, const std::map<std::string, Vec>& grads, int t) {
    for (auto& [name, th] : theta) {
      const Vec& g = grads.at(name);
      Vec& mm = (*m)[name];
      Vec& vv = (*v)[name];
      mm.resize(th.size(), 0.0);
      vv.resize(th.size(), 0.0);
      const double w = decays(name) ? wd : 0.0;
      Vec u(th.size());
      double w_sq = 0.0, u_sq = 0.0;
      for (std::size_t i = 0; i < th.size(); ++i) {
        mm[i] = b1 * mm[i] + (1 - b1) * g[i];
        vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
        u[i] = mm[i] / (std::sqrt(vv[i]) + eps) + w * th[i];
        w_sq += th[i] * th[i];
        u_sq += u[i] * u[i];
      }
      double coeff = 1.0;
      if (w_sq != 0.0 && u_sq != 0.0) coeff = std::max(std::min(std::sqrt(w_sq) / std::sqrt(u_sq), max_coeff), min_coeff);
      const double step_size = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      for (std::size_t i = 0; i < th.size(); ++i) th[i] -= step_size * coeff * u[i];
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

TEST(EngineOptimizers, LambMatchesTheKernelFormula) {
  compare(R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05, "max_coeff": 10.0, "min_coeff": 0.01}})",
          "", 3, naive_lamb(0.01, 0.9, 0.99, 1e-6, 0.05, 10.0, 0.01), 1e-5);
}

// Under fp16 the master is updated from the scaled 16-bit gradients divided by the loss scale.
TEST(EngineOptimizers, LambAndSgdUnderFp16) {
  compare(R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05}})",
          R"("fp16": {"enabled": true, "initial_scale_power": 10})", 2, naive_lamb(0.01, 0.9, 0.99, 1e-6, 0.05, 10.0, 0.01), 1e-5);
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
