// LlamaHead: model.norm (RMSNorm), LM head over the padded vocabulary (no bias), fused softmax
// cross-entropy; the same flow as Gpt2Head with RMSNorm for LayerNorm.
#include <cstdint>

#include "ops/kernels/matmul.h"
#include "ops/kernels/rmsnorm.h"
#include "ops/kernels/tensor_ops.h"
#include "models/layer_args.h"
#include "models/lm_head_loss.h"
#include "models/llama/llama_layers.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum Saved { kNorm, kRstd, kLogits, kLse, kNumSaved };
enum Scratch { kDNorm, kMatmul, kRowMax, kStats, kTile, kNumScratch };
enum P { kW, kLmHead, kNumParams };
}  // namespace

LlamaHead::LlamaHead(const LlamaConfig& cfg, TensorParallelRank tp, std::int64_t loss_tile_rows)
    : cfg_(cfg), tp_(tp), loss_{cfg.vocab_size, cfg.padded_vocab_size, tp, loss_tile_rows} {
  validate(cfg_);
}

std::vector<ParamSpec> LlamaHead::params() const {
  const std::int64_t C = cfg_.n_embd;
  return {
      {"model.norm.weight", Shape{C}, ParamInit::ones(), false, {}},
      piece_spec({"lm_head.weight", Shape{cfg_.padded_vocab_size, C}, ParamInit::normal(cfg_.initializer_range, cfg_.vocab_size), true,
                  cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "", ParamSplit::vocabulary()},
                 tp_),  // (Vp, C); a tensor-parallel rank: (its rows, C)
  };
}

ActivationSpec LlamaHead::output(const LayerDims& d) const { return {"losses", Shape{d.B, d.T}, DType::fp32}; }

std::vector<ActivationSpec> LlamaHead::saved_activations(const LayerDims& d) const {
  return {
      {"norm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"norm_rstd", Shape{d.B, d.T}, DType::fp32},
      {"logits", loss_.saved_logits_shape(d.B, d.T), d.dtype},  // (B, T, Vp) (a rank: its rows; tiled: none); becomes dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> LlamaHead::scratch(const LayerDims& d) const {
  return {
      {"dnorm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
      {"row_max", Shape{loss_.stat_rows(d.B, d.T)}, DType::fp32},       // tensor parallelism: the group's max logit per position
      {"ce_stats", Shape{2 * loss_.stat_rows(d.B, d.T)}, DType::fp32},  // ... and (sum exp, target logit)
      {"logits_tile", loss_.tile_shape(d.B, d.T), d.dtype},             // tiled loss: one tile's logits
  };
}

void LlamaHead::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  rmsnorm_forward(s[kNorm], s[kRstd], a.input, a.params[kW], cfg_.rms_norm_eps);
  // The logits and the loss (models/lm_head_loss.h: whole, vocabulary-parallel, tiled).
  const float mean = loss_.forward(a, s[kNorm], a.params[kLmHead], s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kRowMax], a.scratch[kStats],
                                   a.scratch[kMatmul], tp_.active() ? &layer_group(a.tensor_parallel, tp_, name()) : nullptr);
  if (a.loss != nullptr) *a.loss = mean;
}

void LlamaHead::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const Tensor dnorm = a.scratch[kDNorm];
  loss_.backward(a, s[kNorm], a.params[kLmHead], a.grads[kLmHead], dnorm, s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kMatmul]);
  if (tp_.active()) layer_group(a.tensor_parallel, tp_, name()).sum(dnorm);  // each rank's vocabulary rows' share
  zero_tensor(a.dinput);
  rmsnorm_backward(a.dinput, a.grads[kW], dnorm, a.input, a.params[kW], s[kRstd]);
}

}  // namespace dstrain
