// The three layer kinds of GPT-2 (pre-LN, as Hugging Face GPT2LMHeadModel and llm.c):
//   Gpt2Embedding  tokens (B, T) -> x (B, T, C):  wte[token] + wpe[t], embd dropout
//   Gpt2Block      x -> x + attn(ln_1(x)) -> + mlp(ln_2(.)), resid dropout on both branches:
//                    ln_1 -> c_attn -> causal attention (attn dropout) -> c_proj -> dropout ->
//                    residual + ln_2 (one fused pass) -> c_fc -> GELU (tanh) -> c_proj -> dropout
//                    -> residual
//   Gpt2Head       x -> ln_f -> logits = ln_f(x) · wteᵀ over the padded vocab (tied weight, no
//                    bias) -> fused softmax cross-entropy; output: per-position losses (B, T) fp32,
//                    the mean over the non-ignored targets in *ForwardArgs::loss
// Parameter names are Hugging Face's ("h.3.mlp.c_fc.weight"); linear weights are stored in the
// nn.Linear (out, in) layout (HF's Conv1D files are (in, out); gpt2_weights.h transposes).
//
// Init (GPT-2 / llm.c / nanoGPT): linear and embedding weights normal(0, 0.02), the two residual
// projections (attn.c_proj, mlp.c_proj weights) normal(0, 0.02 / sqrt(2 n_layer)), wpe normal(0,
// 0.02) too (llm.c's train_gpt2.py: "initialize the position embedding at std=0.02 to match the
// scale of the token embedding"; HF's _init_weights also uses initializer_range = 0.02 for every
// nn.Embedding), biases 0, LayerNorm weight 1 / bias 0, the padded rows of wte 0.
//
// Dropout sites (added to ForwardArgs::rng.site): embedding 0; block: 0 attention probabilities,
// 1 after attn.c_proj, 2 after mlp.c_proj.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt2/gpt2_config.h"
#include "models/layer.h"
#include "models/lm_head_loss.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "models/ulysses_attention.h"

namespace dstrain {

class Gpt2Embedding final : public Layer {
 public:
  // tp: the tensor-parallel rank it is built for (wte cut by vocabulary rows, wpe replicated).
  // sp: the sequence-parallel rank (its tokens' positions start at sp.rank x T).
  explicit Gpt2Embedding(const Gpt2Config& cfg, TensorParallelRank tp = {}, SequenceParallelRank sp = {});
  std::string name() const override { return "embedding"; }
  std::string type_name() const override { return "GPT2Embedding"; }
  std::vector<ParamSpec> params() const override;                                    // wte.weight (Vp, C), wpe.weight (maxT, C)
  ActivationSpec output(const LayerDims& d) const override;                          // (B, T, C)
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;  // none
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;

 private:
  Gpt2Config cfg_;
  TensorParallelRank tp_;
  SequenceParallelRank sp_;
};

class Gpt2Block final : public Layer {
 public:
  // index: N of "h.N"; tp: the tensor-parallel rank it is built for (gpt2_block.cpp).
  Gpt2Block(const Gpt2Config& cfg, std::int64_t index, TensorParallelRank tp = {}, SequenceParallelRank sp = {});
  std::string name() const override { return "h." + std::to_string(index_); }
  std::string type_name() const override { return "GPT2Block"; }
  std::vector<ParamSpec> params() const override;
  ActivationSpec output(const LayerDims& d) const override;  // (B, T, C)
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;

 private:
  // The attention of this rank's heads, Ulysses-split when sequence-parallel.
  UlyssesAttention attention(SequenceParallelGroup* group, const RngKey& rng, bool train, std::span<const Tensor> scratch) const;

  Gpt2Config cfg_;
  std::int64_t index_;
  TensorParallelRank tp_;
  SequenceParallelRank sp_;
  std::int64_t heads_;  // this rank's heads
  std::int64_t width_;  // heads_ x head size: this rank's share of q, k and v each
  std::int64_t ff_;     // this rank's MLP features (of 4C)
};

class Gpt2Head final : public Layer {
 public:
  // tp: the tensor-parallel rank it is built for (the tied weight cut by vocabulary rows, the
  // cross-entropy vocabulary-parallel: the logits are never gathered).
  // loss_tile_rows: ALST's tiled loss (models/lm_head_loss.h), positions per tile; 0: untiled.
  explicit Gpt2Head(const Gpt2Config& cfg, TensorParallelRank tp = {}, std::int64_t loss_tile_rows = 0);
  std::string name() const override { return "head"; }
  std::string type_name() const override { return "GPT2LMHead"; }
  // ln_f.weight, ln_f.bias, lm_head.weight (tied to wte.weight)
  std::vector<ParamSpec> params() const override;
  ActivationSpec output(const LayerDims& d) const override;  // losses (B, T) fp32
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const override;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const override;
  void forward(const ForwardArgs& a) override;
  void backward(const BackwardArgs& a) override;
  // Training forwards write dlogits over the logits (softmax_cross_entropy_forward_backward).
  bool fuses_loss_grad() const override { return true; }

 private:
  Gpt2Config cfg_;
  TensorParallelRank tp_;
  LmHeadLoss loss_;  // the logits and the loss: whole, vocabulary-parallel, tiled
};

// Embedding, n_layer blocks, head: the model in the order the engine runs it.
std::vector<std::unique_ptr<Layer>> make_gpt2_layers(const Gpt2Config& cfg, TensorParallelRank tp = {}, SequenceParallelRank sp = {});

}  // namespace dstrain
