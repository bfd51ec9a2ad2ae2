// Muon (docs/optimizers.md §9): DeepSpeed's MuonWithAuxAdam as the engine builds it from a config.
// - MatchesDeepSpeedAlgorithm: Optimizer::step on a partition of GPT-2-named tensors (Muon matrices
//   cut across optimizer sub-groups, Adam vectors and embeddings), 1 and several steps, against
//   muon_reference.py (DeepSpeed's muon_update / zeropower_via_newtonschulz5 / adam_update in
//   float64): parameters, momentum buffers and Adam moments.
// - NewtonSchulz: the op against the iteration written out in double here, tall and wide.
// - ZeRO 1-3 on 2 ranks equals stage 0 on one rank; a checkpoint resumes bit for bit and reshards.
// - The config: defaults, muon_lr / adam_lr, ns_method, ignored keys, DeepSpeed's refusals.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/engine.h"
#include "models/gpt2/gpt2_family.h"
#include "train/memory_estimate.h"
#include "engine/optim/muon.h"
#include "engine/optim/optimizer.h"
#include "ops/error.h"
#include "host_partition.h"
#include "ops/kernels/newton_schulz.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using Json = nlohmann::ordered_json;
using namespace zero_testing;
using testing_partition::HostPartition;

config::OptimizerConfig optimizer_config(const std::string& block) {
  return config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": )" + block + "}"), {}).optimizer;
}

// hf_transposed: Hugging Face holds the matrix as (in, out), as GPT-2's Conv1D weights.
ParamSpec spec(const std::string& name, Shape shape, bool decay, std::int64_t init_rows = -1, bool hf_transposed = false) {
  ParamSpec p{name, shape, ParamInit::normal(0.02f, init_rows), decay, {}, {}, false};
  p.hf_transposed = hf_transposed;
  return p;
}

// GPT-2 names: wte (padded rows 10, real vocabulary 9) and the Conv1D matrices are Muon's by
// DeepSpeed's rule; "embed" / "lm_head" names, the norm weight and the bias are Adam's.
std::vector<ParamSpec> test_specs() {
  return {spec("wte.weight", Shape{10, 6}, true, 9),
          spec("h.0.attn.c_attn.weight", Shape{18, 6}, true, -1, true),
          spec("h.0.mlp.c_proj.weight", Shape{6, 24}, true, -1, true),
          spec("model.embed_tokens.weight", Shape{8, 6}, true),
          spec("lm_head.weight", Shape{8, 6}, true),
          spec("h.0.ln_1.weight", Shape{6}, false),
          spec("h.0.mlp.c_fc.bias", Shape{24}, false)};
}

std::int64_t part_cut(const std::vector<ParamSpec>& specs, std::size_t k, std::int64_t inside) {
  std::int64_t o = 0;
  for (std::size_t i = 0; i < k; ++i) o += specs[i].shape.numel();
  return o + inside;
}

TEST(Muon, WhichParametersAndScale) {
  const std::vector<ParamSpec> s = test_specs();
  const MuonTensor wte = muon_tensor_of(s[0]), attn = muon_tensor_of(s[1]), proj = muon_tensor_of(s[2]);
  EXPECT_TRUE(wte.muon);
  EXPECT_DOUBLE_EQ(wte.scale, std::sqrt(9.0 / 6.0));  // the real vocabulary's rows
  EXPECT_TRUE(attn.muon);
  EXPECT_DOUBLE_EQ(attn.scale, 1.0);  // HF Conv1D (6, 18)
  EXPECT_TRUE(proj.muon);
  EXPECT_DOUBLE_EQ(proj.scale, 2.0);  // HF Conv1D (24, 6)
  for (std::size_t k = 3; k < s.size(); ++k) EXPECT_FALSE(muon_tensor_of(s[k]).muon) << s[k].name;
  EXPECT_TRUE(muon_tensor_of(spec("model.layers.0.mlp.up_proj.weight", Shape{24, 6}, true)).muon);
  EXPECT_DOUBLE_EQ(muon_tensor_of(spec("model.layers.0.mlp.up_proj.weight", Shape{24, 6}, true)).scale, 2.0);  // nn.Linear: ours
  EXPECT_FALSE(muon_tensor_of(spec("transformer.EMBED.weight", Shape{4, 4}, true)).muon);                      // lower-cased
}

struct Case {
  std::string block;
  int steps;
  float grad_scale;
};

TEST(Muon, MatchesDeepSpeedAlgorithm) {
  const std::vector<Case> cases = {
      {R"({"type": "Muon", "params": {"lr": 0.02, "weight_decay": 0.1}})", 1, 1.0f},
      {R"({"type": "Muon", "params": {"lr": 0.02, "weight_decay": 0.1}})", 6, 0.5f},
      {R"({"type": "muon", "params": {"muon_lr": 0.05, "adam_lr": 1e-3, "momentum": 0.9, "betas": [0.8, 0.99], "eps": 1e-8,
          "weight_decay": 0.01, "ns_method": "standard"}})",
       5, 1.0f},
      {R"({"type": "MUON"})", 3, 1.0f},
  };
  const std::vector<ParamSpec> specs = test_specs();
  std::vector<MuonTensor> tensors;
  for (const ParamSpec& s : specs) tensors.push_back(muon_tensor_of(s));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Json jcases = Json::array();
  std::vector<HostPartition> finals;
  for (const Case& c : cases) {
    const config::OptimizerConfig oc = optimizer_config(c.block);
    Optimizer opt(oc);
    opt.set_muon_tensors(tensors);
    // Sub-group cuts inside c_attn and inside lm_head.
    HostPartition part(specs, {part_cut(specs, 1, 50), part_cut(specs, 4, 20)});
    for (float& x : part.params) x = u(rng);
    Json jt = Json::array();
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const std::int64_t b = part.offset(k), n = specs[k].shape.numel();
      std::vector<std::int64_t> shape, scale_shape;
      for (int d = 0; d < specs[k].shape.rank; ++d) shape.push_back(specs[k].shape[d]);
      scale_shape = shape;
      if (k == 0) scale_shape = {9, 6};
      if (k == 1) scale_shape = {6, 18};
      if (k == 2) scale_shape = {24, 6};
      jt.push_back({{"shape", shape},
                    {"muon", tensors[k].muon},
                    {"scale_shape", scale_shape},
                    {"decay", specs[k].weight_decay},
                    {"p0", std::vector<float>(part.params.begin() + b, part.params.begin() + b + n)}});
    }
    Json steps = Json::array();
    for (int t = 1; t <= c.steps; ++t) {
      for (float& x : part.grads) x = u(rng);
      Json per = Json::array();
      for (std::size_t k = 0; k < specs.size(); ++k) {
        const std::int64_t b = part.offset(k), n = specs[k].shape.numel();
        std::vector<float> seen(part.grads.begin() + b, part.grads.begin() + b + n);
        for (float& x : seen) x *= c.grad_scale;  // exact for 0.5
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
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dstrain_muon." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "cases.json") << jcases.dump();
  const std::string cmd = std::string("/usr/bin/python3 ") + DSTRAIN_SOURCE_DIR + "/tests/unit/engine/muon_reference.py " +
                          (dir / "cases.json").string() + " " + (dir / "result.json").string();
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "/usr/bin/python3 has no torch (apt-get install python3-torch)";
  ASSERT_EQ(rc, 0) << cmd;
  std::ifstream in(dir / "result.json");
  const Json results = Json::parse(in);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(results.size(), cases.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].block + " steps " + std::to_string(cases[i].steps));
    const HostPartition& got = finals[i];
    for (std::size_t k = 0; k < specs.size(); ++k) {
      SCOPED_TRACE(specs[k].name);
      const std::int64_t b = got.offset(k);
      const auto check = [&](const std::vector<float>& mine, const char* key) {
        const std::vector<double> want = results[i][k][key].get<std::vector<double>>();
        for (std::size_t e = 0; e < want.size(); ++e) {
          const double d = std::abs(mine[static_cast<std::size_t>(b) + e] - want[e]);
          worst = std::max(worst, d);
          ASSERT_LE(d, 2e-6 + 1e-5 * std::abs(want[e])) << key << "[" << e << "]: " << mine[static_cast<std::size_t>(b) + e] << " vs " << want[e];
        }
      };
      check(got.params, "param");
      check(got.m, "m");
      check(got.v, "v");
    }
  }
  if (std::getenv("DSTRAIN_MUON_VERBOSE") != nullptr) std::printf("MEASURE muon vs float64 reference: max |diff| %.3g\n", worst);
}

// The op against the iteration written out here in double (tall, wide, square; one zero matrix).
TEST(Muon, NewtonSchulz) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{{7, 19}, {19, 7}, {12, 12}, {1, 5}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    std::vector<float> g(static_cast<std::size_t>(rows * cols));
    for (float& x : g) x = nd(rng);
    // Reference: X (n x m, n <= m) in double.
    const bool tall = rows > cols;
    const int n = std::min(rows, cols), mm = std::max(rows, cols);
    std::vector<double> X(static_cast<std::size_t>(n * mm));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < mm; ++j)
        X[static_cast<std::size_t>(i * mm + j)] = tall ? g[static_cast<std::size_t>(j * cols + i)] : g[static_cast<std::size_t>(i * cols + j)];
    double sq = 0.0;
    for (double x : X) sq += x * x;
    for (double& x : X) x /= std::sqrt(sq) + 1e-7;
    for (int s = 0; s < 5; ++s) {
      std::vector<double> A(static_cast<std::size_t>(n * n), 0.0), B(static_cast<std::size_t>(n * n), 0.0), Y(X.size(), 0.0);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          for (int k = 0; k < mm; ++k)
            A[static_cast<std::size_t>(i * n + j)] += X[static_cast<std::size_t>(i * mm + k)] * X[static_cast<std::size_t>(j * mm + k)];
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          double aa = 0.0;
          for (int k = 0; k < n; ++k) aa += A[static_cast<std::size_t>(i * n + k)] * A[static_cast<std::size_t>(k * n + j)];
          B[static_cast<std::size_t>(i * n + j)] = -4.7750 * A[static_cast<std::size_t>(i * n + j)] + 2.0315 * aa;
        }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < mm; ++j) {
          double bx = 0.0;
          for (int k = 0; k < n; ++k) bx += B[static_cast<std::size_t>(i * n + k)] * X[static_cast<std::size_t>(k * mm + j)];
          Y[static_cast<std::size_t>(i * mm + j)] = 3.4445 * X[static_cast<std::size_t>(i * mm + j)] + bx;
        }
      X = Y;
    }
    std::vector<float> ws(static_cast<std::size_t>(newton_schulz_workspace_numel(rows, cols)));
    newton_schulz(Tensor(g.data(), DType::fp32, Shape{rows, cols}), Tensor(ws.data(), DType::fp32, Shape{static_cast<std::int64_t>(ws.size())}));
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const double want = tall ? X[static_cast<std::size_t>(c * mm + r)] : X[static_cast<std::size_t>(r * mm + c)];
        ASSERT_NEAR(g[static_cast<std::size_t>(r * cols + c)], want, 1e-5 + 1e-5 * std::abs(want)) << r << "," << c;
      }
  }
  std::vector<float> z(12, 0.0f), ws(static_cast<std::size_t>(newton_schulz_workspace_numel(3, 4)));
  newton_schulz(Tensor(z.data(), DType::fp32, Shape{3, 4}), Tensor(ws.data(), DType::fp32, Shape{static_cast<std::int64_t>(ws.size())}));
  for (float x : z) EXPECT_EQ(x, 0.0f);
  EXPECT_THROW(newton_schulz(Tensor(z.data(), DType::fp32, Shape{12}), Tensor(ws.data(), DType::fp32, Shape{static_cast<std::int64_t>(ws.size())})),
               Error);
  EXPECT_THROW(newton_schulz(Tensor(z.data(), DType::fp32, Shape{3, 4}), Tensor(ws.data(), DType::fp32, Shape{3})), Error);
}

// The Adam group's lr under a schedule (Optimizer::set_schedule_sets_every_group): a schedule that
// writes one lr into every group (WarmupLR, ...) gives it the step's lr; otherwise it keeps its own
// adam_lr scaled by the schedule's ratio lr / muon_lr. Adam's first step moves each element by
// adam_lr (|m̂| / √v̂ = 1, eps 1e-10 is below fp32 resolution here).
TEST(Muon, AdamGroupLrUnderSchedules) {
  const std::vector<ParamSpec> specs = {spec("h.0.ln_1.weight", Shape{8}, false)};
  for (const bool every : {false, true}) {
    Optimizer opt(optimizer_config(R"({"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 0.001}})"));
    opt.set_parameters(specs);
    opt.set_schedule_sets_every_group(every);
    HostPartition part(specs, {});
    for (std::size_t i = 0; i < part.grads.size(); ++i) part.grads[i] = i % 2 == 0 ? 0.5f : -0.25f;
    const double lr = 0.01;  // the schedule's value for this step: half of muon_lr
    opt.step(part, lr, 1.0f, 1);
    const double want = every ? lr : 0.001 * (lr / 0.02);
    for (std::size_t i = 0; i < part.params.size(); ++i)
      EXPECT_NEAR(std::abs(part.params[i]), want, 1e-9) << (every ? "every group" : "ratio") << " element " << i;
  }
}

// engine.py's two param groups: muon_lr / adam_lr override lr, MuonWithAuxAdam's defaults fill
// the rest; other keys are ignored with a warning; ns_method is checked as its assert does.
TEST(Muon, ConfigGroups) {
  const config::OptimizerParams d = optimizer_config(R"({"type": "Muon"})").params;
  EXPECT_DOUBLE_EQ(d.lr, 0.02);
  EXPECT_DOUBLE_EQ(d.adam_lr, 3e-4);
  EXPECT_DOUBLE_EQ(d.momentum, 0.95);
  EXPECT_DOUBLE_EQ(d.betas.first, 0.9);
  EXPECT_DOUBLE_EQ(d.betas.second, 0.95);
  EXPECT_DOUBLE_EQ(d.eps, 1e-10);
  EXPECT_DOUBLE_EQ(d.weight_decay, 0.0);
  EXPECT_EQ(d.ns_method, "gram");
  const config::OptimizerParams l = optimizer_config(R"({"type": "muon", "params": {"lr": 0.01}})").params;
  EXPECT_DOUBLE_EQ(l.lr, 0.01);
  EXPECT_DOUBLE_EQ(l.adam_lr, 0.01);
  const config::OptimizerParams o = optimizer_config(R"({"type": "Muon", "params": {"lr": 0.01, "muon_lr": 0.03, "adam_lr": 1e-4}})").params;
  EXPECT_DOUBLE_EQ(o.lr, 0.03);
  EXPECT_DOUBLE_EQ(o.adam_lr, 1e-4);
  const config::DsConfig c =
      config::parse_ds_config(config::Json::parse(
                                  R"({"train_batch_size": 1, "optimizer": {"type": "Muon", "params": {"lr": 0.01, "nesterov": false}}})"),
                              {});
  bool warned = false;
  for (const auto& w : c.warnings) warned = warned || (w.message.find("nesterov is ignored") != std::string::npos);
  EXPECT_TRUE(warned);
  const auto error_of = [](const std::string& json) {
    try {
      check_engine_trains(config::parse_ds_config(config::Json::parse(json), {}));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon", "params": {"ns_method": "svd"}}})").find("ns_method must be one of"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon", "params": {"max_grad_norm": 1.0}}})").find("gradient_clipping"),
            std::string::npos);
  // Trained at every stage (stage 3 and offload as DeepSpeed allows them: reduce_scatter off).
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}})"), "<no error>");
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 2}})"), "<no error>");
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 3, "reduce_scatter": false}})"),
            "<no error>");
  EXPECT_EQ(error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 2, "reduce_scatter": false,
                        "offload_optimizer": {"device": "cpu"}}})"),
            "<no error>");
  // DeepSpeed's refusals: stage3.py, and stage_1_and_2.py with optimizer offload.
  const std::string s3 = error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 3}})");
  EXPECT_NE(s3.find("Muon and reduce scatter cannot be used together"), std::string::npos) << s3;
  EXPECT_NE(s3.find("reduce_scatter to false"), std::string::npos) << s3;
  const std::string s1 = error_of(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}, "zero_optimization": {"stage": 1,
                                     "offload_optimizer": {"device": "cpu"}}})");
  EXPECT_NE(s1.find("Muon with reduce scatter does not support optimizer offload"), std::string::npos) << s1;
  // On ZeRO's tested list (no zero_allow_untested_optimizer needed).
  EXPECT_TRUE(optimizer_config(R"({"type": "Muon"})").zero_tested());
  // Stage 0: DeepSpeed's plain steps are named in a warning.
  bool stage0 = false;
  for (const auto& w : config::parse_ds_config(config::Json::parse(R"({"train_batch_size": 1, "optimizer": {"type": "Muon"}})"), {}).warnings)
    stage0 = stage0 || w.message.find("plain gradient at stage 0") != std::string::npos;
  EXPECT_TRUE(stage0);
}

// ZeRO 1-3 on 2 ranks (matrices cut across ranks and sub-groups, each gathered whole for
// Newton-Schulz) equals stage 0 on one rank fed the same global batch.
class MuonZero : public ::testing::TestWithParam<std::tuple<int, Precision>> {};

RunSpec muon_spec(int stage, int world, int gas, Precision p) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = gas;
  s.precision = p;
  s.steps = 5;
  s.knobs.reduce_bucket_size = 3000;
  s.knobs.allgather_bucket_size = 5000;
  s.knobs.prefetch_bucket_size = 5000;
  s.knobs.sub_group_size = 4000;
  s.knobs.reduce_scatter = false;  // stage 3 refuses it with Muon
  s.knobs.optimizer_json = R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "weight_decay": 0.1}})";
  return s;
}

TEST_P(MuonZero, ShardedEqualsOneRank) {
  const auto [stage, prec] = GetParam();
  const RunResult run = run_zero(muon_spec(stage, 2, 1, prec));
  const RunResult ref = run_zero(muon_spec(0, 1, 2, prec));
  RunSpec init_spec = muon_spec(0, 1, 1, prec);
  init_spec.steps = 0;
  const RunResult init = run_zero(init_spec);
  ASSERT_EQ(run.ranks[1].params, run.r0().params);
  const Tolerance tol = tolerance(prec);
  ASSERT_EQ(run.r0().losses.size(), ref.r0().losses.size());
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
    std::printf("MEASURE Muon stage %d %s: abs %.3g upd_rel %.3g all_upd_rel %.3g moved %.3g\n", stage, precision_name(prec), d.max_abs,
                d.max_update_rel, d.update_rel, moved.max_abs);
}

INSTANTIATE_TEST_SUITE_P(Stages, MuonZero,
                         ::testing::Values(std::tuple{1, Precision::fp32}, std::tuple{2, Precision::fp32}, std::tuple{3, Precision::fp32},
                                           std::tuple{2, Precision::bf16}, std::tuple{3, Precision::fp16}),
                         [](const auto& p) { return fmt::format("Stage{}_{}", std::get<0>(p.param), precision_name(std::get<1>(p.param))); });

// Optimizer offload (stage 2, reduce_scatter off as DeepSpeed requires with Muon): the step runs on
// the host partition and gives the same bits as on the device partition.
TEST(Muon, OptimizerOffloadSameBits) {
  RunSpec s = muon_spec(2, 2, 1, Precision::bf16);
  s.steps = 3;
  const RunResult device = run_zero(s);
  s.knobs.zero_extra_json = R"("offload_optimizer": {"device": "cpu"})";
  const RunResult host = run_zero(s);
  EXPECT_EQ(host.r0().losses, device.r0().losses);
  EXPECT_EQ(host.r0().params, device.r0().params);
}

// Muon's optimizer bytes are AdamW's: two fp32 states per element (engine/optim/muon.h), and the
// pre-flight estimate (train/memory_estimate.h) counts them so.
TEST(Muon, StateBytes) {
  RunSpec s = muon_spec(2, 2, 1, Precision::fp32);
  s.steps = 1;
  const std::uint64_t muon = run_zero(s).r0().report.optimizer_bytes;
  config::ConfigOptions o;
  o.world_size = 2;
  const double muon_estimate =
      estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(s)), o), kT).optimizer;
  s.knobs.optimizer_json.clear();
  EXPECT_EQ(muon, run_zero(s).r0().report.optimizer_bytes);
  const double adamw_estimate =
      estimate_rank_memory(Gpt2Architecture(model_config(0.0f)), config::parse_ds_config(config::Json::parse(zero_config_json(s)), o), kT).optimizer;
  EXPECT_GT(muon_estimate, 0.0);
  EXPECT_EQ(muon_estimate, adamw_estimate);
}

}  // namespace
}  // namespace dstrain
