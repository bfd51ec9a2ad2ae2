// Tiny OLMoE models for the mesh and checkpoint tests: Hugging Face config.json files
// (OlmoeForCausalLM: RMSNorm over the whole q projection and the whole k projection, before the
// heads; docs/models.md §8) written once per test program into a scratch folder, named by their
// path as a --model spec. No moe: descriptor writes OLMoE's attention, hence the files.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <system_error>

#include <fmt/format.h>

namespace dstrain::olmoe_testing {

// The path of <temp>/dstrain_olmoe_<name>_<pid>/config.json holding `json`, written at the first
// call for `name`; the folders are removed when the program ends.
inline const char* write_config(const std::string& name, const std::string& json) {
  struct Files {
    std::map<std::string, std::string> paths;  // name -> config.json (map nodes: stable c_str())
    ~Files() {
      for (const auto& [n, p] : paths) {
        std::error_code ec;
        std::filesystem::remove_all(std::filesystem::path(p).parent_path(), ec);
      }
    }
  };
  static Files files;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = files.paths.find(name);
  if (it == files.paths.end()) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("dstrain_olmoe_{}_{}", name, ::getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << json;
    it = files.paths.emplace(name, (dir / "config.json").string()).first;
  }
  return it->second.c_str();
}

// 2 layers, C 32, 4 query heads sharing 2 key/value heads (head_dim 8), 4 experts of 24, top 2,
// q/k/v and o biases (attention_bias), the load-balancing loss × 0.05 in the objective, the
// vocabulary and T of zero_test_util.h. Under TP 2 each rank holds one key/value head (q's norm
// cut 16 | 16, k's 8 | 8); under TP 4 two ranks hold none and join the norm's sums with zeros.
inline const char* gqa_model() {
  static const char* path = write_config("gqa", R"({
  "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "attention_bias": true, "attention_dropout": 0.0, "clip_qkv": null,
  "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 24, "max_position_embeddings": 16,
  "norm_topk_prob": false, "num_attention_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "output_router_logits": true, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "router_aux_loss_coef": 0.05, "tie_word_embeddings": false, "vocab_size": 96})");
  return path;
}

// 8 query heads sharing 4 key/value heads (head_dim 4), no biases: each of 2 tensor-parallel
// ranks holds 2 key/value heads, which DeepSpeed-Ulysses splits again over 2 sequence-parallel ranks.
inline const char* heads8_model() {
  static const char* path = write_config("heads8", R"({
  "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 32, "intermediate_size": 24, "max_position_embeddings": 16,
  "num_attention_heads": 8, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 4,
  "output_router_logits": true, "router_aux_loss_coef": 0.05, "rms_norm_eps": 1e-05, "vocab_size": 96})");
  return path;
}

// Uneven: 6 query heads, 3 key/value heads (head_dim 8), no biases. TP 2 cuts them 2 | 1 (q's
// norm 32 | 16 of 48 columns, k's 16 | 8 of 24).
inline const char* uneven_model() {
  static const char* path = write_config("uneven", R"({
  "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "attention_bias": false, "hidden_size": 48, "intermediate_size": 24,
  "max_position_embeddings": 16, "num_attention_heads": 6, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
  "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "tie_word_embeddings": true, "vocab_size": 96})");
  return path;
}

}  // namespace dstrain::olmoe_testing
