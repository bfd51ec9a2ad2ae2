// Gpt2Block: one pre-LN transformer block.
//
// forward (S = storage dtype, shapes per micro-batch):
//   ln1, ln1_mean, ln1_rstd = layernorm(x)                    (B, T, C), (B, T), (B, T)
//   qkv  = ln1 · c_attnᵀ + b                                  (B, T, 3C)
//   atty, lse = attention(qkv) (attn dropout, site 0)         (B, T, C), (B, NH, T)
//   proj = dropout(atty · c_projᵀ + b) (site 1)               (B, T, C)  scratch
//   residual2 = x + proj; ln2, mean, rstd = layernorm(.)      one fused pass
//   fch = ln2 · c_fcᵀ + b; fch_gelu = gelu(fch)               (B, T, 4C) each
//   proj = dropout(fch_gelu · mlp.c_projᵀ + b) (site 2)       (B, T, C)  scratch
//   out  = residual2 + proj
// backward runs the same in reverse; dinput carries the residual stream's gradient and may be the
// same memory as dout (in place, as llm.c's single dresidual buffer).
#include <cmath>
#include <cstdint>

#include "ops/kernels/attention.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/layernorm.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/matmul_gelu.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/layer_args.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum P { kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kNumParams };
enum Saved { kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtty, kAttLse, kResidual2, kLn2, kLn2Mean, kLn2Rstd, kFch, kFchGelu, kNumSaved };
enum Scratch { kBtcA, kBtcB, kBt4cA, kBt4cB, kMatmul, kAttention, kNumScratch };
}  // namespace

Gpt2Block::Gpt2Block(const Gpt2Config& cfg, std::int64_t index) : cfg_(cfg), index_(index) { validate(cfg_); }

std::vector<ParamSpec> Gpt2Block::params() const {
  const std::int64_t C = cfg_.n_embd, hs = C / cfg_.n_head;
  const std::string p = "h." + std::to_string(index_) + ".";
  const float std_resid = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  // Tensor parallelism (Megatron): c_attn and c_fc column-parallel (c_attn's q, k and v cut each in
  // whole heads), the two c_proj row-parallel with their biases added once after the sum.
  const std::vector<ParamSplit::Part> qkv{{C, hs}, {C, hs}, {C, hs}};
  const ParamSplit heads_in = ParamSplit::columns({{C, hs}});
  return {
      {p + "ln_1.weight", Shape{C}, ParamInit::ones(), false, {}},
      {p + "ln_1.bias", Shape{C}, ParamInit::zeros(), false, {}},
      {p + "attn.c_attn.weight", Shape{3 * C, C}, ParamInit::normal(0.02f), true, {}, ParamSplit::rows(qkv), true},  // (3C, C)
      {p + "attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros(), false, {}, ParamSplit::rows(qkv)},
      {p + "attn.c_proj.weight", Shape{C, C}, ParamInit::normal(std_resid), true, {}, heads_in, true},  // (C, C)
      {p + "attn.c_proj.bias", Shape{C}, ParamInit::zeros(), false, {}},
      {p + "ln_2.weight", Shape{C}, ParamInit::ones(), false, {}},
      {p + "ln_2.bias", Shape{C}, ParamInit::zeros(), false, {}},
      {p + "mlp.c_fc.weight", Shape{4 * C, C}, ParamInit::normal(0.02f), true, {}, ParamSplit::rows(), true},  // (4C, C)
      {p + "mlp.c_fc.bias", Shape{4 * C}, ParamInit::zeros(), false, {}, ParamSplit::rows()},
      {p + "mlp.c_proj.weight", Shape{C, 4 * C}, ParamInit::normal(std_resid), true, {}, ParamSplit::columns(), true},  // (C, 4C)
      {p + "mlp.c_proj.bias", Shape{C}, ParamInit::zeros(), false, {}},
  };
}

ActivationSpec Gpt2Block::output(const LayerDims& d) const { return {"x", Shape{d.B, d.T, cfg_.n_embd}, d.dtype}; }

std::vector<ActivationSpec> Gpt2Block::saved_activations(const LayerDims& d) const {
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd;
  const DType S = d.dtype, F = DType::fp32;
  return {
      {"ln1", Shape{B, T, C}, S},       {"ln1_mean", Shape{B, T}, F},   {"ln1_rstd", Shape{B, T}, F},
      {"qkv", Shape{B, T, 3 * C}, S},   {"atty", Shape{B, T, C}, S},    {"att_lse", Shape{B, cfg_.n_head, T}, F},
      {"residual2", Shape{B, T, C}, S}, {"ln2", Shape{B, T, C}, S},     {"ln2_mean", Shape{B, T}, F},
      {"ln2_rstd", Shape{B, T}, F},     {"fch", Shape{B, T, 4 * C}, S}, {"fch_gelu", Shape{B, T, 4 * C}, S},
  };
}

std::vector<ActivationSpec> Gpt2Block::scratch(const LayerDims& d) const {
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd;
  return {
      {"btc_a", Shape{B, T, C}, d.dtype},       // forward: branch outputs; backward: d(branch output), then d(ln1)
      {"btc_b", Shape{B, T, C}, d.dtype},       // backward: d(atty), d(ln2)
      {"bt4c_a", Shape{B, T, 4 * C}, d.dtype},  // backward: d(fch_gelu), then d(qkv) in its first 3C columns' worth
      {"bt4c_b", Shape{B, T, 4 * C}, d.dtype},  // backward: d(fch)
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, 4 * C))}, DType::fp32},
      {"attention", Shape{static_cast<std::int64_t>(attention_backward_scratch_elems(B, T, C, cfg_.n_head))}, DType::fp32},
  };
}

void Gpt2Block::forward(const ForwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& p = a.params;
  const auto& s = a.saved;
  const Tensor proj = a.scratch[kBtcA];
  const Tensor mm = a.scratch[kMatmul];
  const float eps = cfg_.layer_norm_epsilon;

  layernorm_forward(s[kLn1], s[kLn1Mean], s[kLn1Rstd], a.input, p[kLn1W], p[kLn1B], eps);
  matmul_forward(s[kQkv], s[kLn1], p[kAttnW], p[kAttnB], mm);
  attention_forward(s[kAtty], s[kAttLse], s[kQkv], cfg_.n_head, layer_args::dropout(cfg_.attn_pdrop, a.rng, 0, a.train));
  matmul_forward(proj, s[kAtty], p[kAttnProjW], p[kAttnProjB], mm);
  const DropoutParams drop1 = layer_args::dropout(cfg_.resid_pdrop, a.rng, 1, a.train);
  if (drop1.p > 0.0f) dropout_forward(proj, proj, drop1);
  fused_residual_layernorm_forward(s[kResidual2], s[kLn2], s[kLn2Mean], s[kLn2Rstd], a.input, proj, p[kLn2W], p[kLn2B], eps);

  matmul_gelu_forward(s[kFchGelu], s[kFch], s[kLn2], p[kFcW], p[kFcB], mm);  // GELU in the GEMM's epilogue on the GPU
  matmul_forward(proj, s[kFchGelu], p[kFcProjW], p[kFcProjB], mm);
  const DropoutParams drop2 = layer_args::dropout(cfg_.resid_pdrop, a.rng, 2, a.train);
  if (drop2.p > 0.0f) dropout_forward(proj, proj, drop2);
  residual_forward(a.output, s[kResidual2], proj);
}

void Gpt2Block::backward(const BackwardArgs& a) {
  expect_count(name(), "params", a.params, kNumParams);
  expect_count(name(), "grads", a.grads, kNumParams);
  expect_count(name(), "saved", a.saved, kNumSaved);
  expect_count(name(), "scratch", a.scratch, kNumScratch);
  const auto& p = a.params;
  const auto& g = a.grads;
  const auto& s = a.saved;
  const Tensor btc_a = a.scratch[kBtcA], btc_b = a.scratch[kBtcB];
  const Tensor bt4c_a = a.scratch[kBt4cA], bt4c_b = a.scratch[kBt4cB];
  const Tensor mm = a.scratch[kMatmul];

  // dres holds d(out) now; through the residual connections it becomes d(residual2), then d(x).
  const Tensor dres = a.dinput;
  copy_tensor(dres, a.dout);  // a no-op when dinput is dout

  // ---- MLP branch: out = residual2 + dropout(mlp(ln2(residual2))) ----
  Tensor dproj = dres;
  const DropoutParams drop2 = layer_args::dropout(cfg_.resid_pdrop, a.rng, 2, a.train);
  if (drop2.p > 0.0f) {
    dproj = btc_a;
    zero_tensor(dproj);
    dropout_backward(dproj, dres, drop2);
  }
  const Tensor dgelu = bt4c_a, dfch = bt4c_b, dln2 = btc_b;
  // dfch = gelu'(fch) ⊙ (dproj · W_fcproj) and the fc_proj weight / bias gradients (dgelu: the
  // unfused backends' d(fch_gelu)).
  matmul_gelu_backward(dfch, g[kFcProjW], g[kFcProjB], dproj, s[kFchGelu], s[kFch], p[kFcProjW], dgelu, mm);
  zero_tensor(dln2);
  matmul_backward(dln2, g[kFcW], g[kFcB], dfch, s[kLn2], p[kFcW], mm);
  layernorm_backward(dres, g[kLn2W], g[kLn2B], dln2, s[kResidual2], p[kLn2W], s[kLn2Mean], s[kLn2Rstd]);

  // ---- attention branch: residual2 = x + dropout(attn(ln1(x))) ----
  dproj = dres;
  const DropoutParams drop1 = layer_args::dropout(cfg_.resid_pdrop, a.rng, 1, a.train);
  if (drop1.p > 0.0f) {
    dproj = btc_a;
    zero_tensor(dproj);
    dropout_backward(dproj, dres, drop1);
  }
  const Tensor datty = btc_b;
  zero_tensor(datty);
  matmul_backward(datty, g[kAttnProjW], g[kAttnProjB], dproj, s[kAtty], p[kAttnProjW], mm);
  const std::int64_t B = a.dims.B, T = a.dims.T, C = cfg_.n_embd;
  const Tensor dqkv = Tensor(bt4c_a.data, bt4c_a.dtype, Shape{B, T, 3 * C}, bt4c_a.device);
  zero_tensor(dqkv);
  attention_backward(dqkv, datty, s[kQkv], s[kAtty], s[kAttLse], cfg_.n_head, a.scratch[kAttention],
                     layer_args::dropout(cfg_.attn_pdrop, a.rng, 0, a.train));
  const Tensor dln1 = btc_a;  // dproj is dead
  zero_tensor(dln1);
  matmul_backward(dln1, g[kAttnW], g[kAttnB], dqkv, s[kLn1], p[kAttnW], mm);
  layernorm_backward(dres, g[kLn1W], g[kLn1B], dln1, a.input, p[kLn1W], s[kLn1Mean], s[kLn1Rstd]);
}

std::vector<std::unique_ptr<Layer>> make_gpt2_layers(const Gpt2Config& cfg) {
  validate(cfg);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Gpt2Embedding>(cfg));
  for (std::int64_t i = 0; i < cfg.n_layer; ++i) layers.push_back(std::make_unique<Gpt2Block>(cfg, i));
  layers.push_back(std::make_unique<Gpt2Head>(cfg));
  return layers;
}

}  // namespace dstrain
