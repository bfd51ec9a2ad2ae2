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
enum Scratch { kDNorm, kMatmul, kNumScratch };
enum P { kW, kLmHead, kNumParams };
}  // namespace

LlamaHead::LlamaHead(const LlamaConfig& cfg) : cfg_(cfg) { validate(cfg_); }

std::vector<ParamSpec> LlamaHead::params() const {
  const std::int64_t C = cfg_.n_embd;
  return {
      {"model.norm.weight", Shape{C}, ParamInit::ones(), false, {}},
      {"lm_head.weight", Shape{cfg_.padded_vocab_size, C}, ParamInit::normal(cfg_.initializer_range, cfg_.vocab_size), true,
       cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "", ParamSplit::vocabulary()},  // (Vp, C)
  };
}

ActivationSpec LlamaHead::output(const LayerDims& d) const { return {"losses", Shape{d.B, d.T}, DType::fp32}; }

std::vector<ActivationSpec> LlamaHead::saved_activations(const LayerDims& d) const {
  return {
      {"norm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"norm_rstd", Shape{d.B, d.T}, DType::fp32},
      {"logits", Shape{d.B, d.T, cfg_.padded_vocab_size}, d.dtype},  // (B, T, Vp); becomes dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> LlamaHead::scratch(const LayerDims& d) const {
  return {
      {"dnorm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
  };
}

void LlamaHead::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  rmsnorm_forward(s[kNorm], s[kRstd], a.input, a.params[kW], cfg_.rms_norm_eps);
  matmul_forward(s[kLogits], s[kNorm], a.params[kLmHead], Tensor{}, a.scratch[kMatmul]);
  const float mean = layer_args::head_loss_forward(a, s[kLse], s[kLogits], cfg_.vocab_size);
  if (a.loss != nullptr) *a.loss = mean;
}

void LlamaHead::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const Tensor dlogits = s[kLogits];  // in place: the logits are dead after this
  layer_args::head_loss_backward(a, s[kLse], dlogits, cfg_.vocab_size);
  const Tensor dnorm = a.scratch[kDNorm];
  zero_tensor(dnorm);
  matmul_backward(dnorm, a.grads[kLmHead], Tensor{}, dlogits, s[kNorm], a.params[kLmHead], a.scratch[kMatmul]);
  zero_tensor(a.dinput);
  rmsnorm_backward(a.dinput, a.grads[kW], dnorm, a.input, a.params[kW], s[kRstd]);
}

}  // namespace dstrain
