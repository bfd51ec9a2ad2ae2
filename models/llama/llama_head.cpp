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
enum Scratch { kDNorm, kMatmul, kRowMax, kStats, kTile, kNormWhole, kDNormRows, kNormGrads, kNumScratch };
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
  const Shape R = tp_.residual_shape(d.B, d.T, cfg_.n_embd);
  return {
      {"norm", R, d.dtype},  // (B, T, C); Megatron's sequence parallelism: this rank's rows
      {"norm_rstd", layer_args::token_stats_shape(R), DType::fp32},
      {"logits", loss_.saved_logits_shape(d.B, d.T), d.dtype},  // (B, T, Vp) (a rank: its rows; tiled: none); becomes dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> LlamaHead::scratch(const LayerDims& d) const {
  const bool cut = tp_.shards_residual(d.B * d.T);
  return {
      {"dnorm", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
      {"row_max", Shape{loss_.stat_rows(d.B, d.T)}, DType::fp32},       // tensor parallelism: the group's max logit per position
      {"ce_stats", Shape{2 * loss_.stat_rows(d.B, d.T)}, DType::fp32},  // ... and (sum exp, target logit)
      {"logits_tile", loss_.tile_shape(d.B, d.T), d.dtype},             // tiled loss: one tile's logits
      // Megatron's sequence parallelism: the norm of every token, d(norm) of this rank's rows, the norm's gradient
      {"norm_whole", Shape{d.B, cut ? d.T : 0, cfg_.n_embd}, d.dtype},
      {"dnorm_rows", cut ? tp_.residual_shape(d.B, d.T, cfg_.n_embd) : Shape{0}, d.dtype},
      {"norm_grads", Shape{cut ? cfg_.n_embd : 0}, d.dtype},
  };
}

void LlamaHead::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  rmsnorm_forward(s[kNorm], s[kRstd], a.input, a.params[kW], cfg_.rms_norm_eps);
  const Tensor norm = rs.whole(a.scratch[kNormWhole], s[kNorm], Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  rs.gather(s[kNorm], norm);
  // The logits and the loss (models/lm_head_loss.h: whole, vocabulary-parallel, tiled).
  const float mean = loss_.forward(a, norm, a.params[kLmHead], s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kRowMax], a.scratch[kStats],
                                   a.scratch[kMatmul], rs.group);
  if (a.loss != nullptr) *a.loss = mean;
}

void LlamaHead::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Tensor norm = rs.whole(a.scratch[kNormWhole], s[kNorm], Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  rs.gather(s[kNorm], norm);  // cut: every token's again (only this rank's rows were kept)
  const Tensor dnorm = a.scratch[kDNorm];
  loss_.backward(a, norm, a.params[kLmHead], a.grads[kLmHead], dnorm, s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kMatmul]);
  // Each rank's vocabulary rows' share, summed (cut: this rank's rows of the sum).
  const Tensor dnorm_rows = rs.sharded ? a.scratch[kDNormRows] : dnorm;
  rs.reduce(dnorm, dnorm_rows);
  ReplicatedGradSum norm_grads(rs, {a.grads[kW]}, a.scratch[kNormGrads]);
  zero_tensor(a.dinput);
  rmsnorm_backward(a.dinput, norm_grads.grad(0), dnorm_rows, a.input, a.params[kW], s[kRstd]);
  norm_grads.finish();
}

}  // namespace dstrain
