// Sharded equals unsharded for the element-wise optimizers (docs/optimizers.md): each at ZeRO
// stages 0-3 on 2 local ranks gives the losses and parameters of stage 0 on one rank fed the same
// global batch (zero_test_util.h), in fp32 (stages 0-3), fp16 (stages 1, 3; dynamic loss scaling,
// the gradients un-scaled inside the update) and bf16 (stages 2, 3). Their states are
// per element, so each rank updates its partition exactly as the one rank does; only the gradient
// sums' order differs, within test_zero_equivalence.cpp's tolerances — looser for the sign-based
// Lion and Rprop, whose step of ±lr flips where a gradient is a near-cancelling sum. The run is
// 6 steps, so RAdam passes its rectification threshold (ρ_t > 5 from t = 6). The rules outside
// ZeRO's tested list need zero_allow_untested_optimizer at stage >= 1, as in DeepSpeed.
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "models/gpt2/gpt2_family.h"
#include "train/memory_estimate.h"
#include "ops/error.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

struct Rule {
  const char* name;
  const char* json;
  bool sign_based;
};

const Rule kRules[] = {
    {"Adagrad", R"({"type": "Adagrad", "params": {"lr": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.1}})", false},
    {"Lion", R"({"type": "Lion", "params": {"lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1}})", true},
    {"RMSprop", R"({"type": "RMSprop", "params": {"lr": 1e-3, "momentum": 0.9, "centered": true, "weight_decay": 0.1}})", false},
    {"Adamax", R"({"type": "Adamax", "params": {"lr": 1e-2, "weight_decay": 0.1}})", false},
    {"NAdam", R"({"type": "NAdam", "params": {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": true}})", false},
    {"RAdam", R"({"type": "RAdam", "params": {"lr": 1e-2, "weight_decay": 0.1}})", false},
    {"Adadelta", R"({"type": "Adadelta", "params": {"lr": 1.0, "weight_decay": 0.1}})", false},
    {"ASGD", R"({"type": "ASGD", "params": {"lr": 0.05, "t0": 2, "weight_decay": 0.1}})", false},
    {"Rprop", R"({"type": "Rprop", "params": {"lr": 1e-3}})", true},
};

using Combo = std::tuple<int, int, Precision>;  // rule, stage, precision

RunSpec spec(int rule, int stage, int world, int gas, Precision p) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = gas;
  s.precision = p;
  s.steps = 6;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.allgather_bucket_size = 5000;
  s.knobs.prefetch_bucket_size = 5000;
  s.knobs.sub_group_size = 4000;  // several optimizer sub-groups per partition
  s.knobs.optimizer_json = kRules[rule].json;
  s.knobs.allow_untested_optimizer = true;
  return s;
}

class ZeroOptimizerRules : public ::testing::TestWithParam<Combo> {};

TEST_P(ZeroOptimizerRules, ShardedEqualsOneRank) {
  const auto [rule, stage, prec] = GetParam();
  const RunResult run = run_zero(spec(rule, stage, 2, 1, prec));
  const RunResult ref = run_zero(spec(rule, 0, 1, 2, prec));
  RunSpec init_spec = spec(rule, 0, 1, 1, prec);
  init_spec.steps = 0;
  const RunResult init = run_zero(init_spec);
  ASSERT_EQ(run.ranks[1].params, run.r0().params);  // every rank gathers the same parameters
  Tolerance tol = tolerance(prec);
  if (kRules[rule].sign_based) {
    // A flipped sign moves an element by 2·lr per step from then on (measured in fp32: none, the
    // runs are bit-identical; in bf16, where every element steps by exactly ±lr: overall 10.5% of
    // the update for Lion, 8.1% for Rprop; per tensor 35% and 20%).
    tol.atol = 6 * 2 * 1e-3 * 1.5;
    tol.rtol = 0.0;
    tol.tensor_update_rel = std::max(tol.tensor_update_rel, 0.6);
    tol.update_rel = std::max(tol.update_rel, 0.2);
  }
  ASSERT_EQ(run.r0().losses.size(), ref.r0().losses.size());
  for (std::size_t k = 0; k < ref.r0().losses.size(); ++k)
    EXPECT_LE(std::abs(run.r0().losses[k] - ref.r0().losses[k]),
              std::max(tol.loss_rtol, kRules[rule].sign_based ? 1e-4 : 0.0) * std::abs(ref.r0().losses[k]))
        << "step " << k + 1;
  const ParamDiff d = compare_params(run.r0().params, ref.r0().params, init.r0().params, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst " << d.worst_element << ": max |diff| " << d.max_abs;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  EXPECT_LE(d.update_rel, tol.update_rel);
  // Training moved the parameters (the comparison is not of two untouched models).
  const ParamDiff moved = compare_params(ref.r0().params, init.r0().params, init.r0().params, 1.0, 0.0);
  EXPECT_GT(moved.max_abs, 1e-4);
  if (std::getenv("DSTRAIN_ZERO_EQ_VERBOSE") != nullptr) {
    std::printf("MEASURE %s stage %d %s: abs %.3g upd_rel %.3g all_upd_rel %.3g moved %.3g\n", kRules[rule].name, stage, precision_name(prec),
                d.max_abs, d.max_update_rel, d.update_rel, moved.max_abs);
  }
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  const auto [rule, stage, prec] = info.param;
  return fmt::format("{}_Stage{}_{}", kRules[rule].name, stage, precision_name(prec));
}

INSTANTIATE_TEST_SUITE_P(Fp32, ZeroOptimizerRules,
                         ::testing::Combine(::testing::Range(0, 9), ::testing::Values(0, 1, 2, 3), ::testing::Values(Precision::fp32)), combo_name);
INSTANTIATE_TEST_SUITE_P(Fp16, ZeroOptimizerRules,
                         ::testing::Combine(::testing::Range(0, 9), ::testing::Values(1, 3), ::testing::Values(Precision::fp16)), combo_name);
INSTANTIATE_TEST_SUITE_P(Bf16, ZeroOptimizerRules,
                         ::testing::Combine(::testing::Range(0, 9), ::testing::Values(2, 3), ::testing::Values(Precision::bf16)), combo_name);

// DeepSpeed's rule (zero/utils.py ZERO_SUPPORTED_OPTIMIZERS): Adagrad and Lion are on ZeRO's tested
// list; the torch fallbacks need zero_allow_untested_optimizer at stage >= 1, with DeepSpeed's message.
TEST(ZeroOptimizerRulesWhitelist, UntestedNeedsTheFlag) {
  const auto error_of = [](const char* optimizer, int stage, bool allow) {
    try {
      config::ConfigOptions o;
      o.world_size = 1;
      config::parse_ds_config(config::Json::parse(fmt::format(R"({{"train_batch_size": 2, "optimizer": {}, "zero_optimization": {{"stage": {}}},
                                                                 "zero_allow_untested_optimizer": {}}})",
                                                              optimizer, stage, allow)),
                              o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  for (const Rule& r : kRules) {
    SCOPED_TRACE(r.name);
    const bool tested = std::string(r.name) == "Adagrad" || std::string(r.name) == "Lion";
    EXPECT_EQ(error_of(r.json, 0, false), "<no error>");
    EXPECT_EQ(error_of(r.json, 2, true), "<no error>");
    const std::string e = error_of(r.json, 2, false);
    if (tested) {
      EXPECT_EQ(e, "<no error>");
    } else {
      EXPECT_NE(e.find("You are using an untested ZeRO Optimizer. Please add <\"zero_allow_untested_optimizer\": true> in the configuration file "
                       "to use it."),
                std::string::npos)
          << e;
    }
  }
}

}  // namespace
}  // namespace dstrain

namespace dstrain {
namespace {

using namespace zero_testing;

// The partition holds exactly the states each rule declares (docs/training_state.md §1): in fp32
// (the master is the parameter) its optimizer bytes are (states / 2) of AdamW's two moments.
TEST(ZeroOptimizerRulesMemory, HoldsOnlyTheDeclaredStates) {
  const auto bytes = [](const char* json) {
    RunSpec s;
    s.stage = 2;
    s.world = 2;
    s.steps = 1;
    s.knobs.optimizer_json = json;
    s.knobs.allow_untested_optimizer = true;
    return run_zero(s).r0().report.optimizer_bytes;
  };
  const std::uint64_t adam = bytes(R"({"type": "AdamW", "params": {}})");
  ASSERT_GT(adam, 0u);
  const std::pair<const char*, std::uint64_t> cases[] = {{R"({"type": "Lion", "params": {}})", 1},
                                                         {R"({"type": "Adagrad", "params": {}})", 1},
                                                         {R"({"type": "RMSprop", "params": {}})", 1},
                                                         {R"({"type": "RMSprop", "params": {"momentum": 0.9, "centered": true}})", 3},
                                                         {R"({"type": "Rprop", "params": {}})", 2},
                                                         {R"({"type": "ASGD", "params": {}})", 1}};
  for (const auto& [json, states] : cases) EXPECT_EQ(bytes(json) * 2, adam * states) << json;
}

// The pre-flight estimate (train/memory_estimate.h) counts each rule's states: for every rule (and
// RMSprop with one and three states, and SGD with momentum), ZeRO-1 and -2 on 2 ranks, fp32 (the master is the parameter)
// and bf16 (fp32 masters apart), its optimizer bytes are the allocator's.
TEST(ZeroOptimizerRulesMemory, EstimateEqualsTheAllocatorsBytes) {
  std::vector<std::string> jsons;
  for (const Rule& r : kRules) jsons.emplace_back(r.json);
  jsons.emplace_back(R"({"type": "RMSprop", "params": {"lr": 1e-3}})");
  jsons.emplace_back(R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})");  // its momentum buffer
  for (const std::string& json : jsons) {
    for (const Precision p : {Precision::fp32, Precision::bf16}) {
      for (const int stage : {1, 2}) {
        RunSpec s;
        s.stage = stage;
        s.world = 2;
        s.steps = 1;
        s.precision = p;
        s.knobs.optimizer_json = json;
        s.knobs.allow_untested_optimizer = true;
        const ZeroReport report = run_zero(s).r0().report;
        const std::uint64_t held = report.optimizer_bytes;
        config::ConfigOptions o;
        o.world_size = 2;
        const MemoryEstimate e =
            estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(s)), o), kT);
        SCOPED_TRACE(testing::Message() << json << " stage " << stage << " " << precision_name(p));
        EXPECT_GT(held, 0u);
        // The estimate counts Ψ from the model's shape; the partition pads each layer to split
        // evenly (in 16-bit storage to more elements), so compare bytes per padded element.
        EXPECT_DOUBLE_EQ(e.optimizer / e.parameters * static_cast<double>(report.padded_param_elements), static_cast<double>(held));
        if (p == Precision::fp32) {
          EXPECT_EQ(e.optimizer, static_cast<double>(held));  // no padding here
        }
      }
    }
  }
}

}  // namespace
}  // namespace dstrain
