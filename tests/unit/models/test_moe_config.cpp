// Mixture-of-experts configs (LlamaConfig::moe): the config.json of Mixtral, Qwen2-MoE, Qwen3-MoE
// and OLMoE as published (Mixtral-8x7B, Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B, OLMoE-1B-7B-0924), their
// parameter counts against a hand formula and the published totals, the refusals that name the key,
// the moe: descriptor's grammar and defaults, the config.json dstrain writes reading back equal, and
// the architecture's FLOPs, Hugging Face names and layer copies.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "models/llama/llama_config.h"
#include "models/llama/llama_family.h"
#include "models/model_registry.h"
#include "ops/error.h"

using namespace dstrain;

namespace {

void expect_error_with(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
  }
}

// mistralai/Mixtral-8x7B-v0.1's config.json.
constexpr const char* kMixtral = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

// Qwen/Qwen1.5-MoE-A2.7B's config.json.
constexpr const char* kQwen2Moe = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": false,
  "output_router_logits": false, "router_aux_loss_coef": 0.001})";

// Qwen/Qwen3-30B-A3B's config.json.
constexpr const char* kQwen3Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// allenai/OLMoE-1B-7B-0924's config.json.
constexpr const char* kOlmoe = R"({
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "clip_qkv": null, "eos_token_id": 50279,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
  "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
  "num_hidden_layers": 16, "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false, "torch_dtype": "float32",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304})";

// A JSON text with `key` set to `value` (JSON), or removed when value is empty.
std::string set(const std::string& text, const std::string& key, const std::string& value) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  if (value.empty())
    j.erase(key);
  else
    j[key] = nlohmann::ordered_json::parse(value);
  return j.dump();
}

// The published models' sizes, shrunk: every key kept, small numbers.
std::string small(const char* text) {
  std::string s = set(text, "hidden_size", "64");
  s = set(s, "num_hidden_layers", "3");
  s = set(s, "vocab_size", "300");
  s = set(s, "num_attention_heads", "4");
  s = set(s, "num_key_value_heads", "2");
  const nlohmann::json j = nlohmann::json::parse(s);
  if (j.contains("head_dim")) s = set(s, "head_dim", "16");
  if (j.contains("moe_intermediate_size")) s = set(s, "moe_intermediate_size", "32");
  if (j.contains("shared_expert_intermediate_size")) s = set(s, "shared_expert_intermediate_size", "48");
  s = set(s, "intermediate_size", j["model_type"] == "mixtral" || j["model_type"] == "olmoe" ? "40" : "96");
  if (j.contains("num_local_experts")) s = set(s, "num_local_experts", "4");
  if (j.contains("num_experts")) s = set(s, "num_experts", "8");
  s = set(s, "num_experts_per_tok", "2");
  return s;
}

// Every field of two configs.
void expect_same(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.padded_vocab_size, b.padded_vocab_size);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_FLOAT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.kind, b.rope_scaling.kind);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.qk_norm_whole, b.qk_norm_whole);
  EXPECT_FLOAT_EQ(a.attention_dropout, b.attention_dropout);
  EXPECT_FLOAT_EQ(a.initializer_range, b.initializer_range);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.use_sliding_window, b.use_sliding_window);
  EXPECT_EQ(a.max_window_layers, b.max_window_layers);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_TRUE(a.moe == b.moe) << describe(a.moe) << " vs " << describe(b.moe);
}

void expect_round_trip(const LlamaConfig& c) {
  SCOPED_TRACE(llama_hf_config_json(c));
  expect_same(llama_config_from_hf_json(llama_hf_config_json(c), "written"), c);
  // And through the registry's families, as a checkpoint's manifest rebuilds it.
  const auto a = model_family("llama").from_config_json(llama_hf_config_json(c), "written");
  expect_same(*llama_config_of(*a), c);
}

// Parameters by hand (every expert, and those a token goes through), for a model whose layers
// are all sparse: per layer two norms, q/k/v/o (+ biases), q/k norms, the router, E (or top_k)
// experts of 3·C·I, the shared experts' 3·C·S and their gate; embeddings; the final norm.
struct Counts {
  double total, active;
};
Counts by_hand(double V, double C, double L, double H, double KV, double D, double E, double K, double I, double S, bool gate, bool qkv_bias,
               double qk_norm) {
  const double attn = 2 * C + (H * D + 2 * KV * D) * C + (qkv_bias ? H * D + 2 * KV * D : 0) + C * H * D + qk_norm;
  const double shared = 3 * C * S + (gate ? C : 0);
  return {2 * V * C + L * (attn + E * C + E * 3 * C * I + shared) + C, 2 * V * C + L * (attn + E * C + K * 3 * C * I + shared) + C};
}

}  // namespace

TEST(MoeConfig, MixtralConfigJson) {
  const LlamaConfig c = llama_config_from_hf_json(kMixtral, "Mixtral-8x7B");
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_EQ(c.n_kv_head, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.qk_norm);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_intermediate_size, 14336);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.score, MoeConfig::Score::softmax);
  EXPECT_DOUBLE_EQ(c.moe.router_aux_loss_coef, 0.02);
  EXPECT_FALSE(c.moe.output_router_logits);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 0);
  EXPECT_EQ(c.moe.sparse_layers(c.n_layer), 32);
  const Counts h = by_hand(32000, 4096, 32, 32, 8, 128, 8, 2, 14336, 0, false, false, 0);
  EXPECT_EQ(parameter_count(c), static_cast<std::int64_t>(h.total));
  EXPECT_DOUBLE_EQ(llama_parameter_count(c, true), h.active);
  // Mistral AI's figures: 46.7B parameters, 12.9B active per token.
  EXPECT_NEAR(h.total / 1e9, 46.7, 0.05);
  EXPECT_NEAR(h.active / 1e9, 12.9, 0.05);
  // A sliding window as Mistral's.
  EXPECT_EQ(llama_config_from_hf_json(set(kMixtral, "sliding_window", "4096"), "m").attention_window(), 4096);
}

TEST(MoeConfig, Qwen2MoeConfigJson) {
  const LlamaConfig c = llama_config_from_hf_json(kQwen2Moe, "Qwen1.5-MoE-A2.7B");
  EXPECT_EQ(c.model_type, "qwen2_moe");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias || c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.moe.num_experts, 60);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.expert_intermediate_size, 1408);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.moe.shared_expert_gate);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  const Counts h = by_hand(151936, 2048, 24, 16, 16, 128, 60, 4, 1408, 5632, true, true, 0);
  EXPECT_EQ(parameter_count(c), static_cast<std::int64_t>(h.total));
  EXPECT_DOUBLE_EQ(llama_parameter_count(c, true), h.active);
  // Qwen's figures: 14.3B parameters, 2.7B activated.
  EXPECT_NEAR(h.total / 1e9, 14.3, 0.05);
  EXPECT_NEAR(h.active / 1e9, 2.7, 0.05);
  // Defaults where keys are absent (Qwen2MoeConfig): a gated shared expert of 5632, not renormalised.
  std::string bare = set(kQwen2Moe, "shared_expert_intermediate_size", "");
  bare = set(bare, "norm_topk_prob", "");
  const LlamaConfig d = llama_config_from_hf_json(bare, "bare");
  EXPECT_EQ(d.moe.shared_expert_intermediate_size, 5632);
  EXPECT_FALSE(d.moe.norm_topk_prob);
  // No shared expert; the sparse-layer pattern.
  std::string s = set(kQwen2Moe, "shared_expert_intermediate_size", "0");
  s = set(s, "decoder_sparse_step", "2");
  s = set(s, "mlp_only_layers", "[3]");
  const LlamaConfig e = llama_config_from_hf_json(s, "pattern");
  EXPECT_EQ(e.moe.shared_expert_intermediate_size, 0);
  EXPECT_FALSE(e.moe.shared_expert_gate);
  EXPECT_FALSE(e.moe.is_sparse_layer(0));
  EXPECT_TRUE(e.moe.is_sparse_layer(1));
  EXPECT_FALSE(e.moe.is_sparse_layer(3));
  EXPECT_EQ(e.moe.sparse_layers(24), 11);
}

TEST(MoeConfig, Qwen3MoeConfigJson) {
  const LlamaConfig c = llama_config_from_hf_json(kQwen3Moe, "Qwen3-30B-A3B");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qk_norm_whole || c.qkv_bias || c.o_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.moe.num_experts, 128);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_intermediate_size, 768);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 0);
  const Counts h = by_hand(151936, 2048, 48, 32, 4, 128, 128, 8, 768, 0, false, false, 2 * 128);
  EXPECT_EQ(parameter_count(c), static_cast<std::int64_t>(h.total));
  EXPECT_DOUBLE_EQ(llama_parameter_count(c, true), h.active);
  // Qwen's figures: 30.5B parameters, 3.3B activated.
  EXPECT_NEAR(h.total / 1e9, 30.5, 0.05);
  EXPECT_NEAR(h.active / 1e9, 3.3, 0.1);
  // Without head_dim: hidden / heads (Qwen3MoeAttention's getattr fallback); norm_topk_prob's default false.
  const LlamaConfig d = llama_config_from_hf_json(set(set(kQwen3Moe, "head_dim", ""), "norm_topk_prob", ""), "bare");
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_FALSE(d.moe.norm_topk_prob);
}

TEST(MoeConfig, OlmoeConfigJson) {
  const LlamaConfig c = llama_config_from_hf_json(kOlmoe, "OLMoE-1B-7B");
  EXPECT_EQ(c.model_type, "olmoe");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.qk_norm_whole);
  EXPECT_FALSE(c.qkv_bias || c.o_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.moe.num_experts, 64);
  EXPECT_EQ(c.moe.top_k, 8);
  EXPECT_EQ(c.moe.expert_intermediate_size, 1024);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.moe.router_aux_loss_coef, 0.01);
  const Counts h = by_hand(50304, 2048, 16, 16, 16, 128, 64, 8, 1024, 0, false, false, 2048 + 2048);
  EXPECT_EQ(parameter_count(c), static_cast<std::int64_t>(h.total));
  EXPECT_DOUBLE_EQ(llama_parameter_count(c, true), h.active);
  // AI2's figures: 6.9B parameters, 1.3B active.
  EXPECT_NEAR(h.total / 1e9, 6.9, 0.05);
  EXPECT_NEAR(h.active / 1e9, 1.3, 0.05);
  const LlamaConfig b = llama_config_from_hf_json(set(kOlmoe, "attention_bias", "true"), "bias");
  EXPECT_TRUE(b.qkv_bias && b.o_bias);
}

TEST(MoeConfig, DeepSeekRoutingKeysAndCapacity) {
  std::string s = set(kQwen3Moe, "scoring_func", "\"sigmoid\"");
  s = set(s, "n_group", "8");
  s = set(s, "topk_group", "4");
  s = set(s, "routed_scaling_factor", "2.5");
  s = set(s, "n_shared_experts", "2");
  s = set(s, "first_k_dense_replace", "3");
  s = set(s, "capacity_factor", "1.25");
  s = set(s, "min_capacity", "8");
  const LlamaConfig c = llama_config_from_hf_json(s, "deepseek-routed");
  EXPECT_EQ(c.moe.score, MoeConfig::Score::sigmoid);
  EXPECT_EQ(c.moe.n_group, 8);
  EXPECT_EQ(c.moe.topk_group, 4);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 2 * 768);
  EXPECT_FALSE(c.moe.shared_expert_gate);
  EXPECT_EQ(c.moe.first_k_dense, 3);
  EXPECT_EQ(c.moe.sparse_layers(48), 45);
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.moe.min_capacity, 8);
  // The dense layers hold intermediate_size, the sparse ones the router, experts and shared experts.
  const double C = 2048, attn = 2 * C + (32 * 128 + 2 * 4 * 128) * C + C * 32 * 128 + 2 * 128;
  const double sparse = 128 * C + 128 * 3 * C * 768 + 3 * C * 1536, dense = 3 * C * 6144;
  EXPECT_DOUBLE_EQ(llama_parameter_count(c, false), 2 * 151936 * C + 48 * attn + 45 * sparse + 3 * dense + C);
  expect_round_trip(c);
  // The same keys on a Mixtral config.
  std::string m = set(small(kMixtral), "scoring_func", "\"sigmoid\"");
  m = set(m, "n_shared_experts", "1");
  const LlamaConfig mc = llama_config_from_hf_json(m, "mixtral-routed");
  EXPECT_EQ(mc.moe.shared_expert_intermediate_size, 40);
  expect_round_trip(mc);
}

// DeepSpeed MoE's drop_tokens (deepspeed.moe.layer.MoE; false: nothing dropped whatever the
// capacity factor) from config.json and the moe: descriptor's -nodrop, written back.
TEST(MoeConfig, DropTokensFromConfigJsonAndDescriptor) {
  const std::string capped = set(small(kQwen3Moe), "capacity_factor", "0.5");
  EXPECT_TRUE(llama_config_from_hf_json(capped, "capped").moe.drop_tokens);  // DeepSpeed's default
  EXPECT_TRUE(llama_config_from_hf_json(capped, "capped").moe.drops());
  const LlamaConfig kept = llama_config_from_hf_json(set(capped, "drop_tokens", "false"), "kept");
  EXPECT_FALSE(kept.moe.drop_tokens);
  EXPECT_FALSE(kept.moe.drops());
  EXPECT_DOUBLE_EQ(kept.moe.capacity_factor, 0.5);
  EXPECT_NE(describe(kept.moe).find("drop_tokens false"), std::string::npos) << describe(kept.moe);
  expect_round_trip(kept);
  EXPECT_EQ(nlohmann::json::parse(llama_hf_config_json(kept))["drop_tokens"], false);
  EXPECT_FALSE(nlohmann::json::parse(llama_hf_config_json(llama_config_from_hf_json(capped, "capped"))).contains("drop_tokens"));
  expect_error_with([&] { llama_config_from_hf_json(set(capped, "drop_tokens", "\"no\""), "bad"); }, {"drop_tokens"});
  // The descriptor: -nodrop. With nothing dropped Hugging Face's Mixtral computes the model, so a
  // renormalised softmax one stays Mixtral-shaped; with drops it cannot.
  const LlamaConfig d = moe_config_from_spec("moe:L2-C64-H4-E4-K2-norm-CF0.5-nodrop");
  EXPECT_FALSE(d.moe.drop_tokens);
  EXPECT_DOUBLE_EQ(d.moe.capacity_factor, 0.5);
  EXPECT_EQ(d.model_type, "mixtral");
  expect_round_trip(d);
  EXPECT_TRUE(moe_config_from_spec("moe:L2-C64-H4-E4-K2-norm-CF0.5").moe.drop_tokens);
  EXPECT_EQ(moe_config_from_spec("moe:L2-C64-H4-E4-K2-norm-CF0.5").model_type, "qwen3_moe");
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-nodrop-nodrop"); }, {"nodrop is given twice"});
}

TEST(MoeConfig, RefusalsNameTheKey) {
  const std::string ds = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256})";
  expect_error_with([&] { llama_config_from_hf_json(ds, "ds"); }, {"multi-head latent attention", "kv_lora_rank", "qwen3_moe", "moe:"});
  EXPECT_TRUE(is_llama_family_json(ds));  // so that the registry's llama family says why
  expect_error_with([&] { llama_config_from_hf_json(set(ds, "model_type", "\"deepseek_v2\""), "ds2"); }, {"MLA"});
  expect_error_with([&] { llama_config_from_hf_json(set(kMixtral, "router_jitter_noise", "0.01"), "j"); }, {"router_jitter_noise", "0.01"});
  EXPECT_NO_THROW(llama_config_from_hf_json(set(kMixtral, "router_jitter_noise", "0.0"), "j0"));
  expect_error_with([&] { llama_config_from_hf_json(set(kOlmoe, "clip_qkv", "8.0"), "c"); }, {"clip_qkv", "8.0"});
  expect_error_with([&] { llama_config_from_hf_json(set(kMixtral, "num_experts_per_tok", "9"), "k"); }, {"num_experts_per_tok", "9"});
  expect_error_with([&] { llama_config_from_hf_json(set(set(kQwen3Moe, "n_group", "3"), "topk_group", "1"), "g"); }, {"n_group = 3"});
  expect_error_with([&] { llama_config_from_hf_json(set(set(kQwen3Moe, "n_group", "8"), "topk_group", "9"), "g"); }, {"topk_group"});
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen3Moe, "scoring_func", "\"tanh\""), "s"); }, {"scoring_func", "tanh"});
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen2Moe, "n_shared_experts", "2"), "both"); },
                    {"n_shared_experts", "shared_expert_intermediate_size"});
  // Keys a family does not have, or that no family dstrain reads has, are refused by name.
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen3Moe, "shared_expert_intermediate_size", "512"), "q3"); },
                    {"shared_expert_intermediate_size"});
  expect_error_with([&] { llama_config_from_hf_json(set(kMixtral, "decoder_sparse_step", "2"), "m"); }, {"decoder_sparse_step"});
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen3Moe, "topk_method", "\"noaux_tc\""), "t"); }, {"topk_method"});
  expect_error_with([&] { llama_config_from_hf_json(set(kMixtral, "attention_bias", "true"), "b"); }, {"attention_bias"});
  expect_error_with([&] { llama_config_from_hf_json(set(kMixtral, "num_local_experts", "0"), "e"); }, {"expert count"});
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen2Moe, "mlp_only_layers", "[-1]"), "l"); }, {"mlp_only_layers"});
  expect_error_with([&] { llama_config_from_hf_json(set(kQwen2Moe, "capacity_factor", "-1"), "cf"); }, {"capacity_factor"});
  expect_error_with([&] { llama_config_from_hf_json(set(kOlmoe, "head_dim", "64"), "hd"); }, {"head_dim"});
  // Neutral keys are ignored as for the dense families.
  EXPECT_NO_THROW(llama_config_from_hf_json(set(kOlmoe, "top_p", "0.9"), "neutral"));
}

TEST(MoeConfig, WrittenConfigJsonReadsBackTheSame) {
  for (const char* text : {kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe}) {
    const LlamaConfig c = llama_config_from_hf_json(small(text), "small");
    SCOPED_TRACE(c.model_type);
    expect_round_trip(c);
    LlamaConfig d = c;
    d.moe.output_router_logits = true;
    d.moe.router_aux_loss_coef = 0.03;
    d.moe.capacity_factor = 2.0;
    d.moe.min_capacity = 1;
    d.tie_word_embeddings = true;
    expect_round_trip(d);
    const nlohmann::json j = nlohmann::json::parse(llama_hf_config_json(c));
    EXPECT_EQ(j["model_type"], c.model_type);
    EXPECT_FALSE(j.contains("capacity_factor"));  // only where it is not DeepSpeed's default
  }
  // Qwen2-MoE's sparse-layer pattern and an ungated shared expert; Mixtral's window.
  LlamaConfig q = llama_config_from_hf_json(small(kQwen2Moe), "q");
  q.moe.decoder_sparse_step = 2;
  q.moe.mlp_only_layers = {1};
  expect_round_trip(q);
  q.moe.shared_expert_gate = false;
  q.moe.shared_expert_intermediate_size = 64;  // two experts of 32
  expect_round_trip(q);
  const LlamaConfig m = llama_config_from_hf_json(set(small(kMixtral), "sliding_window", "16"), "w");
  expect_round_trip(m);
  // What transformers reads: Mixtral's keys, Qwen's shared expert.
  const nlohmann::json mj = nlohmann::json::parse(llama_hf_config_json(llama_config_from_hf_json(kMixtral, "m")));
  EXPECT_EQ(mj["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(mj["num_local_experts"], 8);
  EXPECT_EQ(mj["intermediate_size"], 14336);
  const nlohmann::json qj = nlohmann::json::parse(llama_hf_config_json(llama_config_from_hf_json(kQwen2Moe, "q")));
  EXPECT_EQ(qj["shared_expert_intermediate_size"], 5632);
  EXPECT_EQ(qj["moe_intermediate_size"], 1408);
  EXPECT_FALSE(qj.contains("n_shared_experts"));
}

TEST(MoeConfig, DescriptorDefaults) {
  const LlamaConfig c = moe_config_from_spec("moe:L2-C64-H4-E4-K2");
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_kv_head, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_intermediate_size, 256);  // 8·64/3 = 171 rounded up to 256
  EXPECT_EQ(c.intermediate_size, 256);
  EXPECT_TRUE(c.moe.norm_topk_prob);  // Mixtral's rule by default
  EXPECT_EQ(c.moe.score, MoeConfig::Score::softmax);
  EXPECT_EQ(c.moe.n_group, 1);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 0);
  EXPECT_FALSE(c.moe.output_router_logits);
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, 0.0);
  EXPECT_EQ(c.moe.min_capacity, 4);
  EXPECT_EQ(c.moe.first_k_dense, 0);
  // A bare descriptor is Mixtral: its config.json and Llama's attention.
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_FALSE(c.qk_norm);
  expect_round_trip(c);
  // Not renormalised: Hugging Face's Mixtral cannot hold it, so Qwen3-MoE's config and attention.
  const LlamaConfig n = moe_config_from_spec("moe:L2-C64-H4-E4-K2-nonorm");
  EXPECT_FALSE(n.moe.norm_topk_prob);
  EXPECT_EQ(n.model_type, "qwen3_moe");
  EXPECT_TRUE(n.qk_norm);
  expect_round_trip(n);
  EXPECT_THROW(moe_config_from_spec("moe:L2-C64-H4-E4-K2-norm-nonorm"), Error);

  const LlamaConfig m = moe_config_from_spec("moe:L4-C256-H4-KV2-E8-K2-I512-norm-tied-V1000-T64");
  EXPECT_EQ(m.model_type, "mixtral");
  EXPECT_FALSE(m.qk_norm);
  EXPECT_TRUE(m.moe.norm_topk_prob);
  EXPECT_EQ(m.moe.expert_intermediate_size, 512);
  EXPECT_EQ(m.intermediate_size, 512);
  EXPECT_TRUE(m.tie_word_embeddings);
  EXPECT_EQ(m.padded_vocab_size, 1024);
  expect_round_trip(m);
  EXPECT_EQ(nlohmann::json::parse(llama_hf_config_json(m))["model_type"], "mixtral");
}

TEST(MoeConfig, DescriptorEveryPart) {
  const LlamaConfig c = moe_config_from_spec("moe:L4-C256-H8-KV2-D64-E16-K4-I128-S256-sigmoid-G4-TG2-RS2.5-norm-aux0.01-CF1.25-dense1-V500-T128");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.moe.num_experts, 16);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_EQ(c.moe.expert_intermediate_size, 128);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 256);
  EXPECT_FALSE(c.moe.shared_expert_gate);
  EXPECT_EQ(c.moe.score, MoeConfig::Score::sigmoid);
  EXPECT_EQ(c.moe.n_group, 4);
  EXPECT_EQ(c.moe.topk_group, 2);
  EXPECT_DOUBLE_EQ(c.moe.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.moe.router_aux_loss_coef, 0.01);
  EXPECT_TRUE(c.moe.output_router_logits);
  EXPECT_DOUBLE_EQ(c.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.moe.first_k_dense, 1);
  EXPECT_EQ(c.intermediate_size, 768);  // the dense layer: 8·256/3 rounded up to 256
  EXPECT_FALSE(c.moe.is_sparse_layer(0));
  EXPECT_TRUE(c.moe.is_sparse_layer(1));
  expect_round_trip(c);
  const nlohmann::json j = nlohmann::json::parse(llama_hf_config_json(c));
  EXPECT_EQ(j["n_shared_experts"], 2);
  EXPECT_EQ(j["scoring_func"], "sigmoid");
  EXPECT_EQ(j["first_k_dense_replace"], 1);
  // Each option alone leaves Mixtral's form.
  for (const char* extra : {"-S512", "-sigmoid", "-G2-TG1", "-RS2", "-CF1", "-dense1"}) {
    const LlamaConfig e = moe_config_from_spec(std::string("moe:L2-C64-H4-E4-K2-I256-norm") + extra);
    EXPECT_EQ(e.model_type, "qwen3_moe") << extra;
    expect_round_trip(e);
  }
  EXPECT_EQ(moe_config_from_spec("moe:L2-C64-H4-E4-K2-norm-aux0.02").model_type, "mixtral");
}

TEST(MoeConfig, DescriptorErrors) {
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4"); }, {"K is missing"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-K2"); }, {"E is missing"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K5"); }, {"num_experts_per_tok", "5"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-I32-S48"); }, {"S = 48", "multiple", "I = 32"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-G2"); }, {"TG"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E6-K2-G4-TG2"); }, {"n_group = 4"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-E8"); }, {"E is given twice"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-X3"); }, {"'X3'", "accepted forms"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-RSx"); }, {"'RSx'", "routed_scaling_factor"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E0-K2"); }, {"num_experts (E) must be at least 1"});
  expect_error_with([] { moe_config_from_spec("moe:L2-C64-H4-E4-K2-RS0"); }, {"routed_scaling_factor"});
  expect_error_with([] { moe_config_from_spec("moe:"); }, {"accepted forms"});
  expect_error_with([] { model_architecture("moe:L2-C63-H4-E4-K2"); }, {"not divisible"});
}

TEST(MoeConfig, RegistryFamilyAndArchitecture) {
  const auto a = model_architecture("moe:L3-C64-H4-KV2-E4-K2-I32-norm-V300-T32");
  EXPECT_EQ(a->family().name(), "llama");  // checkpoints rebuild it through the llama family's reader
  EXPECT_EQ(model_family("moe").name(), "moe");
  EXPECT_EQ(a->hf_model_type(), "mixtral");
  const LlamaConfig& c = *llama_config_of(*a);
  const auto b = model_family(a->family().name()).from_config_json(a->config_json(), "manifest");
  expect_same(*llama_config_of(*b), c);
  EXPECT_EQ(b->config_json(), a->config_json());
  EXPECT_EQ(b->describe(), a->describe());
  EXPECT_EQ(model_family("moe").from_config_json(a->config_json(), "manifest")->config_json(), a->config_json());
  EXPECT_NE(a->describe().find("4 experts of 32, top-2"), std::string::npos) << a->describe();
  EXPECT_NO_THROW(a->check_tensor_parallel(2));

  // Every expert stored; FLOPs over the active ones: the router, top_k experts, the shared experts.
  const double C = 64, V = 300, Vp = 384, attn = 2 * C + (4 * 16 + 2 * 2 * 16) * C + C * 4 * 16;
  const double total = 2 * V * C + 3 * (attn + 4 * C + 4 * 3 * C * 32) + C, active = 2 * V * C + 3 * (attn + 4 * C + 2 * 3 * C * 32) + C;
  EXPECT_DOUBLE_EQ(a->parameter_count(), total);
  EXPECT_DOUBLE_EQ(a->stored_parameter_count(), total + 2 * (Vp - V) * C);
  EXPECT_DOUBLE_EQ(a->flops_per_token(32), 6 * (active + 2 * (Vp - V) * C) + 6 * 3 * 64 * 32);
  const ModuleFlops f = a->forward_flops(2, 32);
  EXPECT_EQ(static_cast<double>(f.params), a->stored_parameter_count());
  // The sparse block's work: router, top-2 of 4 experts (3 matmuls each) per token.
  const ModuleFlops& block = f.children.at(0).children.at(1).children.at(0).children.at(1);
  EXPECT_EQ(block.name, "block_sparse_moe");
  EXPECT_EQ(block.type, "MixtralSparseMoeBlock");
  EXPECT_EQ(block.macs, 64 * (64 * 4 + 2 * 3 * 64 * 32));

  // The layers' copies: all-sparse models keep their settings; mixed ones have none.
  const auto two = a->with_n_layer(2);
  ASSERT_NE(two, nullptr);
  EXPECT_TRUE(llama_config_of(*two)->moe == c.moe);
  EXPECT_EQ(model_architecture("moe:L3-C64-H4-E4-K2-I32-dense1")->with_n_layer(1), nullptr);
}

TEST(MoeConfig, HfParamNamesListEachExpert) {
  const auto a = model_architecture("moe:L2-C64-H4-KV2-E4-K2-I32-norm-V300-T32");
  std::map<std::string, HfParamName> by_name;
  for (const HfParamName& p : a->hf_param_names()) by_name[p.name] = p;
  ASSERT_EQ(by_name.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"), 1u);
  const HfParamName& w2 = by_name["model.layers.1.block_sparse_moe.experts.3.w2.weight"];
  EXPECT_EQ(w2.param, "model.layers.1.mlp.experts.down_proj.weight");
  EXPECT_TRUE(w2.shape == (Shape{64, 32}));
  EXPECT_TRUE(w2.split.is_replicated());
  EXPECT_EQ(w2.module, HfModuleKind::linear);
  EXPECT_EQ(by_name["model.layers.0.block_sparse_moe.gate.weight"].param, "model.layers.0.mlp.gate.weight");
  EXPECT_TRUE(by_name["model.layers.0.block_sparse_moe.gate.weight"].shape == (Shape{4, 64}));
  EXPECT_EQ(by_name.count("model.layers.0.mlp.gate_proj.weight"), 0u);  // no dense MLP in a sparse layer
  EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_proj.weight"), 1u);
  EXPECT_EQ(by_name.count("model.layers.0.input_layernorm.weight"), 1u);
  // 2 layers × (router + 4 experts × 3) + attention, norms, embeddings.
  std::size_t experts = 0;
  for (const auto& [n, p] : by_name) experts += n.find(".experts.") != std::string::npos ? 1 : 0;
  EXPECT_EQ(experts, 2u * 4 * 3);

  // Qwen2-MoE: a dense layer (mlp_only_layers) keeps its MLP; the gated shared expert.
  LlamaConfig q = llama_config_from_hf_json(small(kQwen2Moe), "q");
  q.moe.mlp_only_layers = {0};
  const LlamaArchitecture qa(q);
  std::set<std::string> names;
  for (const HfParamName& p : qa.hf_param_names()) names.insert(p.name);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(names.count("model.layers.1.mlp.experts.7.up_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.1.mlp.shared_expert.down_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.1.mlp.shared_expert_gate.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.1.mlp.gate_proj.weight"), 0u);

  // OLMoE's q/k norms over the whole projections: cut with the heads under tensor parallelism
  // (rows in the units of q_proj's and k_proj's blocks), each rank's gradient its own piece's.
  const LlamaArchitecture oa(llama_config_from_hf_json(small(kOlmoe), "o"));
  int norms = 0;
  for (const HfParamName& p : oa.hf_param_names()) {
    if (p.name == "model.layers.0.self_attn.q_norm.weight") {
      EXPECT_TRUE(p.shape == (Shape{64}));
      EXPECT_EQ(p.split.describe(), "rows [64/32]");
      ++norms;
    }
    if (p.name == "model.layers.0.self_attn.k_norm.weight") {
      EXPECT_TRUE(p.shape == (Shape{32}));
      EXPECT_EQ(p.split.describe(), "rows [32/16]");
      ++norms;
    }
    if (p.name.ends_with("_norm.weight") && p.name.find("self_attn") != std::string::npos) {
      EXPECT_EQ(p.module, HfModuleKind::norm);
      EXPECT_FALSE(p.grad_summed) << p.name;
    }
  }
  EXPECT_EQ(norms, 2);
}

// OLMoE trains under tensor parallelism: the q/k norm weights become the rank's pieces, the heads'
// columns of the whole projections (4 query heads in 2 groups sharing 2 key/value heads of 16).
TEST(MoeConfig, OlmoeQkNormsAreCutWithTheHeads) {
  const auto arch = std::make_shared<LlamaArchitecture>(llama_config_from_hf_json(small(kOlmoe), "o"));
  for (const int tp : {2, 4}) EXPECT_NO_THROW(arch->check_tensor_parallel(tp)) << tp;
  const auto piece_of = [&](int rank, int ranks, const std::string& name) -> Shape {
    for (const auto& layer : arch->make_tensor_parallel_layers({rank, ranks})) {
      for (const ParamSpec& ps : layer->params())
        if (ps.name == name) return ps.shape;
    }
    ADD_FAILURE() << name << " not found";
    return {};
  };
  EXPECT_TRUE(piece_of(0, 2, "model.layers.1.self_attn.q_norm.weight") == (Shape{32}));
  EXPECT_TRUE(piece_of(1, 2, "model.layers.1.self_attn.k_norm.weight") == (Shape{16}));
  // 2 key/value heads over 4 ranks: 1, 1, 0, 0 — the surplus ranks hold no norm columns.
  EXPECT_TRUE(piece_of(1, 4, "model.layers.0.self_attn.q_norm.weight") == (Shape{32}));
  EXPECT_TRUE(piece_of(3, 4, "model.layers.0.self_attn.q_norm.weight") == (Shape{0}));
  EXPECT_TRUE(piece_of(2, 4, "model.layers.0.self_attn.k_norm.weight") == (Shape{0}));
}
