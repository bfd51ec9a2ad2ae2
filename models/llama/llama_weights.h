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
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>

#include "ops/dtype.h"
#include "ops/tensor.h"
#include "models/llama/llama_config.h"

namespace dstrain {

// dstrain's parameter with this name (shape as the layers' ParamSpecs, floating dtype, on the cpu).
using LlamaParamLookup = std::function<Tensor(const std::string& name)>;

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
