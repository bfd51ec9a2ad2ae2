// LlamaHead: model.norm (RMSNorm), LM head over the padded vocabulary (no bias), fused softmax
// cross-entropy; the same flow as Gpt2Head with RMSNorm for LayerNorm.
#include <cstdint>

#include "ops/kernels/matmul.h"
#include "ops/kernels/rmsnorm.h"
#include "ops/kernels/tensor_ops.h"
#include "models/layer_args.h"
#include "models/llama/llama_layers.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum Saved { kNorm, kRstd, kLogits, kLse, kNumSaved };
enum Scratch { kDNorm, kMatmul, kRowMax, kStats, kNumScratch };
enum P { kW, kLmHead, kNumParams };
}  // namespace

LlamaHead::LlamaHead(const LlamaConfig& cfg, TensorParallelRank tp) : cfg_(cfg), tp_(tp) { validate(cfg_); }

std::int64_t LlamaHead::rows() const {
  return tp_.active() ? layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_).rows : cfg_.padded_vocab_size;
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
      {"logits", Shape{d.B, d.T, rows()}, d.dtype},  // (B, T, Vp) (a rank: its rows); becomes dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> LlamaHead::scratch(const LayerDims& d) const {
  return {
      {"dnorm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
      {"row_max", Shape{tp_.active() ? d.B * d.T : 0}, DType::fp32},    // tensor parallelism: the group's max logit per position
      {"ce_stats", Shape{tp_.active() ? 2 * d.B * d.T : 0}, DType::fp32},  // ... and (sum exp, target logit)
  };
}

void LlamaHead::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  rmsnorm_forward(s[kNorm], s[kRstd], a.input, a.params[kW], cfg_.rms_norm_eps);
  matmul_forward(s[kLogits], s[kNorm], a.params[kLmHead], Tensor{}, a.scratch[kMatmul]);
  const float mean = tp_.active() ? layer_args::vocab_parallel_head_loss_forward(
                                        a, s[kLse], s[kLogits], layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_),
                                        layer_group(a.tensor_parallel, tp_, name()), a.scratch[kRowMax], a.scratch[kStats])
                                  : layer_args::head_loss_forward(a, s[kLse], s[kLogits], cfg_.vocab_size);
  if (a.loss != nullptr) *a.loss = mean;
}

void LlamaHead::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const Tensor dlogits = s[kLogits];  // in place: the logits are dead after this
  if (tp_.active()) {
    layer_args::vocab_parallel_head_loss_backward(a, s[kLse], dlogits, layer_args::vocab_piece(cfg_.padded_vocab_size, cfg_.vocab_size, tp_));
  } else {
    layer_args::head_loss_backward(a, s[kLse], dlogits, cfg_.vocab_size);
  }
  const Tensor dnorm = a.scratch[kDNorm];
  zero_tensor(dnorm);
  matmul_backward(dnorm, a.grads[kLmHead], Tensor{}, dlogits, s[kNorm], a.params[kLmHead], a.scratch[kMatmul]);
  if (tp_.active()) layer_group(a.tensor_parallel, tp_, name()).sum(dnorm);  // each rank's vocabulary rows' share
  zero_tensor(a.dinput);
  rmsnorm_backward(a.dinput, a.grads[kW], dnorm, a.input, a.params[kW], s[kRstd]);
}

}  // namespace dstrain
