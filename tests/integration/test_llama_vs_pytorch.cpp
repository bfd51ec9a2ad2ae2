// The Llama family against an independent implementation: small models of each variant (grouped
// KV heads 1, 2 and all; tied and untied embeddings; linear and llama3 rope scaling; Qwen2's
// q/k/v biases; Qwen3's q/k norms with o bias and a head size that is not C / H; Llama's MLP
// biases; Mistral's sliding window shorter than the sequence) run forward and backward here with random weights large enough that every part
// matters; the weights (dstrain's Hugging Face export), the gradients, logits and loss go to a
// folder that tests/integration/llama_vs_pytorch.py reads into a Llama written in PyTorch from the
// published equations, in float64, and compares (tolerances in that script). Then five AdamW
// steps here against torch.optim.AdamW there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/kernels/adamw.h"
#include "models/llama/llama_config.h"
#include "models/llama/llama_model.h"
#include "models/llama/llama_weights.h"
#include "formats/safetensors.h"
#include "torch_reference.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  const char* spec;  // llama: descriptor
  const char* model_type;
  RopeScaling::Kind rope = RopeScaling::Kind::none;
  bool qkv_bias = false, o_bias = false, mlp_bias = false, qk_norm = false;
  bool train = false;
  std::int64_t sliding_window = 0;  // Mistral's; 0: none
};

LlamaConfig config_of(const Case& c) {
  LlamaConfig cfg = llama_config_from_spec(c.spec);
  cfg.model_type = c.model_type;
  cfg.rope_theta = 10000.0;
  cfg.rope_scaling.kind = c.rope;
  if (c.rope == RopeScaling::Kind::linear) cfg.rope_scaling.factor = 4.0;
  if (c.rope == RopeScaling::Kind::llama3) {
    // Bands at this head size: wavelengths 6.3 .. 2e4 against 64 / 4 = 16 and 64 / 1 = 64, so high,
    // medium and low frequencies all occur.
    cfg.rope_scaling.factor = 8.0;
    cfg.rope_scaling.low_freq_factor = 1.0;
    cfg.rope_scaling.high_freq_factor = 4.0;
    cfg.rope_scaling.original_max_position_embeddings = 64.0;
  }
  cfg.qkv_bias = c.qkv_bias;
  cfg.o_bias = c.o_bias;
  cfg.mlp_bias = c.mlp_bias;
  cfg.qk_norm = c.qk_norm;
  cfg.sliding_window = c.sliding_window;
  return cfg;
}

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const fs::path dir = fs::temp_directory_path() / ("dstrain_llama_vs_pytorch." + std::to_string(::getpid()) + "." + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const LlamaConfig cfg = config_of(c);
  constexpr std::int64_t B = 2, T = 16;
  LlamaModel m(cfg, DType::fp32, B, T);
  // Weights ~ N(0, 1/sqrt(fan_in)), norm weights 1 + N(0, 0.2), biases N(0, 0.1), embeddings
  // N(0, 0.5): at the init scale of 0.02 the logits would hardly depend on the layers.
  std::mt19937_64 rng(2025);
  for (const auto& p : m.params()) {
    const std::string& n = p.spec.name;
    double mean = 0.0, sd = 0.1;
    if (n.find("norm") != std::string::npos) {
      mean = 1.0;
      sd = 0.2;
    } else if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      sd = 0.5;
    } else if (n.ends_with(".weight")) {
      sd = 1.0 / std::sqrt(static_cast<double>(p.spec.shape[1]));
    }
    std::normal_distribution<double> d(mean, sd);
    float* v = static_cast<float*>(p.value.data);
    const std::int64_t rows = p.spec.shape[0], row = p.value.numel() / rows;
    const bool vocab = n == "model.embed_tokens.weight" || n == "lm_head.weight";
    for (std::int64_t i = 0; i < p.value.numel(); ++i) v[i] = vocab && i / row >= cfg.vocab_size ? 0.0f : static_cast<float>(d(rng));
  }
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(cfg.vocab_size - 1));
  std::vector<std::int32_t> seq(B * T + 1);
  for (auto& s : seq) s = tok(rng);
  std::vector<std::int32_t> tokens(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  targets[5] = -1;  // an ignored position
  const Tensor tt(tokens.data(), DType::int32, Shape{B, T}), tg(targets.data(), DType::int32, Shape{B, T});

  m.zero_grad();
  const float loss = m.forward(tt, tg);
  // The head's saved logits (B, T, Vp), before backward turns them into their gradient.
  const Tensor all_logits = m.saved(m.layers().size() - 1)[2];
  std::vector<float> logits;
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    const float* row = static_cast<const float*>(all_logits.data) + bt * cfg.padded_vocab_size;
    logits.insert(logits.end(), row, row + cfg.vocab_size);
  }
  m.backward();

  const auto value = [&](const std::string& n) { return m.param(n); };
  export_llama_weights(dir / "weights.safetensors", cfg, value);
  export_llama_weights(dir / "grads.safetensors", cfg, [&](const std::string& n) { return m.grad(n); });
  std::ofstream(dir / "config.json") << llama_hf_config_json(cfg);
  std::vector<float> tokens_f(tokens.begin(), tokens.end()), targets_f(targets.begin(), targets.end());
  float loss_v = loss;
  const std::vector<SafetensorsWriteItem> items{
      {"tokens", Tensor(tokens_f.data(), DType::fp32, Shape{B, T}), {}},
      {"targets", Tensor(targets_f.data(), DType::fp32, Shape{B, T}), {}},
      {"logits", Tensor(logits.data(), DType::fp32, Shape{B, T, cfg.vocab_size}), {}},
      {"loss", Tensor(&loss_v, DType::fp32, Shape{1}), {}},
  };
  write_safetensors(dir / "outputs.safetensors", items);

  if (c.train) {
    const nlohmann::json train = torch_reference::train_five_adamw_steps(m, tt, tg);
    export_llama_weights(dir / "trained.safetensors", cfg, value);
    std::ofstream(dir / "train.json") << train.dump();
  }

  const std::string output = torch_reference::run_python("tests/integration/llama_vs_pytorch.py", dir);
  std::printf("%s", output.c_str());
  EXPECT_NE(output.find("llama_vs_pytorch: " + std::string(c.model_type)), std::string::npos) << output;
  EXPECT_EQ(output.find("MISMATCH"), std::string::npos) << output;
  EXPECT_EQ(output.find("exit status"), std::string::npos) << output;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(LlamaVsPytorch, MultiQueryUntiedWithMlpBias) {
  check_case({"mqa", "llama:L2-C64-H4-KV1-I96-V97-T16", "llama", RopeScaling::Kind::none, false, false, true, false, false, 0});
}

TEST(LlamaVsPytorch, TwoKvHeadsTiedLlama3RopeTrainsFiveSteps) {
  check_case({"kv2_tied_llama3", "llama:L2-C64-H4-KV2-I96-V97-T16-tied", "llama", RopeScaling::Kind::llama3, false, false, false, false, true, 0});
}

TEST(LlamaVsPytorch, AllKvHeadsLinearRopeWithAttentionBias) {
  check_case({"kv_all_linear", "llama:L2-C48-H4-I80-V97-T16", "llama", RopeScaling::Kind::linear, true, true, false, false, false, 0});
}

TEST(LlamaVsPytorch, Qwen2QkvBiasTrainsFiveSteps) {
  check_case({"qwen2", "llama:L2-C64-H4-KV2-I96-V97-T16-tied", "qwen2", RopeScaling::Kind::none, true, false, false, false, true, 0});
}

TEST(LlamaVsPytorch, Qwen3QkNormHeadSizeNotCOverH) {
  // D = 24 with C = 64, H = 4: q is 96 wide, o_proj maps 96 -> 64.
  check_case({"qwen3", "llama:L2-C64-H4-KV2-D24-I96-V97-T16", "qwen3", RopeScaling::Kind::none, true, true, false, true, true, 0});
}

TEST(LlamaVsPytorch, MistralSlidingWindowShorterThanTTrainsFiveSteps) {
  // T = 16 with a window of 5 keys: most queries lose keys to the window, across both layers.
  check_case({"mistral_window", "llama:L2-C64-H4-KV2-I96-V97-T16", "mistral", RopeScaling::Kind::none, false, false, false, false, true, 5});
}

}  // namespace
}  // namespace dstrain
