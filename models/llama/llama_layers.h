// The three layer kinds of the Llama family (pre-norm decoder; Hugging Face's LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM):
//   LlamaEmbedding  tokens (B, T) -> x (B, T, C): embed_tokens[token] (no position embedding)
//   LlamaBlock      x -> h = x + o_proj(attn(rope(qkv(rmsnorm(x))))) -> h + down(silu(gate(n)) * up(n)),
//                   n = rmsnorm(h); grouped-query attention with num_key_value_heads; optional
//                   q/k/v (and o, MLP) biases; Qwen3's q/k head RMSNorm before RoPE
//   LlamaHead       x -> model.norm -> logits = norm(x) · lm_headᵀ over the padded vocab (tied to
//                   embed_tokens or its own weight) -> fused softmax cross-entropy
//
// Parameter names are Hugging Face's ("model.layers.3.mlp.gate_proj.weight"), except that the
// q, k and v projections are ONE parameter, "model.layers.N.self_attn.qkv_proj.weight" of shape
// ((NH + 2·NKV)·D, C) (and ".bias"), rows [q_proj | k_proj | v_proj]: one GEMM writes the fused
// attention input the attention kernel reads. llama_weights.h splits and joins it on the way to
// and from Hugging Face files.
//
// Init (transformers' LlamaPreTrainedModel._init_weights): every linear and embedding weight
// normal(0, initializer_range), biases 0, RMSNorm weights 1, the padded rows of the vocabulary 0.
//
// Dropout: attention_dropout on the attention probabilities (block site 0); no other dropout
// exists in these models.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/expert_parallel.h"
#include "models/layer.h"
#include "models/lm_head_loss.h"
#include "models/moe_mlp.h"
#include "ops/kernels/encoder.h"
#include "models/llama/llama_config.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "models/ulysses_attention.h"

namespace dstrain {

class LlamaEmbedding final : public Layer {
 public:
  // tp: the tensor-parallel rank it is built for (embed_tokens cut by vocabulary rows).
  explicit LlamaEmbedding(const LlamaConfig& cfg, TensorParallelRank tp = {});
  std::string name() const override { return "embedding"; }
  std::string type_name() const override { return llama_class_prefix(cfg_) + "Embedding"; }
  std::vector<ParamSpec> params() const override;  // model.embed_tokens.weight (Vp, C)
  ActivationSpec output(const LayerDims& d) const override;
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;

 private:
  VocabShard shard() const;  // this rank's rows of the table ({} for one rank)
  LlamaConfig cfg_;
  TensorParallelRank tp_;
};

class LlamaBlock final : public Layer {
 public:
  // index: N of "model.layers.N"; tp: the tensor-parallel rank it is built for (llama_block.cpp).
  // sp: the sequence-parallel rank (its tokens' positions start at sp.rank x T). ep: the
  // expert-parallel rank (a sparse layer holds its E/EP experts, models/expert_parallel.h).
  LlamaBlock(const LlamaConfig& cfg, std::int64_t index, TensorParallelRank tp = {}, SequenceParallelRank sp = {}, ExpertParallelRank ep = {});
  std::string name() const override { return "layers." + std::to_string(index_); }
  std::string type_name() const override { return llama_class_prefix(cfg_) + "DecoderLayer"; }
  std::vector<ParamSpec> params() const override;
  ActivationSpec output(const LayerDims& d) const override;  // (B, T, C)
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;

 private:
  std::int64_t q_dim() const { return nh_ * cfg_.head_dim; }
  std::int64_t kv_dim() const { return nkv_ * cfg_.head_dim; }
  std::int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  std::size_t moe_saved_count() const { return moe_ ? MoeMlp::saved_count() : 0; }
  std::size_t moe_scratch_count() const { return moe_ ? MoeMlp::scratch_count() : 0; }
  // The attention of this rank's heads, Ulysses-split when sequence-parallel.
  UlyssesAttention attention(SequenceParallelGroup* group, const RngKey& rng, bool train, std::span<const Tensor> scratch) const;

  LlamaConfig cfg_;
  std::int64_t index_;
  TensorParallelRank tp_;
  SequenceParallelRank sp_;
  ExpertParallelRank ep_;
  std::int64_t nkv_;    // this rank's key/value heads
  std::int64_t nh_;     // ... and query heads (nkv_ groups of n_head / n_kv_head)
  std::int64_t inter_;  // ... and MLP features (of intermediate_size); 0 for a sparse layer
  // A sparse layer's mixture-of-experts feed-forward (cfg.moe.is_sparse_layer(index)); its experts
  // are whole on every tensor-parallel rank, which all compute every token's; under expert
  // parallelism each tensor-parallel rank exchanges its tokens within its own expert-parallel group.
  std::optional<MoeMlp> moe_;
  std::vector<float> inv_freq_;  // (D/2) rope_inv_freq, uploaded into the saved "rope_inv_freq" per forward
};

class LlamaHead final : public Layer {
 public:
  // tp: the tensor-parallel rank it is built for (lm_head cut by vocabulary rows, the
  // cross-entropy vocabulary-parallel).
  // loss_tile_rows: ALST's tiled loss (models/lm_head_loss.h), positions per tile; 0: untiled.
  explicit LlamaHead(const LlamaConfig& cfg, TensorParallelRank tp = {}, std::int64_t loss_tile_rows = 0);
  std::string name() const override { return "head"; }
  std::string type_name() const override { return llama_class_prefix(cfg_) + "LMHead"; }
  // model.norm.weight, lm_head.weight (tied to model.embed_tokens.weight when tie_word_embeddings)
  std::vector<ParamSpec> params() const override;
  ActivationSpec output(const LayerDims& d) const override;  // losses (B, T) fp32
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;
  bool fuses_loss_grad() const override { return true; }

 private:
  LlamaConfig cfg_;
  TensorParallelRank tp_;
  LmHeadLoss loss_;  // the logits and the loss: whole, vocabulary-parallel, tiled
};

// Embedding, n_layer blocks, head. ep: the sparse layers' expert-parallel rank (the caller checks
// that the experts divide: LlamaArchitecture::check_expert_parallel).
std::vector<std::unique_ptr<Layer>> make_llama_layers(const LlamaConfig& cfg, TensorParallelRank tp = {}, SequenceParallelRank sp = {},
                                                      ExpertParallelRank ep = {});

}  // namespace dstrain
