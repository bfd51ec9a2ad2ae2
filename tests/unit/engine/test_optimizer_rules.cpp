// The element-wise optimizers of docs/optimizers.md (Adagrad, Lion, RMSprop, Adamax, NAdam, RAdam,
// Adadelta, ASGD, Rprop), built from a config's "optimizer" block exactly as the engine builds them,
// stepped 12 times on fixed gradients and compared with PyTorch's own torch.optim class run by
// torch_optimizer_reference.py (parameters and every per-element state, by torch's state_dict
// name, so state_names() is checked against torch's too). Lion (DeepSpeed's CUDA FusedLion) and the
// options the installed torch predates run an independent float64 implementation in that script.
// Each case sets every non-default option of its type, and weight decay.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "engine/optim/optimizer.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using Json = nlohmann::ordered_json;

struct Case {
  std::string block;    // the "optimizer" block
  bool decayed = true;  // the segment's weight-decay flag (false: torch runs with weight_decay 0)
  float grad_scale = 1.0f;
};

const std::vector<Case> kCases = {
    {R"({"type": "Adagrad", "params": {"lr": 0.1}})"},
    {R"({"type": "adagrad", "params": {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-6,
        "maximize": true}})"},
    {R"({"type": "Adagrad", "params": {"lr": 0.1}})", true, 0.5f},
    {R"({"type": "Lion", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.5}})"},
    {R"({"type": "lion", "params": {}})"},
    {R"({"type": "RMSprop", "params": {}})"},
    {R"({"type": "RMSprop", "params": {"lr": 1e-3, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "momentum": 0.9, "centered": true,
        "maximize": true}})"},
    {R"({"type": "RMSprop", "params": {"momentum": 0.5, "weight_decay": 0.1}})", false},
    {R"({"type": "RMSprop", "params": {"centered": true, "foreach": false}})"},
    {R"({"type": "Adamax", "params": {}})"},
    {R"({"type": "Adamax", "params": {"lr": 1e-2, "betas": [0.8, 0.9], "eps": 1e-4, "weight_decay": 0.1, "maximize": true}})"},
    {R"({"type": "NAdam", "params": {}})"},
    {R"({"type": "NAdam", "params": {"lr": 1e-2, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1, "momentum_decay": 0.01}})"},
    {R"({"type": "NAdam", "params": {"weight_decay": 0.1, "decoupled_weight_decay": true, "maximize": true}})"},
    {R"({"type": "RAdam", "params": {}})"},
    {R"({"type": "RAdam", "params": {"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.1}})"},
    {R"({"type": "RAdam", "params": {"weight_decay": 0.1, "decoupled_weight_decay": true, "maximize": true}})"},
    {R"({"type": "Adadelta", "params": {}})"},
    {R"({"type": "Adadelta", "params": {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1, "maximize": true}})"},
    {R"({"type": "ASGD", "params": {}})"},
    {R"({"type": "ASGD", "params": {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 3, "weight_decay": 0.1, "maximize": true}})"},
    {R"({"type": "Rprop", "params": {}})"},
    {R"({"type": "Rprop", "params": {"lr": 0.05, "etas": [0.3, 1.5], "step_sizes": [0.01, 0.08], "maximize": true}})"},
};

constexpr int kSteps = 12;
constexpr std::int64_t kN = 37;

config::OptimizerConfig optimizer_config(const std::string& block) {
  return config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": )" + block + "}"), {}).optimizer;
}

Tensor f32(std::vector<float>& v) { return Tensor(v.data(), DType::fp32, Shape{static_cast<std::int64_t>(v.size())}); }

TEST(OptimizerRules, MatchTorch) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_optimizer_rules." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Json cases = Json::array();
  std::vector<std::vector<float>> finals;
  std::vector<std::vector<std::vector<float>>> final_states;
  std::vector<std::vector<std::string>> names;
  for (const Case& c : kCases) {
    const config::OptimizerConfig oc = optimizer_config(c.block);
    const Optimizer opt(oc);
    std::vector<float> p(kN), p0;
    for (float& x : p) x = u(rng);
    p0 = p;
    names.push_back(opt.state_names());
    std::vector<std::vector<float>> states(names.back().size(), std::vector<float>(kN, 0.0f));
    Json grads = Json::array();
    for (int t = 1; t <= kSteps; ++t) {
      std::vector<float> g(kN);
      for (float& x : g) x = u(rng);
      // torch sees the gradient the engine's grad_scale makes (exact for 0.5).
      std::vector<float> seen(g);
      for (float& x : seen) x *= c.grad_scale;
      grads.push_back(seen);
      OptimizerSegment s;
      s.params = f32(p);
      s.grads = f32(g);
      for (auto& st : states) s.states.push_back(f32(st));
      s.weight_decay = c.decayed;
      opt.update(std::span<const OptimizerSegment>(&s, 1), opt.base_lr(), c.grad_scale, t);
    }
    Json block = Json::parse(c.block);
    if (!c.decayed) block["params"]["weight_decay"] = 0.0;
    cases.push_back({{"type", block["type"]}, {"params", block["params"]}, {"p0", p0}, {"grads", grads}});
    finals.push_back(p);
    final_states.push_back(states);
  }
  std::ofstream(dir / "cases.json") << cases.dump();
  const std::string cmd = std::string("/usr/bin/python3 ") + DSTRAIN_SOURCE_DIR + "/tests/unit/engine/torch_optimizer_reference.py " +
                          (dir / "cases.json").string() + " " + (dir / "result.json").string();
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "result.json");
  const Json results = Json::parse(in);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(results.size(), kCases.size());
  for (std::size_t i = 0; i < kCases.size(); ++i) {
    SCOPED_TRACE(kCases[i].block + " (reference: " + results[i]["source"].get<std::string>() + ")");
    const Json& r = results[i];
    // Exactly torch's per-element states, in torch's order.
    std::vector<std::string> torch_names;
    for (const auto& [k, v] : r["states"].items()) torch_names.push_back(k);
    EXPECT_EQ(names[i], torch_names);
    const auto expect_close = [](const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
      ASSERT_EQ(got.size(), want.size()) << what;
      for (std::size_t e = 0; e < got.size(); ++e) {
        EXPECT_NEAR(got[e], want[e], 2e-5 + 1e-4 * std::abs(want[e])) << what << "[" << e << "]";
        if (::testing::Test::HasFailure()) return;
      }
    };
    expect_close(finals[i], r["params"].get<std::vector<double>>(), "params");
    for (std::size_t j = 0; j < names[i].size() && j < torch_names.size(); ++j) {
      if (names[i][j] != torch_names[j]) continue;
      expect_close(final_states[i][j], r["states"][torch_names[j]].get<std::vector<double>>(), names[i][j]);
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// The defaults of each type are torch's (FusedLion's for Lion), and the checks torch's constructor
// makes are errors naming the key.
TEST(OptimizerRules, DefaultsAndChecks) {
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Adagrad"})").params.lr, 1e-2);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Adagrad"})").params.eps, 1e-10);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Lion"})").params.lr, 1e-3);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Lion"})").params.betas.second, 0.999);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "RMSprop"})").params.alpha, 0.99);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "ASGD"})").params.alpha, 0.75);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Adamax"})").params.lr, 2e-3);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "NAdam"})").params.momentum_decay, 4e-3);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Adadelta"})").params.lr, 1.0);
  EXPECT_DOUBLE_EQ(optimizer_config(R"({"type": "Adadelta"})").params.eps, 1e-6);
  EXPECT_EQ(Optimizer(optimizer_config(R"({"type": "RMSprop", "params": {"momentum": 0.9, "centered": true}})")).state_names(),
            (std::vector<std::string>{"square_avg", "momentum_buffer", "grad_avg"}));
  // "betas" is a key of torch's defaults for these only (OneCycle's cycle_momentum needs it).
  for (const char* t : {"Lion", "Adamax", "NAdam", "RAdam", "AdamW"})
    EXPECT_TRUE(Optimizer(optimizer_config(std::string(R"({"type": ")") + t + "\"}")).has_betas()) << t;
  for (const char* t : {"Adagrad", "RMSprop", "Adadelta", "ASGD", "Rprop", "SGD"})
    EXPECT_FALSE(Optimizer(optimizer_config(std::string(R"({"type": ")") + t + "\"}")).has_betas()) << t;
  const auto error_of = [](const std::string& block) {
    try {
      Optimizer o(optimizer_config(block));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(error_of(R"({"type": "Rprop", "params": {"etas": [1.5, 0.5]}})").find("etaminus"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "Adagrad", "params": {"lr_decay": -1}})").find("lr_decay"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "RMSprop", "params": {"betas": [0.9, 0.9]}})").find("RMSprop does not take a parameter named \"betas\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "rmsprop"})").find("did you mean \"RMSprop\""), std::string::npos);
}

// The names DeepSpeed builds but cannot train a dense model without μP base shapes with
// (docs/optimizers.md §10): refused before step 1, by check_engine_trains (check-config) as by the
// engine, with DeepSpeed's reason and the fix; any case for mup's names (DeepSpeed's own).
TEST(OptimizerRules, NamesDeepSpeedFailsWithAreRefusedWithItsReason) {
  const auto error_of = [](const std::string& type) {
    try {
      check_engine_trains(
          config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": {"type": ")" + type + R"(", "params": {"lr": 1e-3}}})"),
                                  {}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"SparseAdam", {"SparseAdam does not support dense gradients, please consider Adam instead", "use \"Adam\""}},
      {"LBFGS", {"step() missing 1 required positional argument: 'closure'", "first-order optimizer"}},
      {"MuAdam", {"mup.set_base_shapes", "does not have `infshape` attribute", "use \"Adam\""}},
      {"muadamw", {"mup.set_base_shapes", "use \"AdamW\""}},
      {"MuSGD", {"mup.set_base_shapes", "use \"SGD\""}},
  };
  for (const auto& [type, phrases] : cases) {
    const std::string e = error_of(type);
    EXPECT_NE(e.find("optimizer.type \"" + type + "\""), std::string::npos) << e;
    for (const std::string& ph : phrases) EXPECT_NE(e.find(ph), std::string::npos) << type << ": " << e;
    // The config layer keeps the block and says the same in its warning.
    const config::DsConfig c =
        config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": {"type": ")" + type + R"("}})"), {});
    bool warned = false;
    for (const auto& w : c.warnings) warned = warned || w.message.find(phrases.front()) != std::string::npos;
    EXPECT_TRUE(warned) << type;
  }
}

}  // namespace
}  // namespace dstrain
