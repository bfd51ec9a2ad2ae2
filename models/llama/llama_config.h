// LlamaConfig: the shape of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM,
// TinyLlama), from a descriptor or a Hugging Face config.json. docs/models.md lists every key.
//
// Specs accepted by llama_config_from_spec:
//   llama:L<n>-C<c>-H<h>[-KV<k>][-I<i>][-D<d>][-V<v>][-T<t>][-tied]
//       L layers, C hidden size, H query heads (all required); KV key/value heads (default H);
//       I MLP width (default: 8C/3 rounded up to a multiple of 256, Meta's Llama rule); D head
//       size (default C / H); V vocabulary (default 32000); T max positions (default 2048);
//       "tied": the LM head shares the token embedding. rope_theta 10000, rms_norm_eps 1e-5
//       (Llama 2/3), no biases, no rope scaling, no dropout. E.g. llama:L4-C256-H4-KV2-I688.
//   <path>/config.json (or its folder): architectures / model_type LlamaForCausalLM (llama),
//       MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3).
// padded_vocab_size is vocab_size rounded up to a multiple of 128, as for GPT-2.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "models/moe_config.h"
#include "ops/kernels/rope.h"

namespace dstrain {

struct LlamaConfig {
  std::string model_type = "llama";             // llama, mistral, qwen2, qwen3: names the family on export
  std::int64_t n_layer = 32;                    // num_hidden_layers
  std::int64_t n_head = 32;                     // num_attention_heads
  std::int64_t n_kv_head = 32;                  // num_key_value_heads (divides n_head)
  std::int64_t n_embd = 4096;                   // hidden_size
  std::int64_t head_dim = 128;                  // head_dim (Qwen3: not hidden_size / heads)
  std::int64_t intermediate_size = 11008;       // the SwiGLU MLP width
  std::int64_t vocab_size = 32000;              // V
  std::int64_t padded_vocab_size = 32000;       // Vp: V rounded up to a multiple of 128 (zero rows)
  std::int64_t max_position_embeddings = 2048;  // max T
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;            // q/k/v projections with bias (Qwen2; attention_bias)
  bool o_bias = false;              // o_proj with bias (Llama / Qwen3 attention_bias)
  bool mlp_bias = false;            // gate/up/down with bias (Llama's mlp_bias)
  bool qk_norm = false;             // RMSNorm of each q and k head before RoPE (Qwen3)
  // OLMoE: RMSNorm over the whole q projection (weight NH·D) and the whole k projection (NKV·D)
  // before the heads are cut and rotated, instead of Qwen3's per head. Implies qk_norm.
  bool qk_norm_whole = false;
  float attention_dropout = 0.0f;   // on the attention probabilities
  float initializer_range = 0.02f;  // init std of every linear and embedding weight
  // Sliding-window attention (Mistral; Qwen with use_sliding_window): each query sees the last
  // `sliding_window` keys (itself included). 0: none. Mistral's window acts on every layer and is
  // computed (attention_window); Qwen's acts on some layers only, and a sequence it would mask is
  // refused (llama_check_sequence), naming the key.
  std::int64_t sliding_window = 0;
  // Qwen2/Qwen3: which layers the window acts on, as Hugging Face reads config.json — layer i when
  // use_sliding_window and i >= max_window_layers, or where layer_types says "sliding_attention".
  // Kept as read so that the config.json dstrain writes windows the same layers (docs/models.md
  // §3.4). A config not read from JSON leaves them unset: a qwen sliding_window then acts on every
  // layer (written as use_sliding_window with max_window_layers 0).
  bool use_sliding_window = false;
  std::int64_t max_window_layers = 0;
  std::vector<std::string> layer_types;
  // Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; models/moe_config.h): the sparse
  // layers' feed-forward; moe.active() false for a dense model.
  MoeConfig moe;

  // The window every layer's attention applies: Mistral's sliding_window; 0 (causal) otherwise.
  std::int64_t attention_window() const { return model_type == "mistral" ? sliding_window : 0; }
  std::int64_t q_dim() const { return n_head * head_dim; }
  std::int64_t kv_dim() const { return n_kv_head * head_dim; }
  std::int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Throws Error naming the field when the config is inconsistent (sizes <= 0, n_kv_head not
// dividing n_head, odd head_dim, head_dim above the attention kernel's maximum, rope parameters).
void validate(const LlamaConfig& cfg);

// Error naming the key when T exceeds max_position_embeddings, or when a sliding window shorter
// than T would mask keys where dstrain does not compute it: Qwen's per-layer windows, and any
// window on a CUDA device (`cuda`: its attention kernels are full causal).
void llama_check_sequence(const LlamaConfig& cfg, std::int64_t T, bool cuda = false);

// A descriptor or a config.json path (see the top of this file).
LlamaConfig llama_config_from_spec(std::string_view spec);
// Parses the text of a Hugging Face config.json of the Llama family; `source` names it in errors.
LlamaConfig llama_config_from_hf_json(std::string_view json_text, std::string_view source);
// True when the JSON text is a config of the Llama family (model_type or architectures say so),
// for a caller choosing between GPT-2 and Llama from a config.json.
bool is_llama_family_json(std::string_view json_text);
// The model_types (and architectures) of those configs, for messages:
// "\"llama\" (LlamaForCausalLM), \"mistral\" (MistralForCausalLM), ...".
std::string llama_family_hf_forms();

// Parameters with the real vocabulary (the LM head counted once when tied).
std::int64_t parameter_count(const LlamaConfig& cfg);

// The Hugging Face config.json of this model (architectures, model_type and every key that
// shapes it), so that transformers loads weights written by export_llama_weights as they are.
std::string llama_hf_config_json(const LlamaConfig& cfg);

// One line for the top of a run.
std::string describe(const LlamaConfig& cfg);

// The prefix of the model's Hugging Face class names: "Llama", "Mistral", "Qwen2", "Qwen3"
// (LlamaDecoderLayer, Qwen2RMSNorm, ...).
std::string llama_class_prefix(const LlamaConfig& cfg);

}  // namespace dstrain
