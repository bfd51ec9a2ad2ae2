// Gpt2Head: ln_f, tied LM head over the padded vocabulary, fused softmax cross-entropy.
// Tensor parallelism: each rank holds some vocabulary rows of the tied weight and computes those
// logits; the cross-entropy is vocabulary-parallel (layer_args.h) and the partial d(ln_f) is
// summed over the group before the LayerNorm backward. Under Megatron's sequence parallelism
// (models/residual_shards.h) the input and ln_f are this rank's rows of the tokens: ln_f's output
// is all-gathered before the logits (again in backward), d(ln_f) reduce-scattered, and ln_f's
// gradients summed over the group.
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
enum Scratch { kDLnf, kMatmul, kRowMax, kStats, kTile, kLnfWhole, kDLnfRows, kNormGrads, kNumScratch };
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
  const Shape R = tp_.residual_shape(d.B, d.T, cfg_.n_embd), Rs = layer_args::token_stats_shape(R);
  return {
      {"lnf", R, d.dtype},  // (B, T, C); Megatron's sequence parallelism: this rank's rows
      {"lnf_mean", Rs, DType::fp32},
      {"lnf_rstd", Rs, DType::fp32},
      {"logits", loss_.saved_logits_shape(d.B, d.T), d.dtype},  // (B, T, Vp) (a rank: its rows; tiled: none); backward turns it into dlogits in place
      {"lse", Shape{d.B, d.T}, DType::fp32},
  };
}

std::vector<ActivationSpec> Gpt2Head::scratch(const LayerDims& d) const {
  const bool cut = tp_.shards_residual(d.B * d.T);
  return {
      {"dlnf", Shape{d.B, d.T, cfg_.n_embd}, d.dtype},
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, cfg_.n_embd))}, DType::fp32},
      {"row_max", Shape{loss_.stat_rows(d.B, d.T)}, DType::fp32},       // tensor parallelism: the group's max logit per position
      {"ce_stats", Shape{2 * loss_.stat_rows(d.B, d.T)}, DType::fp32},  // ... and (sum exp, target logit)
      {"logits_tile", loss_.tile_shape(d.B, d.T), d.dtype},             // tiled loss: one tile's logits
      // Megatron's sequence parallelism: ln_f of every token, d(ln_f) of this rank's rows, ln_f's gradients
      {"lnf_whole", Shape{d.B, cut ? d.T : 0, cfg_.n_embd}, d.dtype},
      {"dlnf_rows", cut ? tp_.residual_shape(d.B, d.T, cfg_.n_embd) : Shape{0}, d.dtype},
      {"norm_grads", Shape{cut ? 2 * cfg_.n_embd : 0}, d.dtype},
  };
}

void Gpt2Head::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  layernorm_forward(s[kLnf], s[kLnfMean], s[kLnfRstd], a.input, a.params[kW], a.params[kB], cfg_.layer_norm_epsilon);
  const Tensor lnf = rs.whole(a.scratch[kLnfWhole], s[kLnf], Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  rs.gather(s[kLnf], lnf);
  // (B, T, Vp) = lnf · wteᵀ and the loss (models/lm_head_loss.h: whole, vocabulary-parallel, tiled)
  const float mean = loss_.forward(a, lnf, a.params[kWte], s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kRowMax], a.scratch[kStats],
                                   a.scratch[kMatmul], rs.group);
  if (a.loss != nullptr) *a.loss = mean;
}

void Gpt2Head::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& s = a.saved;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Tensor lnf = rs.whole(a.scratch[kLnfWhole], s[kLnf], Shape{a.dims.B, a.dims.T, cfg_.n_embd});
  rs.gather(s[kLnf], lnf);  // cut: every token's again (only this rank's rows were kept)
  const Tensor dlnf = a.scratch[kDLnf];
  loss_.backward(a, lnf, a.params[kWte], a.grads[kWte], dlnf, s[kLogits], s[kLse], a.scratch[kTile], a.scratch[kMatmul]);
  // Each rank's vocabulary rows' share, summed (cut: this rank's rows of the sum).
  const Tensor dlnf_rows = rs.sharded ? a.scratch[kDLnfRows] : dlnf;
  rs.reduce(dlnf, dlnf_rows);
  ReplicatedGradSum norm_grads(rs, {a.grads[kW], a.grads[kB]}, a.scratch[kNormGrads]);
  zero_tensor(a.dinput);
  layernorm_backward(a.dinput, norm_grads.grad(0), norm_grads.grad(1), dlnf_rows, a.input, a.params[kW], s[kLnfMean], s[kLnfRstd]);
  norm_grads.finish();
}

}  // namespace dstrain
