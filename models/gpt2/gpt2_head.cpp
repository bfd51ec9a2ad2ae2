// Gpt2Head: ln_f, tied LM head over the padded vocabulary, fused softmax cross-entropy.
// Tensor parallelism: each rank holds some vocabulary rows of the tied weight and computes those
// logits; the cross-entropy is vocabulary-parallel (layer_args.h) and the partial d(ln_f) is
// summed over the group before the LayerNorm backward.
#include <cmath>
#include <cstdint>

#include "ops/kernels/layernorm.h"
#include "ops/kernels/matmul.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/layer_args.h"
#include "models/lm_head_loss.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum Saved { kLnf, kLnfMean, kLnfRstd, kLogits, kLse, kNumSaved };
enum Scratch { kDLnf, kMatmul, kRowMax, kStats, kTile, kNumScratch };
enum P { kW, kB, kWte, kNumParams };
}  // namespace

Gpt2Head::Gpt2Head(const Gpt2Config& cfg, TensorParallelRank tp, std::int64_t loss_tile_rows)
    : cfg_(cfg), tp_(tp), loss_{cfg.vocab_size, cfg.padded_vocab_size, tp, loss_tile_rows} {
  validate(cfg_);
}

std::vector<ParamSpec> Gpt2Head::params() const {
  const std::int64_t C = cfg_.n_embd;
  return {
      {"ln_f.weight", Shape{C}, ParamInit::ones(), false, {}},
      {"ln_f.bias", Shape{C}, ParamInit::zeros(), false, {}},
      piece_spec({"lm_head.weight", Shape{cfg_.padded_vocab_size, C}, ParamInit::normal(0.02f, cfg_.vocab_size), true, "wte.weight",
                  ParamSplit::vocabulary()},
                 tp_),  // (Vp, C); a rank: (its rows, C)
  };
}

ActivationSpec Gpt2Head::output(const LayerDims& d) const { return {"losses", Shape{d.B, d.T}, DType::fp32}; }

std::vector<ActivationSpec> Gpt2Head::saved_activations(const LayerDims& d) const {
  const std::int64_t C = cfg_.n_embd;
  return {
      {"lnf", Shape{d.B, d.T, C}, d.dtype},
      {"lnf_mean", Shape{d.B, d.T}, DType::fp32},
      {"lnf_rstd", Shape{d.B, d.T}, DType::fp32},
      {"logits", loss_.saved_logits_shape(d.B, d.T), d.dtype},  // (B, T, Vp) (a rank: its rows; tiled: none); backward turns it into dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> Gpt2Head::scratch(const LayerDims& d) const {
  return {
      {"dlnf", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
      {"row_max", Shape{loss_.stat_rows(d.B, d.T)}, DType::fp32},       // tensor parallelism: the group's max logit per position
      {"ce_stats", Shape{2 * loss_.stat_rows(d.B, d.T)}, DType::fp32},  // ... and (sum exp, target logit)
      {"logits_tile", loss_.tile_shape(d.B, d.T), d.dtype},             // tiled loss: one tile's logits
  };
}

void Gpt2Head::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  layernorm_forward(s[kLnf], s[kLnfMean], s[kLnfRstd], a.input, a.params[kW], a.params[kB], cfg_.layer_norm_epsilon);
  // (B, T, Vp) = lnf · wteᵀ and the loss (models/lm_head_loss.h: whole, vocabulary-parallel, tiled)
  const float mean = loss_.forward(a, s[kLnf], a.params[kWte], s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kRowMax], a.scratch[kStats],
                                   a.scratch[kMatmul], tp_.active() ? &layer_group(a.tensor_parallel, tp_, name()) : nullptr);
  if (a.loss != nullptr) *a.loss = mean;
}

void Gpt2Head::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const Tensor dlnf = a.scratch[kDLnf];
  loss_.backward(a, s[kLnf], a.params[kWte], a.grads[kWte], dlnf, s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kMatmul]);
  if (tp_.active()) layer_group(a.tensor_parallel, tp_, name()).sum(dlnf);  // each rank's vocabulary rows' share
  zero_tensor(a.dinput);
  layernorm_backward(a.dinput, a.grads[kW], a.grads[kB], dlnf, a.input, a.params[kW], s[kLnfMean], s[kLnfRstd]);
}

}  // namespace dstrain
