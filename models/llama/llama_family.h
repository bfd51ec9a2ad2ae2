// The Llama family as a model family (models/model_family.h): "llama:" descriptors and the
// config.json files of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
// and the mixtures of experts MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM,
// OlmoeForCausalLM ("moe:" descriptors: the "moe" family, sharing LlamaArchitecture), their layers, FLOPs tree and Hugging Face weights (sharded above 5 GB).
// Registered in models/model_registry.cpp.
#pragma once

#include <memory>
#include <string_view>

#include "models/llama/llama_config.h"
#include "models/model.h"
#include "models/model_family.h"

namespace dstrain {

class LlamaArchitecture final : public Architecture {
 public:
  explicit LlamaArchitecture(const LlamaConfig& cfg);  // validates
  const LlamaConfig& config() const { return cfg_; }

  const ModelFamily& family() const override;
  std::int64_t n_layer() const override { return cfg_.n_layer; }
  std::int64_t n_embd() const override { return cfg_.n_embd; }
  std::int64_t n_positions() const override { return cfg_.max_position_embeddings; }
  std::int64_t vocab_size() const override { return cfg_.vocab_size; }
  std::int64_t padded_vocab_size() const override { return cfg_.padded_vocab_size; }
  std::string n_positions_key() const override { return "max_position_embeddings"; }
  double parameter_count() const override;
  double stored_parameter_count() const override;
  std::string describe() const override;
  std::vector<std::unique_ptr<Layer>> make_layers() const override;
  void check_tensor_parallel(int ranks) const override;
  std::vector<std::unique_ptr<Layer>> make_tensor_parallel_layers(TensorParallelRank tp) const override;
  std::shared_ptr<const Architecture> with_n_layer(std::int64_t n_layer) const override;
  void check_sequence_parallel(int sp_ranks, int tp_ranks) const override;
  std::vector<std::unique_ptr<Layer>> make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp) const override;
  // Expert parallelism: a model with sparse layers whose expert count (num_local_experts /
  // num_experts) divides by the ranks; each rank's sparse layers hold E/EP experts.
  void check_expert_parallel(int ranks) const override;
  std::vector<std::unique_ptr<Layer>> make_parallel_layers(TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) const override;
  const MoeConfig* moe_config() const override { return cfg_.moe.active() ? &cfg_.moe : nullptr; }
  std::shared_ptr<const Architecture> with_moe_config(const MoeConfig& moe) const override;
  void check_sequence(std::int64_t T, const Device& device) const override;
  // 6·N + 6·L·(n_head·head_dim)·T: PaLM's attention term with the query width, which Qwen3's
  // head_dim makes differ from the hidden size. N: the ACTIVE stored parameters — in a sparse
  // layer the router, top_k experts and the shared experts, as a token goes through them.
  double flops_per_token(std::int64_t T) const override;
  ModuleFlops forward_flops(std::int64_t B, std::int64_t T) const override;
  std::string hf_model_type() const override { return cfg_.model_type; }
  // LlamaForCausalLM's names (dstrain's, but q_proj, k_proj and v_proj are the row blocks of the
  // fused qkv_proj, each with its part of the split); Qwen3's q/k norm weights are replicated with
  // their gradients summed over the group.
  std::vector<HfParamName> hf_param_names() const override;
  std::string config_json() const override;
  void import_weights(const std::filesystem::path& path, const ParamLookup& param) const override;
  void export_weights(const std::filesystem::path& path, const ParamLookup& param, DType file_dtype) const override;

 private:
  LlamaConfig cfg_;
};

// The family: name "llama"; reads a config.json whose model_type or architectures name one of its
// models.
const ModelFamily& llama_family();
std::shared_ptr<const ModelFamily> llama_family_ptr();
// The "moe" family: moe: descriptors (llama_config.h), LlamaArchitectures whose family() is the
// llama family, which reads the config.json they write. Registered in models/model_registry.cpp.
std::shared_ptr<const ModelFamily> moe_family_ptr();

// The model of `cfg` (validated), or of a llama: spec or config.json.
Model make_llama_model(const LlamaConfig& cfg);
Model make_llama_model(std::string_view spec);

// The config of a Llama-family architecture; nullptr for another family's.
const LlamaConfig* llama_config_of(const Architecture& architecture);

// The forward pass's module tree in Hugging Face's names (LlamaForCausalLM > model >
// {embed_tokens, layers > LlamaDecoderLayer × L > {self_attn > {q_proj, k_proj, v_proj, o_proj},
// mlp > {gate_proj, up_proj, down_proj, act_fn}, input_layernorm, post_attention_layernorm}, norm},
// lm_head), with the conventions of models/module_flops.h: attention's QKᵀ and AV over every head
// and the full T×T, softmax one FLOP per score, RoPE 3 per element of q and k, the SiLU and the
// gate-times-up product 1 per element each, RMSNorm 4 per element, residual adds 1 per element.
ModuleFlops llama_forward_flops(const LlamaConfig& cfg, std::int64_t B, std::int64_t T);

}  // namespace dstrain
