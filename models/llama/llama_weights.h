// Llama-family weights in the Hugging Face layout: one model.safetensors, or shards
// model-00001-of-0000N.safetensors with model.safetensors.index.json ({"metadata": {"total_size"},
// "weight_map": {tensor: shard file}}), as transformers' save_pretrained writes them; tensors in
// F32, F16 or BF16 on disk, converted to the parameters' dtype.
//
// Names: model.embed_tokens.weight, model.layers.N.{input_layernorm, post_attention_layernorm}.weight,
// model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.N.self_attn.{q,k}_norm.weight
// (Qwen3), model.layers.N.mlp.{gate,up,down}_proj.{weight,bias}, model.norm.weight, lm_head.weight
// (absent when tie_word_embeddings). Each HF tensor is a contiguous range of one of dstrain's
// parameters: q_proj, k_proj and v_proj are the row blocks of the fused qkv_proj (llama_layers.h);
// embed_tokens and lm_head hold the first V rows of the padded (Vp, C) tables (rows [V, Vp) are
// zero after import and not written). Ignored on import: rotary_emb.inv_freq buffers (older
// checkpoints store them; they are recomputed from the config) and lm_head.weight when the
// embeddings are tied. Any other unexpected tensor, a missing one or a wrong shape is an Error
// naming the tensor, the file, the shape expected and the shape found.
//
// Mixture of experts (LlamaConfig::moe). dstrain's parameters of a sparse layer N (p =
// "model.layers.N."; E experts of width I, shared width S), fixed names the MoE layer declares:
//   p+"mlp.gate.weight" (E, C)                                   the router
//   p+"mlp.experts.{gate_proj,up_proj}.weight" (E, I, C), p+"mlp.experts.down_proj.weight" (E, C, I)
//                                                                all experts stacked
//   p+"mlp.shared_expert.{gate_proj,up_proj}.weight" (S, C), p+"mlp.shared_expert.down_proj.weight"
//   (C, S) when S > 0, and p+"mlp.shared_expert_gate.weight" (1, C) when the shared expert is gated
// A dense layer of an MoE model keeps p+"mlp.{gate,up,down}_proj.weight" (intermediate_size).
// OLMoE's q/k norms: p+"self_attn.q_norm.weight" (NH·D), p+"self_attn.k_norm.weight" (NKV·D).
// Their Hugging Face names — expert e is the e-th block of the stacked parameter:
//   mixtral: p+"block_sparse_moe.gate.weight", p+"block_sparse_moe.experts.{e}.w1.weight" (gate
//            (I, C)), ".w3.weight" (up (I, C)), ".w2.weight" (down (C, I))
//   qwen2_moe, qwen3_moe, olmoe: p+"mlp.gate.weight", p+"mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight"
//   shared: p+"mlp.shared_expert.{gate_proj,up_proj,down_proj}.weight" and p+"mlp.shared_expert_gate.weight"
//           (Qwen2-MoE, gated); p+"mlp.shared_experts.{gate_proj,up_proj,down_proj}.weight" (DeepSeek's, ungated)
// DeepSeek-V3's p+"mlp.gate.e_score_correction_bias" is refused on import, naming it (dstrain's router
// has no score-correction bias).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "models/llama/llama_config.h"

namespace dstrain {

// dstrain's parameter with this name (shape as the layers' ParamSpecs, floating dtype, on the cpu).
using LlamaParamLookup = std::function<Tensor(const std::string& name)>;

// One tensor of the Hugging Face files: elements [offset, offset + numel) of dstrain's parameter
// `ours` (of shape ours_shape), with the Hugging Face shape `hf`.
struct LlamaHfTensor {
  std::string name;
  std::string ours;
  Shape ours_shape;
  std::int64_t offset = 0;
  std::vector<std::int64_t> hf;
  std::int64_t numel() const;
};

// Every tensor of the model's Hugging Face files, in the order export writes them (per layer).
// The sparse layers' feed-forward and OLMoE's q/k norms come from the config under the names
// above; every other parameter from the layers' ParamSpecs.
std::vector<LlamaHfTensor> llama_hf_tensors(const LlamaConfig& cfg);
// True for a parameter llama_hf_tensors takes from the config (a sparse layer's "mlp." parameters,
// OLMoE's whole-projection q/k norm weights) rather than from the layers' ParamSpecs.
bool llama_param_from_config(const LlamaConfig& cfg, const std::string& param);

// transformers' default max_shard_size ("5GB" = 5·10⁹ bytes).
inline constexpr std::size_t kDefaultMaxShardBytes = 5'000'000'000;

// `path`: a .safetensors file, a .safetensors.index.json, or a folder holding
// model.safetensors.index.json or model.safetensors.
void import_llama_weights(const std::filesystem::path& path, const LlamaConfig& cfg, const LlamaParamLookup& param);

// Writes the parameters in the HF layout with dtype `file_dtype`. `file` names the single file
// (e.g. out/model.safetensors); when the tensors exceed max_shard_bytes they go to shards
// <stem>-0000i-of-0000N.safetensors beside it, each at most max_shard_bytes unless one tensor
// alone is larger, with <file>.index.json, and `file` itself is not written. Every file is
// written atomically, the index last. Metadata {"format": "pt"}.
void export_llama_weights(const std::filesystem::path& file, const LlamaConfig& cfg, const LlamaParamLookup& param, DType file_dtype = DType::fp32,
                          std::size_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace dstrain
