// The engine's step loop against independent computations: Gpt2Model (a separate driver of the same
// layers) for loss and gradients, a naive double-precision AdamW written from PyTorch's AdamW/Adam
// docs for the update, a hand-summed norm for clipping, and the data-order rule for accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "data/byte_tokenizer.h"
#include "data/data_loader.h"
#include "data/token_file.h"
#include "engine/engine.h"
#include "engine/grad_norm.h"
#include "ops/error.h"
#include "models/gpt2/gpt2_model.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/local_communicator.h"

#include "engine_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace engine_testing;

std::string adamw_json(int micro, int gas, double lr, double wd, double clip, double eps = 1e-8, const std::string& type = "AdamW",
                       const std::string& extra_params = "") {
  return fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": {}, "gradient_clipping": {},
    "optimizer": {{"type": "{}", "params": {{"lr": {}, "betas": [0.9, 0.95], "eps": {}, "weight_decay": {}{}}}}}}})",
                     micro, gas, clip, type, lr, eps, wd, extra_params);
}

// One naive double AdamW / Adam step (torch.optim.AdamW and torch.optim.Adam docs), per parameter.
struct NaiveAdam {
  double lr, b1, b2, eps, wd;
  bool decoupled = true;
  std::map<std::string, std::vector<double>> theta, m, v;
  int t = 0;
  bool bias_correction = true;
  void step(const std::map<std::string, std::vector<double>>& grads, double grad_scale = 1.0) {
    ++t;
    for (auto& [name, th] : theta) {
      const auto& g = grads.at(name);
      auto& mm = m[name];
      auto& vv = v[name];
      mm.resize(th.size(), 0.0);
      vv.resize(th.size(), 0.0);
      const double w = decays(name) ? wd : 0.0;
      for (std::size_t i = 0; i < th.size(); ++i) {
        double gi = g[i] * grad_scale;
        if (decoupled)
          th[i] -= lr * w * th[i];
        else
          gi += w * th[i];
        mm[i] = b1 * mm[i] + (1 - b1) * gi;
        vv[i] = b2 * vv[i] + (1 - b2) * gi * gi;
        const double c1 = bias_correction ? 1 - std::pow(b1, t) : 1.0, c2 = bias_correction ? 1 - std::pow(b2, t) : 1.0;
        const double mh = mm[i] / c1, vh = vv[i] / c2;
        th[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
  }
};

std::map<std::string, std::vector<double>> grads_of(const Gpt2Model& m) {
  std::map<std::string, std::vector<double>> g;
  for (const auto& p : m.params()) {
    auto f = values(p.grad);
    g[p.spec.name].assign(f.begin(), f.end());
  }
  return g;
}

// (a) The engine's loss and every gradient are bit-identical to Gpt2Model's: same init (by name and
// seed), same layers, same dropout keys (dropout on, so the keys matter).
TEST(Engine, LossAndGradsBitIdenticalToGpt2Model) {
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  cfg.resid_pdrop = cfg.attn_pdrop = cfg.embd_pdrop = 0.1f;
  Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-3, 0.0, 0.0)), {.seed = 7, .sequence_length = 8});
  Gpt2Model ref(cfg, DType::fp32, 2, 8);
  ref.init_params(7);
  Tokens tk = random_tokens(2, 8, 61, 1, 5);
  const float loss = e.forward(tk.batch());
  e.backward();
  const float ref_loss = ref.forward(tk.batch().tokens, tk.batch().targets, {.train = true, .seed = 7, .step = 0, .micro_batch = 0});
  ref.backward(1.0f);
  EXPECT_EQ(loss, ref_loss);
  EXPECT_GT(loss, 3.0f);
  ASSERT_EQ(e.param_names().size(), ref.params().size());
  for (const auto& p : ref.params()) {
    ASSERT_EQ(values(e.param(p.spec.name)), values(p.value)) << p.spec.name;
    ASSERT_EQ(values(e.grad(p.spec.name)), values(p.grad)) << p.spec.name;
  }
  // The tied head weight is the embedding's storage.
  EXPECT_EQ(e.param("lm_head.weight").data, e.param("wte.weight").data);
}

// (b) Two AdamW steps equal a naive double AdamW fed Gpt2Model's gradients; biases and LayerNorm
// parameters get no decay. Also the L2 form (Adam, adam_w_mode false), and AdamW without bias
// correction (FusedAdam's bias_correction: false).
TEST(Engine, AdamStepsMatchNaiveDoubleAdam) {
  for (const int variant : {0, 1, 2}) {
    const bool decoupled = variant != 1, bias_correction = variant != 2;
    SCOPED_TRACE(variant == 0 ? "AdamW" : variant == 1 ? "Adam, adam_w_mode false" : "AdamW, bias_correction false");
    const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
    // eps 1e-6: the key bias's gradient is zero up to rounding noise (~1e-12; softmax ignores a
    // constant added to every score), and Adam would blow that noise up to lr·noise/(|noise|+eps).
    const std::string json = variant == 0   ? adamw_json(2, 1, 1e-2, 0.1, 0.0, 1e-6)
                             : variant == 1 ? adamw_json(2, 1, 1e-2, 0.1, 0.0, 1e-6, "Adam", R"(, "adam_w_mode": false)")
                                            : adamw_json(2, 1, 1e-2, 0.1, 0.0, 1e-6, "AdamW", R"(, "bias_correction": false)");
    Engine e = initialize(make_gpt2_model(cfg), ds(json), {.seed = 3, .sequence_length = 8});
    Gpt2Model ref(cfg, DType::fp32, 2, 8);
    ref.init_params(3);
    NaiveAdam naive{1e-2, 0.9, 0.95, 1e-6, 0.1, decoupled, {}, {}, {}, 0, bias_correction};
    for (const auto& p : ref.params()) {
      auto f = values(p.value);
      naive.theta[p.spec.name].assign(f.begin(), f.end());
    }
    for (int s = 0; s < 2; ++s) {
      Tokens tk = random_tokens(2, 8, 61, 10 + static_cast<std::uint32_t>(s), 5);
      e.forward(tk.batch());
      e.backward();
      e.step();
      // Reference gradients at the naive parameters (rounded to fp32).
      for (const auto& p : ref.params()) {
        const auto& th = naive.theta[p.spec.name];
        for (std::int64_t i = 0; i < p.value.numel(); ++i) p.value.as<float>()[i] = static_cast<float>(th[static_cast<std::size_t>(i)]);
      }
      ref.zero_grad();
      ref.forward(tk.batch().tokens, tk.batch().targets);
      ref.backward(1.0f);
      naive.step(grads_of(ref));
    }
    EXPECT_EQ(e.state().global_steps, 2);
    EXPECT_EQ(e.state().global_samples, 4);
    double max_move = 0.0;
    for (const auto& [name, th] : naive.theta) {
      const auto got = values(e.param(name));
      for (std::size_t i = 0; i < th.size(); ++i) ASSERT_NEAR(got[i], th[i], 2e-6) << name << "[" << i << "]";
    }
    // The steps really moved the parameters (lr 1e-2, two steps): a test that cannot pass by doing nothing.
    Gpt2Model init(cfg, DType::fp32, 2, 8);
    init.init_params(3);
    for (const auto& p : init.params()) {
      const auto got = values(e.param(p.spec.name)), before = values(p.value);
      for (std::size_t i = 0; i < got.size(); ++i) max_move = std::max(max_move, static_cast<double>(std::abs(got[i] - before[i])));
    }
    EXPECT_GT(max_move, 5e-3);
    // Gradients are zero after the step.
    for (const auto& name : e.param_names())
      for (float g : values(e.grad(name))) ASSERT_EQ(g, 0.0f) << name;
  }
}

// A token file of `n` pseudo-random tokens below V, for data-loader driven tests.
std::filesystem::path token_file(const std::string& name, std::size_t n, std::int32_t V) {
  const auto path = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".bin");
  std::vector<std::int32_t> t(n);
  std::uint32_t s = 99;
  for (auto& x : t) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<std::int32_t>((s >> 8) % static_cast<std::uint32_t>(V));
  }
  write_token_file(path, t);
  return path;
}

// Runs `steps` optimizer steps reading micro-batches from a DataLoader over `file`.
std::vector<float> train(Engine& e, const std::filesystem::path& file, int steps) {
  DataLoaderOptions o;
  o.micro_batch_size = static_cast<std::size_t>(e.config().train_micro_batch_size_per_gpu);
  o.sequence_length = static_cast<std::size_t>(e.sequence_length());
  o.gradient_accumulation_steps = static_cast<int>(e.config().gradient_accumulation_steps);
  o.seed = 5;
  DataLoader dl = DataLoader::open(file, o);
  const std::size_t n = static_cast<std::size_t>(e.config().train_micro_batch_size_per_gpu * e.sequence_length());
  std::vector<std::int32_t> in(n), tg(n);
  const Shape bt{e.config().train_micro_batch_size_per_gpu, e.sequence_length()};
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    for (std::int64_t m = 0; m < e.config().gradient_accumulation_steps; ++m) {
      dl.next_micro_batch(in, tg);
      e.forward(Batch{Tensor(in.data(), DType::int32, bt), Tensor(tg.data(), DType::int32, bt)});
      e.backward();
      EXPECT_EQ(e.is_gradient_accumulation_boundary(), m + 1 == e.config().gradient_accumulation_steps);
      e.step();
    }
    losses.push_back(e.state().last_step_loss);
  }
  return losses;
}

// (c) GAS = 4 with micro-batch 2 takes the same update as GAS = 1 with micro-batch 8: the same
// global batch (data-order rule), gradients averaged by the 1/GAS loss scaling.
TEST(Engine, GradientAccumulationEqualsTheLargeBatch) {
  const auto file = token_file("engine_gas", 4000, 61);
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Engine a = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 4, 1e-3, 0.1, 1.0)), {.seed = 1, .sequence_length = 8});
  Engine b = initialize(make_gpt2_model(cfg), ds(adamw_json(8, 1, 1e-3, 0.1, 1.0)), {.seed = 1, .sequence_length = 8});
  EXPECT_EQ(a.config().train_batch_size, 8);
  const auto la = train(a, file, 2), lb = train(b, file, 2);
  for (int s = 0; s < 2; ++s) EXPECT_NEAR(la[static_cast<std::size_t>(s)], lb[static_cast<std::size_t>(s)], 2e-6);
  EXPECT_NEAR(a.state().grad_norm, b.state().grad_norm, 1e-5 * b.state().grad_norm);
  for (const auto& name : a.param_names()) {
    const auto pa = values(a.param(name)), pb = values(b.param(name));
    for (std::size_t i = 0; i < pa.size(); ++i) ASSERT_NEAR(pa[i], pb[i], 2e-6) << name << "[" << i << "]";
  }
  EXPECT_EQ(a.state().global_steps, 2);
  EXPECT_EQ(a.state().micro_steps, 8);
  EXPECT_EQ(a.state().global_samples, 16);
  std::filesystem::remove(file);
}

TEST(GradNorm, HandComputedValues) {
  std::vector<float> a{3.0f, 4.0f}, b(200'000, 0.5f);
  const std::vector<Tensor> t{Tensor(a.data(), DType::fp32, Shape{2}), Tensor(b.data(), DType::fp32, Shape{200'000})};
  EXPECT_DOUBLE_EQ(global_grad_norm(std::span(t).first(1)), 5.0);
  EXPECT_NEAR(global_grad_norm(t), std::sqrt(25.0 + 200'000 * 0.25), 1e-9);
  EXPECT_FLOAT_EQ(clip_coefficient(10.0, 1.0), static_cast<float>(1.0 / (10.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(10.0, 0.0), 1.0f);  // 0 disables clipping
}

// (d) Clipping: the engine's norm equals a hand-summed norm of Gpt2Model's gradients; with c below
// it the update is AdamW on g·c/(‖g‖+1e-6), with c above it AdamW on g. eps = 1 makes the Adam
// update depend on the gradient's scale (g/(|g|+1)), so a missing or wrong factor shows.
TEST(Engine, ClipsToTheGlobalNorm) {
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Gpt2Model ref(cfg, DType::fp32, 2, 8);
  ref.init_params(4);
  Tokens tk = random_tokens(2, 8, 61, 2, 5);
  ref.forward(tk.batch().tokens, tk.batch().targets);
  ref.backward(1.0f);
  double sq = 0.0;
  for (const auto& [name, g] : grads_of(ref))
    for (double x : g) sq += x * x;
  const double norm = std::sqrt(sq);
  ASSERT_GT(norm, 0.05);
  for (const double c : {0.01, 1e6}) {
    SCOPED_TRACE(c);
    Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 0.1, 0.0, c, 1.0)), {.seed = 4, .sequence_length = 8});
    e.forward(tk.batch());
    e.backward();
    e.step();
    EXPECT_NEAR(e.state().grad_norm, norm, 1e-6 * norm);
    const double factor = c < norm ? c / (norm + 1e-6) : 1.0;
    EXPECT_NEAR(e.state().clip_coefficient, factor, 1e-6 * factor);
    NaiveAdam naive{0.1, 0.9, 0.95, 1.0, 0.0, true, {}, {}, {}, 0};
    Gpt2Model init(cfg, DType::fp32, 2, 8);
    init.init_params(4);
    for (const auto& p : init.params()) {
      auto f = values(p.value);
      naive.theta[p.spec.name].assign(f.begin(), f.end());
    }
    naive.step(grads_of(ref), factor);
    for (const auto& [name, th] : naive.theta) {
      const auto got = values(e.param(name));
      for (std::size_t i = 0; i < th.size(); ++i) ASSERT_NEAR(got[i], th[i], 1e-7) << name << "[" << i << "]";
    }
  }
}

// (e) Loss falls on real text: bytes-tokenised English, a small GPT, 30 steps.
TEST(Engine, LossFallsOnText) {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text += "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. ";
    text += "All that glitters is not gold; the early bird catches the worm. ";
  }
  std::vector<std::int32_t> toks;
  ByteTokenizer().encode_append(text, toks);
  const auto path = std::filesystem::temp_directory_path() / ("engine_text_" + std::to_string(::getpid()) + ".bin");
  write_token_file(path, toks);
  Engine e = initialize(make_gpt2_model("gpt2:L2-C32-H2-V256-T32"), ds(adamw_json(4, 1, 1e-2, 0.0, 1.0)), {.seed = 0, .sequence_length = 32});
  const auto losses = train(e, path, 30);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);  // GPT-2 init: near-uniform prediction
  double last = 0.0;
  for (std::size_t i = 25; i < 30; ++i) last += losses[i] / 5.0;
  EXPECT_LT(last, losses.front() - 2.0) << "first " << losses.front() << ", mean of the last 5 " << last;
  std::filesystem::remove(path);
}

// (f) Same seed and data: the same losses, bit for bit (dropout on); another seed: other losses.
TEST(Engine, Deterministic) {
  const auto file = token_file("engine_det", 4000, 61);
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  cfg.resid_pdrop = 0.1f;
  const auto run = [&](std::uint64_t seed) {
    Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 2, 1e-2, 0.1, 1.0)), {.seed = seed, .sequence_length = 8});
    return train(e, file, 5);
  };
  const auto a = run(11), b = run(11), c = run(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  std::filesystem::remove(file);
}

// (g) Memory: nothing is allocated during steps; params = 4 bytes per stored parameter exactly
// (GPT-2's padded count, an independent formula), grads the same, Adam m and v twice that.
TEST(Engine, MemoryIsAllocatedUpFront) {
  const auto file = token_file("engine_mem", 4000, 61);
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  CpuAllocator alloc;
  Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 2, 1e-3, 0.1, 1.0)), {.seed = 1, .sequence_length = 8, .allocator = &alloc});
  const MemoryStats before = alloc.stats();
  const auto bytes = static_cast<std::size_t>(parameter_count_padded(cfg)) * 4;
  EXPECT_EQ(e.report().parameter_count, parameter_count_padded(cfg));
  EXPECT_EQ(before[MemoryPurpose::params].current, bytes);
  EXPECT_EQ(before[MemoryPurpose::grads].current, bytes);
  EXPECT_EQ(before[MemoryPurpose::optimizer].current, 2 * bytes);
  // Activations hold at least the head's logits (B, T, Vp) fp32.
  EXPECT_GE(before[MemoryPurpose::activations].current, std::size_t{2 * 8 * 128 * 4});
  train(e, file, 3);
  Tokens tk = random_tokens(2, 8, 61, 3, 5);
  e.evaluate(tk.batch());
  const MemoryStats after = alloc.stats();
  EXPECT_EQ(after.total.allocations, before.total.allocations);
  EXPECT_EQ(after.total.peak, before.total.peak);
  std::filesystem::remove(file);
}

// Evaluation is the forward loss with dropout off, and changes no state.
TEST(Engine, EvaluateMatchesGpt2ModelWithoutDropout) {
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  cfg.resid_pdrop = 0.1f;
  Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-3, 0.0, 1.0)), {.seed = 2, .sequence_length = 8});
  Gpt2Model ref(cfg, DType::fp32, 2, 8);
  ref.init_params(2);
  Tokens tk = random_tokens(2, 8, 61, 4, 5);
  EXPECT_EQ(e.evaluate(tk.batch()), ref.forward(tk.batch().tokens, tk.batch().targets, {.train = false}));
  EXPECT_EQ(e.state().global_steps, 0);
  EXPECT_THROW(e.backward(), Error);  // no training forward to go back through
}

// Weights round-trip through HF safetensors into a fresh engine: the same loss.
TEST(Engine, SaveAndLoadWeights) {
  const auto path = std::filesystem::temp_directory_path() / ("engine_w_" + std::to_string(::getpid()) + ".safetensors");
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Engine a = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-2, 0.0, 1.0)), {.seed = 1, .sequence_length = 8});
  Tokens tk = random_tokens(2, 8, 61, 4, 5);
  a.forward(tk.batch());
  a.backward();
  a.step();
  a.save_weights(path);
  Engine b = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-2, 0.0, 1.0)), {.seed = 9, .sequence_length = 8});
  EXPECT_NE(a.evaluate(tk.batch()), b.evaluate(tk.batch()));
  b.load_weights(path);
  EXPECT_EQ(a.evaluate(tk.batch()), b.evaluate(tk.batch()));
  std::filesystem::remove(path);
}

// Weights holding a NaN or an infinity are refused at load, naming the tensor and the element,
// and the engine keeps the weights it had: --init-from such a file with --steps 0 once saved it again.
TEST(Engine, NonFiniteWeightsAreRefusedAtLoad) {
  const auto path = std::filesystem::temp_directory_path() / ("engine_nan_" + std::to_string(::getpid()) + ".safetensors");
  const Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Engine a = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-2, 0.0, 1.0)), {.seed = 1, .sequence_length = 8});
  std::map<std::string, std::vector<float>> held;
  a.gather_master_params([&](const std::string& n, const Tensor& t) { held[n].assign(t.as<float>(), t.as<float>() + t.numel()); });
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    held["h.1.mlp.c_fc.bias"][5] = bad;
    a.model().architecture->export_weights(path, [&](const std::string& n) {
      const std::string owner = n == "lm_head.weight" ? "wte.weight" : n;
      std::vector<float>& v = held.at(owner);
      return Tensor(v.data(), DType::fp32, a.master_param(owner).shape);
    });
    Engine b = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 1, 1e-2, 0.0, 1.0)), {.seed = 9, .sequence_length = 8});
    Tokens tk = random_tokens(2, 8, 61, 4, 5);
    const float before = b.evaluate(tk.batch());
    try {
      b.load_weights(path);
      ADD_FAILURE() << "non-finite weights were loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'h.1.mlp.c_fc.bias'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("element 5"), std::string::npos) << e.what();
    }
    EXPECT_EQ(b.evaluate(tk.batch()), before);
  }
  std::filesystem::remove(path);
}

std::string init_error(const std::string& json) {
  try {
    initialize(make_gpt2_model("gpt2:tiny"), ds(json), {.sequence_length = 8});
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Engine, RefusesWhatThisBuildDoesNotTrain) {
  const std::string base = R"("train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})";
  // fp16 and bf16 are trained (test_engine_precision.cpp); both at once is refused, as DeepSpeed does.
  EXPECT_NE(init_error("{" + base + R"(, "fp16": {"enabled": true}, "bf16": {"enabled": true}})").find("bf16"), std::string::npos);
  EXPECT_EQ(init_error("{" + base + R"(, "fp16": {"enabled": true}})"), "<no error>");
  EXPECT_EQ(init_error("{" + base + R"(, "bf16": {"enabled": true}})"), "<no error>");
  // ZeRO stages train (test_zero_*.cpp), with optimizer offload to host memory at stages 1-3
  // (test_optimizer_offload.cpp); parameter offload below stage 3 is ignored as DeepSpeed ignores it
  // (test_param_offload.cpp). Lamb trains at stage
  // >= 1 with zero_allow_untested_optimizer (test_lamb_zero.cpp).
  EXPECT_EQ(init_error("{" + base + R"(, "zero_optimization": {"stage": 2}})"), "<no error>");
  EXPECT_EQ(init_error("{" + base + R"(, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})"), "<no error>");
  EXPECT_EQ(init_error("{" + base + R"(, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})"), "<no error>");
  EXPECT_EQ(init_error("{" + base + R"(, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"), "<no error>");
  EXPECT_EQ(init_error(R"({"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": true, "zero_optimization": {"stage": 1},
                           "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}})"),
            "<no error>");
  EXPECT_NE(init_error(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "LBFGS", "params": {"lr": 0.1}}})").find("optimizer.type"),
            std::string::npos);
  EXPECT_NE(init_error(R"({"train_micro_batch_size_per_gpu": 2})").find("no \"optimizer\" block"), std::string::npos);
  EXPECT_NE(init_error("{" + base + R"(, "managed_gradient_accumulation": false})").find("managed_gradient_accumulation"), std::string::npos);
  EXPECT_EQ(init_error("{" + base + "}"), "<no error>");
  // T beyond the model's positions.
  EXPECT_THROW(initialize(make_gpt2_model("gpt2:tiny"), ds("{" + base + "}"), {.sequence_length = 9}), Error);
}

// The LR hook overrides the config's schedule: called once per step index (the next step's, so
// lr() can report it), its value used by that step.
TEST(Engine, LrHookOverridesTheSchedule) {
  const auto file = token_file("engine_lr", 4000, 61);
  Engine e = initialize(make_gpt2_model("gpt2:tiny"), ds(adamw_json(2, 1, 1e-3, 0.0, 1.0)), {.seed = 1, .sequence_length = 8});
  EXPECT_DOUBLE_EQ(e.state().lr, 1e-3);
  std::vector<std::int64_t> seen;
  e.set_lr_schedule([&](std::int64_t s) {
    seen.push_back(s);
    return 0.5 * static_cast<double>(s + 1);
  });
  EXPECT_DOUBLE_EQ(e.state().lr, 0.5);
  train(e, file, 3);
  EXPECT_EQ(seen, (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_DOUBLE_EQ(e.state().last_step_lr, 1.5);  // step index 2
  EXPECT_DOUBLE_EQ(e.state().lr, 2.0);            // step index 3, next
  e.set_lr_schedule(nullptr);                     // back to the config's (constant) lr
  EXPECT_DOUBLE_EQ(e.state().lr, 1e-3);
  std::filesystem::remove(file);
}

// forward, backward, step for every micro-batch: a second backward() before step() would count one
// micro-step twice (and at the boundary reduce twice at stages 0/1), and a step() without backward()
// counts a micro-step that accumulated nothing; both are Errors that name the call to make.
TEST(Engine, CallOrderIsEnforced) {
  Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
  Engine e = initialize(make_gpt2_model(cfg), ds(adamw_json(2, 2, 1e-3, 0.0, 1.0)), {.seed = 5, .sequence_length = 8});
  Tokens t = random_tokens(2, 8, static_cast<std::int32_t>(cfg.vocab_size), 9);
  try {
    e.step();
    ADD_FAILURE() << "step() without backward() was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("backward()"), std::string::npos) << err.what();
  }
  e.forward(t.batch());
  e.backward();
  e.forward(t.batch());
  try {
    e.backward();
    ADD_FAILURE() << "a second backward() before step() was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("step()"), std::string::npos) << err.what();
  }
  EXPECT_EQ(e.state().micro_steps, 0);
  e.step();  // the first backward's micro-step; the engine is still usable
  EXPECT_EQ(e.state().micro_steps, 1);
  e.forward(t.batch());
  e.backward();
  e.step();
  EXPECT_EQ(e.state().global_steps, 1);
}

// ZeRO stage 1 on 2 ranks: after the boundary backward the gradients are reduce-scattered in place
// (averages in the rank's own partition, local sums elsewhere), so grad() refuses until step();
// before the boundary it gives the rank's local accumulation.
TEST(Engine, GradRefusedWhereStageOneWouldMixAveragesAndLocalSums) {
  run_local_ranks(2, [&](Communicator& comm) {
    config::ConfigOptions co;
    co.world_size = 2;
    const config::DsConfig c =
        config::parse_ds_config(config::Json::parse(
                                    R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
                               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})"),
                                co);
    Gpt2Config cfg = model_config_from_spec("gpt2:tiny");
    Engine e = initialize(make_gpt2_model(cfg), c, {.seed = 5, .comm = &comm, .sequence_length = 8});
    Tokens t = random_tokens(2, 8, static_cast<std::int32_t>(cfg.vocab_size), 9 + static_cast<std::uint32_t>(comm.rank()));
    e.forward(t.batch());
    e.backward();
    EXPECT_NO_THROW(e.grad("wte.weight"));  // not the boundary: local sums only
    e.step();
    e.forward(t.batch());
    e.backward();  // the boundary: reduce-scattered
    try {
      e.grad("wte.weight");
      ADD_FAILURE() << "grad() after the boundary backward at stage 1 was accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("stage 1"), std::string::npos) << err.what();
    }
    e.step();
    EXPECT_NO_THROW(e.grad("wte.weight"));
  });
}

}  // namespace
}  // namespace dstrain
