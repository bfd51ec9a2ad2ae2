// LlamaConfig: the shape of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM,
// TinyLlama) and of its mixture-of-experts relatives (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE), from a
// descriptor or a Hugging Face config.json. docs/models.md lists every key.
//
// Specs accepted by llama_config_from_spec:
//   llama:L<n>-C<c>-H<h>[-KV<k>][-I<i>][-D<d>][-V<v>][-T<t>][-tied]
//       L layers, C hidden size, H query heads (all required); KV key/value heads (default H);
//       I MLP width (default: 8C/3 rounded up to a multiple of 256, Meta's Llama rule); D head
//       size (default C / H); V vocabulary (default 32000); T max positions (default 2048);
//       "tied": the LM head shares the token embedding. rope_theta 10000, rms_norm_eps 1e-5
//       (Llama 2/3), no biases, no rope scaling, no dropout. E.g. llama:L4-C256-H4-KV2-I688.
//   <path>/config.json (or its folder): architectures / model_type LlamaForCausalLM (llama),
//       MistralForCausalLM (mistral), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3),
//       MixtralForCausalLM (mixtral), Qwen2MoeForCausalLM (qwen2_moe), Qwen3MoeForCausalLM
//       (qwen3_moe), OlmoeForCausalLM (olmoe). DeepSeek-V2/V3 configs are refused (their
//       multi-head latent attention is not built).
//
// Specs accepted by moe_config_from_spec (the "moe" family, models/model_registry.cpp):
//   moe:L<n>-C<c>-H<h>-E<experts>-K<top_k>[-KV<k>][-I<expert width>][-D<d>][-V<v>][-T<t>]
//       [-S<shared width>][-tied][-sigmoid][-G<n_group>-TG<topk_group>][-RS<routed_scaling_factor>]
//       [-norm|-nonorm][-aux<coef>][-CF<capacity_factor>][-nodrop][-dense<first_k_dense>]
//       Parts in any order, each at most once. L, C, H, KV, D, V, T, tied as llama: (rope_theta
//       10000, rms_norm_eps 1e-5, no biases). E experts, K experts per token (both required).
//       I each expert's SwiGLU width (default: the llama: MLP width, 8C/3 rounded up to a multiple
//       of 256 — each expert the dense MLP it replaces, as DeepSpeed MoE copies the expert).
//       S: shared experts of total width S that every token goes through, ungated (DeepSeek's
//       n_shared_experts = S / I; S must be a multiple of I); default none. -sigmoid: sigmoid
//       scores (default softmax). -G/-TG: DeepSeek's group-limited routing, given together
//       (default one group). -RS: routed_scaling_factor (default 1). -norm / -nonorm: renormalise
//       the top-k weights to sum 1 (norm_topk_prob), or not (default: renormalised, Mixtral's rule;
//       -nonorm is Qwen-MoE's and OLMoE's default).
//       -aux<coef>: add the load-balancing loss × coef (output_router_logits true); default off
//       (router_aux_loss_coef 0.001 kept, output_router_logits false). -CF: DeepSpeed's
//       capacity_factor (default 0: dropless; min_capacity 4); -nodrop: DeepSpeed's drop_tokens
//       false (nothing dropped whatever CF). -dense<k>: the first k layers keep
//       a dense MLP (first_k_dense_replace) of the llama: default width 8C/3 rounded up to 256.
//       The config it writes, and so its attention: "mixtral" (Llama's attention: no biases, no
//       q/k norm) when Hugging Face's Mixtral computes exactly this model — softmax, -norm, no
//       shared experts, no groups, RS 1, no dense layers, nothing dropped; otherwise "qwen3_moe"
//       (Qwen3-MoE's attention: RMSNorm per q and k head) with the DeepSeek keys it needs.
//       E.g. moe:L4-C256-H4-KV2-E8-K2-I512-norm (Mixtral-like), moe:L4-C256-H4-E16-K4-I128-S256-sigmoid-G4-TG2-RS2.5-norm-dense1.
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
  // llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, olmoe: names the family on export
  std::string model_type = "llama";
  std::int64_t n_layer = 32;                    // num_hidden_layers
  std::int64_t n_head = 32;                     // num_attention_heads
  std::int64_t n_kv_head = 32;                  // num_key_value_heads (divides n_head)
  std::int64_t n_embd = 4096;                   // hidden_size
  std::int64_t head_dim = 128;                  // head_dim (Qwen3: not hidden_size / heads)
  // The dense SwiGLU MLP width (an MoE model's dense layers; Mixtral/OLMoE: equal to the experts' width)
  std::int64_t intermediate_size = 11008;
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

  // The window every layer's attention applies: Mistral's and Mixtral's sliding_window; 0 (causal) otherwise.
  std::int64_t attention_window() const { return model_type == "mistral" || model_type == "mixtral" ? sliding_window : 0; }
  std::int64_t q_dim() const { return n_head * head_dim; }
  std::int64_t kv_dim() const { return n_kv_head * head_dim; }
  std::int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// True for the mixture-of-experts model_types: mixtral, qwen2_moe, qwen3_moe, olmoe.
bool is_moe_model_type(std::string_view model_type);

// Throws Error naming the field when the config is inconsistent (sizes <= 0, n_kv_head not
// dividing n_head, odd head_dim, head_dim above the attention kernel's maximum, rope parameters,
// validate(moe), MoE settings the model_type's config.json cannot hold).
void validate(const LlamaConfig& cfg);

// Error naming the key when T exceeds max_position_embeddings, or when a sliding window shorter
// than T would mask keys where dstrain does not compute it: Qwen's per-layer windows, and any
// window on a CUDA device (`cuda`: its attention kernels are full causal).
void llama_check_sequence(const LlamaConfig& cfg, std::int64_t T, bool cuda = false);

// A descriptor or a config.json path (see the top of this file).
LlamaConfig llama_config_from_spec(std::string_view spec);
// A moe: descriptor (see the top of this file), validated.
LlamaConfig moe_config_from_spec(std::string_view spec);
// The forms of moe: descriptors, for messages.
std::string moe_spec_forms();
// Parses the text of a Hugging Face config.json of the Llama family; `source` names it in errors.
LlamaConfig llama_config_from_hf_json(std::string_view json_text, std::string_view source);
// True when the JSON text is a config of the Llama family (model_type or architectures say so),
// for a caller choosing between GPT-2 and Llama from a config.json.
bool is_llama_family_json(std::string_view json_text);
// The model_types (and architectures) of those configs, for messages:
// "\"llama\" (LlamaForCausalLM), \"mistral\" (MistralForCausalLM), ...".
std::string llama_family_hf_forms();

// Parameters with the real vocabulary (the LM head counted once when tied), every expert counted.
std::int64_t parameter_count(const LlamaConfig& cfg);
// The same in double (exact below 2^53): every parameter, or with active_only those one token
// goes through — in a sparse layer the router, top_k experts and the shared experts instead of
// all E experts (the figure behind Mixtral-8x7B's "12.9B active of 46.7B").
double llama_parameter_count(const LlamaConfig& cfg, bool active_only);

// The Hugging Face config.json of this model (architectures, model_type and every key that
// shapes it), so that transformers loads weights written by export_llama_weights as they are.
std::string llama_hf_config_json(const LlamaConfig& cfg);

// One line for the top of a run.
std::string describe(const LlamaConfig& cfg);

// The prefix of the model's Hugging Face class names: "Llama", "Mistral", "Qwen2", "Qwen3",
// "Mixtral", "Qwen2Moe", "Qwen3Moe", "Olmoe" (LlamaDecoderLayer, Qwen2RMSNorm, ...).
std::string llama_class_prefix(const LlamaConfig& cfg);

}  // namespace dstrain
