// Adafactor (docs/optimizers.md §10): torch.optim.Adafactor as DeepSpeed builds it for
// "type": "Adafactor" (torch >= 2.5).
// - MatchesTorchAlgorithm: Optimizer::step on a partition with matrices cut across optimizer
//   sub-groups and vectors, 1 and several steps, against adafactor_reference.py (torch's
//   _single_tensor_adafactor in float64): parameters, row and column factors, variances.
// - ZeRO 1-3 on 2 ranks equals stage 0 on one rank (the whole-tensor RMS and the factors' row and
//   column sums are partial sums all-reduced across the ranks).
// - The config: torch's defaults, the (eps1, eps2) pair, its constructor checks, the whitelist.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/optim/adafactor.h"
#include "engine/engine.h"
#include "engine/optim/optimizer.h"
#include "host_partition.h"
#include "ops/error.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using Json = nlohmann::ordered_json;
using namespace zero_testing;
using testing_partition::HostPartition;

config::OptimizerConfig optimizer_config(const std::string& block) {
  return config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": )" + block + "}"), {}).optimizer;
}

ParamSpec spec(const std::string& name, Shape shape, bool decay) { return {name, shape, ParamInit::normal(0.02f), decay, {}, {}, false}; }

std::vector<ParamSpec> test_specs() {
  return {spec("h.0.attn.c_attn.weight", Shape{6, 10}, true), spec("h.0.mlp.c_fc.weight", Shape{12, 5}, true), spec("wpe.weight", Shape{4, 9}, true),
          spec("h.0.ln_1.weight", Shape{7}, false), spec("h.0.mlp.c_fc.bias", Shape{9}, false)};
}

struct Case {
  std::string block;
  int steps;
  float grad_scale;
};

TEST(Adafactor, MatchesTorchAlgorithm) {
  const std::vector<Case> cases = {
      {R"({"type": "Adafactor"})", 1, 1.0f},
      {R"({"type": "Adafactor"})", 7, 0.5f},
      {R"({"type": "Adafactor", "params": {"lr": 0.05, "beta2_decay": -0.5, "eps": [1e-20, 1e-2], "d": 1.5, "weight_decay": 0.1,
          "maximize": true, "foreach": false}})",
       5, 1.0f},
      {R"({"type": "Adafactor", "params": {"lr": 0.3, "d": 4.0, "weight_decay": 0.01}})", 4, 1.0f},
  };
  const std::vector<ParamSpec> specs = test_specs();
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Json jcases = Json::array();
  std::vector<HostPartition> finals;
  for (const Case& c : cases) {
    Optimizer opt(optimizer_config(c.block));
    opt.set_parameters(specs);
    EXPECT_EQ(opt.state_names(), (std::vector<std::string>{"row_var", "col_var"}));
    HostPartition part(specs, {27, 75, 100});  // inside c_attn, inside c_fc.weight, inside wpe
    for (float& x : part.params) x = u(rng);
    Json jt = Json::array();
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const std::int64_t b = part.offset(k), n = specs[k].shape.numel();
      std::vector<std::int64_t> shape;
      for (int d = 0; d < specs[k].shape.rank; ++d) shape.push_back(specs[k].shape[d]);
      jt.push_back(
          {{"shape", shape}, {"decay", specs[k].weight_decay}, {"p0", std::vector<float>(part.params.begin() + b, part.params.begin() + b + n)}});
    }
    Json steps = Json::array();
    for (int t = 1; t <= c.steps; ++t) {
      for (float& x : part.grads) x = u(rng);
      Json per = Json::array();
      for (std::size_t k = 0; k < specs.size(); ++k) {
        const std::int64_t b = part.offset(k), n = specs[k].shape.numel();
        std::vector<float> seen(part.grads.begin() + b, part.grads.begin() + b + n);
        for (float& x : seen) x *= c.grad_scale;
        per.push_back(seen);
      }
      steps.push_back(per);
      opt.step(part, opt.base_lr(), c.grad_scale, t);
    }
    jcases.push_back({{"params", config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": )" + c.block + "}"), {})
                                     .resolved["optimizer"]["params"]},
                      {"tensors", jt},
                      {"steps", steps}});
    finals.push_back(std::move(part));
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_adafactor." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "cases.json") << jcases.dump();
  const std::string cmd = std::string("/usr/bin/python3 ") + DSTRAIN_SOURCE_DIR + "/tests/unit/engine/adafactor_reference.py " +
                          (dir / "cases.json").string() + " " + (dir / "result.json").string();
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "result.json");
  const Json results = Json::parse(in);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(results.size(), cases.size());
  double worst = 0.0;
  const auto close = [&](double got, double want, const std::string& what) {
    const double d = std::abs(got - want);
    worst = std::max(worst, d);
    ASSERT_LE(d, 1e-6 + 1e-5 * std::abs(want)) << what << ": " << got << " vs " << want;
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].block + " steps " + std::to_string(cases[i].steps));
    const HostPartition& got = finals[i];
    for (std::size_t k = 0; k < specs.size(); ++k) {
      SCOPED_TRACE(specs[k].name);
      const auto b = static_cast<std::size_t>(got.offset(k));
      const Json& r = results[i][k];
      const std::vector<double> p = r["param"].get<std::vector<double>>();
      for (std::size_t e = 0; e < p.size(); ++e) close(got.params[b + e], p[e], "param[" + std::to_string(e) + "]");
      if (specs[k].shape.rank == 2) {
        const std::size_t R = static_cast<std::size_t>(specs[k].shape[0]), C = static_cast<std::size_t>(specs[k].shape[1]);
        const std::vector<double> rv = r["row_var"].get<std::vector<double>>(), cv = r["col_var"].get<std::vector<double>>();
        for (std::size_t a = 0; a < R; ++a) close(got.m[b + a * C], rv[a], "row_var[" + std::to_string(a) + "] at (i, 0)");
        for (std::size_t a = 0; a < C; ++a) close(got.v[b + a], cv[a], "col_var[" + std::to_string(a) + "] at (0, j)");
      } else {
        const std::vector<double> var = r["variance"].get<std::vector<double>>();
        for (std::size_t e = 0; e < var.size(); ++e) close(got.m[b + e], var[e], "variance[" + std::to_string(e) + "]");
      }
    }
  }
  if (std::getenv("DSTRAIN_ADAFACTOR_VERBOSE") != nullptr) std::printf("MEASURE adafactor vs float64 reference: max |diff| %.3g\n", worst);
}

TEST(Adafactor, ConfigAsTorch) {
  const config::OptimizerParams d = optimizer_config(R"({"type": "Adafactor"})").params;
  EXPECT_DOUBLE_EQ(d.lr, 1e-2);
  EXPECT_DOUBLE_EQ(d.beta2_decay, -0.8);
  EXPECT_FALSE(d.eps1.has_value());
  EXPECT_DOUBLE_EQ(d.eps2, 1e-3);
  EXPECT_DOUBLE_EQ(d.clip_threshold, 1.0);
  EXPECT_DOUBLE_EQ(d.weight_decay, 0.0);
  EXPECT_FALSE(Optimizer(optimizer_config(R"({"type": "Adafactor"})")).has_betas());  // OneCycle disables cycle_momentum
  const auto error_of = [](const std::string& json) {
    try {
      check_engine_trains(config::parse_ds_config(config::Json::parse(json), {}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const auto block = [](const std::string& params) {
    return R"({"train_batch_size": 1, "optimizer": {"type": "Adafactor", "params": )" + params + "}}";
  };
  EXPECT_EQ(error_of(block(R"({"eps": [null, 1e-3], "d": 2.0})")), "<no error>");
  EXPECT_NE(error_of(block(R"({"beta2_decay": 0.5})")).find("beta2_decay should be <= 0"), std::string::npos);
  EXPECT_NE(error_of(block(R"({"d": 0.5})")).find("Clipping threshold d should be >= 1"), std::string::npos);
  EXPECT_NE(error_of(block(R"({"eps": [-1, 1e-3]})")).find("epsilon1 should be >= 0"), std::string::npos);
  EXPECT_NE(error_of(block(R"({"eps": 1e-3})")).find("a pair (eps1, eps2)"), std::string::npos);
  EXPECT_NE(error_of(block(R"({"betas": [0.9, 0.99]})")).find("Adafactor does not take a parameter named \"betas\""), std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "adafactor"}})").find("not a supported DeepSpeed Optimizer"),
            std::string::npos);
  // Not on ZeRO's tested list.
  EXPECT_NE(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Adafactor"}, "zero_optimization": {"stage": 2}})")
                .find("untested ZeRO Optimizer"),
            std::string::npos);
}

class AdafactorZero : public ::testing::TestWithParam<int> {};

RunSpec adafactor_spec(int stage, int world, int gas) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = gas;
  s.steps = 5;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.allgather_bucket_size = 5000;
  s.knobs.prefetch_bucket_size = 5000;
  s.knobs.sub_group_size = 4000;
  s.knobs.allow_untested_optimizer = true;
  s.knobs.optimizer_json = R"({"type": "Adafactor", "params": {"lr": 0.05, "weight_decay": 0.1}})";
  return s;
}

TEST_P(AdafactorZero, ShardedEqualsOneRank) {
  const int stage = GetParam();
  const RunResult run = run_zero(adafactor_spec(stage, 2, 1));
  const RunResult ref = run_zero(adafactor_spec(0, 1, 2));
  RunSpec init_spec = adafactor_spec(0, 1, 1);
  init_spec.steps = 0;
  const RunResult init = run_zero(init_spec);
  ASSERT_EQ(run.ranks[1].params, run.r0().params);
  const Tolerance tol = tolerance(Precision::fp32);
  for (std::size_t k = 0; k < ref.r0().losses.size(); ++k)
    EXPECT_LE(std::abs(run.r0().losses[k] - ref.r0().losses[k]), tol.loss_rtol * std::abs(ref.r0().losses[k])) << "step " << k + 1;
  const ParamDiff d = compare_params(run.r0().params, ref.r0().params, init.r0().params, tol.atol, tol.rtol);
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_excess, 1.0) << "worst " << d.worst_element << ": max |diff| " << d.max_abs;
  EXPECT_LE(d.max_update_rel, tol.tensor_update_rel) << "tensor " << d.worst_tensor;
  EXPECT_LE(d.update_rel, tol.update_rel);
  const ParamDiff moved = compare_params(ref.r0().params, init.r0().params, init.r0().params, 1.0, 0.0);
  EXPECT_GT(moved.max_abs, 1e-3);
  if (std::getenv("DSTRAIN_ZERO_EQ_VERBOSE") != nullptr)
    std::printf("MEASURE Adafactor stage %d fp32: abs %.3g upd_rel %.3g all_upd_rel %.3g moved %.3g\n", stage, d.max_abs, d.max_update_rel,
                d.update_rel, moved.max_abs);
}

INSTANTIATE_TEST_SUITE_P(Stages, AdafactorZero, ::testing::Values(1, 2, 3), [](const auto& p) { return "Stage" + std::to_string(p.param); });

}  // namespace
}  // namespace dstrain
