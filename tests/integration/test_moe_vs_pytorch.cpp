// Mixture-of-experts decoders against an independent implementation: small models of each family
// (Mixtral; Qwen2-MoE with its gated shared expert, q/k/v biases and a dense layer among the sparse
// ones; Qwen3-MoE with per-head q/k norms; OLMoE with whole-projection q/k norms; DeepSeek-style
// sigmoid, group-limited, scaled routing with an ungated shared expert and a first dense layer;
// DeepSpeed's capacity factor dropping assignments) run forward and backward here with random
// weights large enough that routing matters; the weights (dstrain's Hugging Face export), the
// gradients (router included), logits, loss and the load-balancing loss go to a folder that
// tests/integration/moe_vs_pytorch.py reads into an MoE written in PyTorch from Hugging Face's
// equations, in float64, and compares. Then five AdamW steps here against torch.optim.AdamW there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "torch_reference.h"
#include "models/llama/llama_config.h"
#include "models/llama/llama_model.h"
#include "models/llama/llama_weights.h"
#include "ops/kernels/adamw.h"

namespace dstrain {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  const char* spec;  // the attention's llama: descriptor
  const char* model_type;
  std::function<void(LlamaConfig&)> shape;  // the family's attention and MoE settings
  bool train = false;
};

void check_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const fs::path dir = fs::temp_directory_path() / ("dstrain_moe_vs_pytorch." + std::to_string(::getpid()) + "." + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  LlamaConfig cfg = llama_config_from_spec(c.spec);
  cfg.model_type = c.model_type;
  c.shape(cfg);
  validate(cfg.moe, c.name);
  constexpr std::int64_t B = 2, T = 16;
  LlamaModel m(cfg, DType::fp32, B, T);
  // Weights ~ N(0, 1/sqrt(fan_in)) (the router's logits then spread over ~1), norm weights
  // 1 + N(0, 0.2), biases N(0, 0.1), embeddings N(0, 0.5).
  std::mt19937_64 rng(2026);
  for (const auto& p : m.params()) {
    const std::string& n = p.spec.name;
    double mean = 0.0, sd = 0.1;
    if (n.find("norm") != std::string::npos) {
      mean = 1.0;
      sd = 0.2;
    } else if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
      sd = 0.5;
    } else if (n.ends_with(".weight")) {
      sd = 1.0 / std::sqrt(static_cast<double>(p.spec.shape[p.spec.shape.rank - 1]));
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
  const Tensor all_logits = m.saved(m.layers().size() - 1)[2];
  std::vector<float> logits;
  for (std::int64_t bt = 0; bt < B * T; ++bt) {
    const float* row = static_cast<const float*>(all_logits.data) + bt * cfg.padded_vocab_size;
    logits.insert(logits.end(), row, row + cfg.vocab_size);
  }
  float aux = static_cast<float>(m.last_aux_loss());
  m.backward();

  const auto value = [&](const std::string& n) { return m.param(n); };
  export_llama_weights(dir / "weights.safetensors", cfg, value);
  export_llama_weights(dir / "grads.safetensors", cfg, [&](const std::string& n) { return m.grad(n); });
  nlohmann::json config = nlohmann::json::parse(llama_hf_config_json(cfg));
  // DeepSeek-V3 names its sigmoid routing with group scores from each group's top two "noaux_tc".
  if (cfg.moe.score == MoeConfig::Score::sigmoid && !config.contains("topk_method")) config["topk_method"] = "noaux_tc";
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<float> tokens_f(tokens.begin(), tokens.end()), targets_f(targets.begin(), targets.end());
  float loss_v = loss;
  std::vector<SafetensorsWriteItem> items{
      {"tokens", Tensor(tokens_f.data(), DType::fp32, Shape{B, T}), {}},
      {"targets", Tensor(targets_f.data(), DType::fp32, Shape{B, T}), {}},
      {"logits", Tensor(logits.data(), DType::fp32, Shape{B, T, cfg.vocab_size}), {}},
      {"loss", Tensor(&loss_v, DType::fp32, Shape{1}), {}},
      {"aux_loss", Tensor(&aux, DType::fp32, Shape{1}), {}},
  };
  write_safetensors(dir / "outputs.safetensors", items);

  if (c.train) {
    const nlohmann::json train = torch_reference::train_five_adamw_steps(m, tt, tg);
    export_llama_weights(dir / "trained.safetensors", cfg, value);
    std::ofstream(dir / "train.json") << train.dump();
  }

  const std::string output = torch_reference::run_python("tests/integration/moe_vs_pytorch.py", dir);
  std::printf("%s", output.c_str());
  EXPECT_NE(output.find("moe_vs_pytorch: " + std::string(c.model_type)), std::string::npos) << output;
  EXPECT_EQ(output.find("MISMATCH"), std::string::npos) << output;
  EXPECT_EQ(output.find("exit status"), std::string::npos) << output;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

void aux_on(LlamaConfig& c, double coef) {
  c.moe.output_router_logits = true;
  c.moe.router_aux_loss_coef = coef;
}

TEST(MoeVsPytorch, MixtralWithAuxLossTrainsFiveSteps) {
  check_case({"mixtral", "llama:L2-C64-H4-KV2-I48-V97-T16", "mixtral",
              [](LlamaConfig& c) {
                c.moe.num_experts = 4;
                c.moe.top_k = 2;
                c.moe.expert_intermediate_size = 48;
                c.moe.norm_topk_prob = true;
                aux_on(c, 0.05);
              },
              true});
}

TEST(MoeVsPytorch, Qwen2MoeGatedSharedExpertAndADenseLayerTrainsFiveSteps) {
  check_case({"qwen2_moe", "llama:L3-C64-H4-KV2-I96-V97-T16", "qwen2_moe",
              [](LlamaConfig& c) {
                c.qkv_bias = true;
                c.moe.num_experts = 6;
                c.moe.top_k = 3;
                c.moe.expert_intermediate_size = 32;
                c.moe.norm_topk_prob = false;
                c.moe.shared_expert_intermediate_size = 80;
                c.moe.shared_expert_gate = true;
                c.moe.mlp_only_layers = {1};
                aux_on(c, 0.02);
              },
              true});
}

TEST(MoeVsPytorch, Qwen3MoeHeadNorms) {
  check_case({"qwen3_moe", "llama:L2-C64-H4-KV2-D24-I96-V97-T16", "qwen3_moe", [](LlamaConfig& c) {
                c.qk_norm = true;
                c.moe.num_experts = 8;
                c.moe.top_k = 2;
                c.moe.expert_intermediate_size = 40;
                c.moe.norm_topk_prob = true;
                aux_on(c, 0.01);
              }});
}

TEST(MoeVsPytorch, OlmoeWholeProjectionNormsTrainsFiveSteps) {
  check_case({"olmoe", "llama:L2-C64-H4-KV2-I48-V97-T16", "olmoe",
              [](LlamaConfig& c) {
                c.qk_norm = true;
                c.qk_norm_whole = true;
                c.moe.num_experts = 4;
                c.moe.top_k = 2;
                c.moe.expert_intermediate_size = 48;
                c.moe.norm_topk_prob = false;
                aux_on(c, 0.01);
              },
              true});
}

TEST(MoeVsPytorch, DeepSeekRoutingSigmoidGroupsScaledSharedAndFirstDenseTrainsFiveSteps) {
  check_case({"deepseek_routing", "llama:L3-C64-H4-KV2-D24-I96-V97-T16", "qwen3_moe",
              [](LlamaConfig& c) {
                c.qk_norm = true;
                c.moe.num_experts = 8;
                c.moe.top_k = 2;
                c.moe.expert_intermediate_size = 32;
                c.moe.score = MoeConfig::Score::sigmoid;
                c.moe.n_group = 4;
                c.moe.topk_group = 2;
                c.moe.routed_scaling_factor = 2.5;
                c.moe.norm_topk_prob = true;
                c.moe.shared_expert_intermediate_size = 32;  // n_shared_experts = 1
                c.moe.first_k_dense = 1;
              },
              true});
}

TEST(MoeVsPytorch, CapacityFactorDropsAssignments) {
  check_case({"capacity", "llama:L2-C64-H4-KV2-I48-V97-T16", "mixtral", [](LlamaConfig& c) {
                c.moe.num_experts = 4;
                c.moe.top_k = 2;
                c.moe.expert_intermediate_size = 48;
                c.moe.capacity_factor = 0.75;  // 24 slots per expert for 64 assignments: some must drop
                c.moe.min_capacity = 1;
                aux_on(c, 0.05);
              }});
}

}  // namespace
}  // namespace dstrain
