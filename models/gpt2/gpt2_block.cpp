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
//
// Tensor parallelism (models/tensor_parallel.h, docs/parallelism.md): built for rank r of W, the
// block holds nh = units_of_rank(NH, W, r) whole heads (Cr = nh·HS of q, k and v each) and
// F = units_of_rank(4C, W, r) MLP features: c_attn (3Cr, C), attn.c_proj (C, Cr), c_fc (F, C),
// mlp.c_proj (C, F). The two projections' partial outputs are summed over the group before their
// bias (added by rank 0 alone) and dropout; in backward the partial d(ln1), d(ln2) are summed
// before the LayerNorm backward. LayerNorms, the projections' biases and the residual stream are
// replicated and get the same gradients on every rank. Attention dropout masks are drawn per rank
// (Megatron's model-parallel RNG: a rank's heads are not the one-rank model's heads h..h+nh, so
// only their distribution, not their bits, matches one rank).
//
// Megatron's sequence parallelism (models/residual_shards.h), where the tensor-parallel rank's
// shard_residual asks for it and B·T divides by TP: x, ln1, residual2, ln2, their statistics and
// out hold this rank's B·T/TP rows of the tokens; ln1 and ln2 are all-gathered into scratch before
// c_attn and c_fc (again in backward), the projections' partial outputs reduce-scattered; the
// LayerNorms' gradients, formed from the rank's rows, are summed over the group.
//
// ALST's tiled MLP (sp.mlp_tile_rows, models/row_tiles.h): fch and fch_gelu are computed a tile of
// positions at a time into scratch and not kept; backward computes each tile's again, then its
// gradients (d(W) and d(b) summed over the tiles in order).
//
// Sequence parallelism (DeepSpeed-Ulysses, models/ulysses_attention.h): built for SP rank s, the
// block runs on its Tl tokens; around attention two all-to-alls trade them for every token of
// 1/SP of its heads. Its residual dropouts draw a stream per SP rank (their tokens differ).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/kernels/attention.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/layernorm.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/matmul_gelu.h"
#include "models/gpt2/gpt2_layers.h"
#include "models/layer_args.h"
#include "models/param_split.h"
#include "models/row_tiles.h"
#include "models/tensor_parallel.h"
#include "models/ulysses_attention.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

using layer_args::expect_count;

namespace {
enum P { kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kNumParams };
enum Saved { kLn1, kLn1Mean, kLn1Rstd, kQkv, kAtty, kAttLse, kResidual2, kLn2, kLn2Mean, kLn2Rstd, kFch, kFchGelu, kQkvHeads, kAttyHeads, kNumSaved };
enum Scratch {
  kBtcA, kBtcB, kBt4cA, kBt4cB, kMatmul, kAttention, kSend, kRecv, kDattyHeads, kDqkvHeads, kWholeA, kWholeB, kNormGrads, kFchTile, kGeluTile,
  kNumScratch
};
}  // namespace

Gpt2Block::Gpt2Block(const Gpt2Config& cfg, std::int64_t index, TensorParallelRank tp, SequenceParallelRank sp)
    : cfg_(cfg),
      index_(index),
      tp_(tp),
      sp_(sp),
      heads_(units_of_rank(cfg.n_head, tp.ranks, tp.rank)),
      width_(heads_ * (cfg.n_embd / cfg.n_head)),
      ff_(units_of_rank(4 * cfg.n_embd, tp.ranks, tp.rank)) {
  validate(cfg_);
  if (tp_.active() && ff_ == 0) {
    fail("gpt2: n_embd {} gives 4 x n_embd = {} MLP features, fewer than the {} tensor-parallel ranks; use fewer ranks", cfg.n_embd, 4 * cfg.n_embd,
         tp.ranks);
  }
}

std::vector<ParamSpec> Gpt2Block::params() const {
  const std::int64_t C = cfg_.n_embd, hs = C / cfg_.n_head;
  const std::string p = "h." + std::to_string(index_) + ".";
  const float std_resid = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  // Tensor parallelism (Megatron): c_attn and c_fc column-parallel (c_attn's q, k and v cut each in
  // whole heads), the two c_proj row-parallel with their biases added once after the sum.
  const std::vector<ParamSplit::Part> qkv{{C, hs}, {C, hs}, {C, hs}};
  const ParamSplit heads_in = ParamSplit::columns({{C, hs}});
  std::vector<ParamSpec> whole = {
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
  for (ParamSpec& spec : whole) spec = piece_spec(std::move(spec), tp_);
  return whole;
}

ActivationSpec Gpt2Block::output(const LayerDims& d) const { return {"x", tp_.residual_shape(d.B, d.T, cfg_.n_embd), d.dtype}; }

std::vector<ActivationSpec> Gpt2Block::saved_activations(const LayerDims& d) const {
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd, Cr = width_, Fr = ff_;
  const DType S = d.dtype, F = DType::fp32;
  // Sequence parallelism: the attention sees every token (SP·T) of 1/SP of the heads.
  const std::int64_t SP = sp_.ranks, Ta = sp_.active() ? SP * T : 0;
  // The residual stream and its norms: (B, T, C), or this rank's rows under Megatron's SP.
  const Shape R = tp_.residual_shape(B, T, C), Rs = layer_args::token_stats_shape(R);
  return {
      {"ln1", R, S},
      {"ln1_mean", Rs, F},
      {"ln1_rstd", Rs, F},
      {"qkv", Shape{B, sp_.active() ? 0 : T, 3 * Cr}, S},  // sequence parallelism: not kept (qkv_heads is)
      {"atty", Shape{B, T, Cr}, S},
      {"att_lse", Shape{B, heads_ / SP, SP * T}, F},
      {"residual2", R, S},
      {"ln2", R, S},
      {"ln2_mean", Rs, F},
      {"ln2_rstd", Rs, F},
      {"fch", Shape{B, sp_.tiles_mlp(B * T) ? 0 : T, Fr}, S},  // tiled MLP: not kept
      {"fch_gelu", Shape{B, sp_.tiles_mlp(B * T) ? 0 : T, Fr}, S},
      {"qkv_heads", Shape{B, Ta, 3 * Cr / SP}, S},  // sequence parallelism: every token, this rank's heads
      {"atty_heads", Shape{B, Ta, Cr / SP}, S},
  };
}

std::vector<ActivationSpec> Gpt2Block::scratch(const LayerDims& d) const {
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd;
  const bool cut = tp_.shards_residual(B * T);
  return {
      {"btc_a", tp_.residual_shape(B, T, C), d.dtype},            // forward: branch outputs; backward: d(branch output), then d(ln2), d(ln1)
      {"btc_b", Shape{B, T, std::max(C, width_)}, d.dtype},       // backward: d(atty), d(ln2) of every token
      {"bt4c_a", Shape{B, T, std::max(ff_, 3 * width_)}, d.dtype},  // backward: d(fch_gelu), then d(qkv)
      {"bt4c_b", Shape{B, T, ff_}, d.dtype},                      // backward: d(fch)
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, std::max({C, ff_, width_})))}, DType::fp32},
      {"attention", Shape{static_cast<std::int64_t>(attention_backward_scratch_elems(B, sp_.ranks * T, width_ / sp_.ranks, heads_ / sp_.ranks))},
       DType::fp32},
      // sequence parallelism: the all-to-alls' buffers and the head-split gradients
      {"ulysses_send", Shape{sp_.active() ? B * T * 3 * width_ : 0}, d.dtype},
      {"ulysses_recv", Shape{sp_.active() ? B * T * 3 * width_ : 0}, d.dtype},
      {"datty_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, width_ / sp_.ranks}, d.dtype},
      {"dqkv_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, 3 * width_ / sp_.ranks}, d.dtype},
      // Megatron's sequence parallelism: every token of ln1 / ln2 (gathered); of a projection's
      // partial output, d(its output), d(ln1); the LayerNorms' gradients before the group's sum
      {"whole_a", Shape{B, cut ? T : 0, C}, d.dtype},
      {"whole_b", Shape{B, cut ? T : 0, C}, d.dtype},
      {"norm_grads", Shape{cut ? 4 * C : 0}, d.dtype},
      // tiled MLP: one tile's fch and fch_gelu
      {"fch_tile", Shape{sp_.tiles_mlp(B * T) ? sp_.mlp_tile_rows : 0, ff_}, d.dtype},
      {"gelu_tile", Shape{sp_.tiles_mlp(B * T) ? sp_.mlp_tile_rows : 0, ff_}, d.dtype},
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
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Shape whole{a.dims.B, a.dims.T, cfg_.n_embd};
  // A projection's partial output over every token; the residual stream's rows of its sum.
  const Tensor proj_whole = rs.whole(a.scratch[kWholeB], proj, whole);
  const int stream = layer_args::residual_stream(tp_, sp_, rs);

  layernorm_forward(s[kLn1], s[kLn1Mean], s[kLn1Rstd], a.input, p[kLn1W], p[kLn1B], eps);
  const Tensor ln1 = rs.whole(a.scratch[kWholeA], s[kLn1], whole);
  rs.gather(s[kLn1], ln1);
  if (heads_ > 0) {
    // Sequence parallelism: the rank's tokens' qkv lives in the all-to-all's receive buffer, read
    // only while the send buffer is packed; the attention keeps qkv_heads.
    const Tensor qkv = sp_.active() ? Tensor(a.scratch[kRecv].data, a.dims.dtype, Shape{a.dims.B, a.dims.T, 3 * width_}, a.scratch[kRecv].device)
                                    : s[kQkv];
    matmul_forward(qkv, ln1, p[kAttnW], p[kAttnB], mm);
    attention(a.sequence_parallel, a.rng, a.train, a.scratch).forward(s[kAtty], s[kAttLse], qkv, s[kQkvHeads], s[kAttyHeads]);
  }
  layer_args::row_parallel_forward(proj_whole, proj, s[kAtty], p[kAttnProjW], p[kAttnProjB], mm, tp_, rs);
  const DropoutParams drop1 = layer_args::parallel_dropout(cfg_.resid_pdrop, a.rng, 1, a.train, stream);
  if (drop1.p > 0.0f) dropout_forward(proj, proj, drop1);
  fused_residual_layernorm_forward(s[kResidual2], s[kLn2], s[kLn2Mean], s[kLn2Rstd], a.input, proj, p[kLn2W], p[kLn2B], eps);

  const Tensor ln2 = rs.whole(a.scratch[kWholeA], s[kLn2], whole);
  rs.gather(s[kLn2], ln2);
  if (!sp_.tiles_mlp(a.dims.B * a.dims.T)) {
    matmul_gelu_forward(s[kFchGelu], s[kFch], ln2, p[kFcW], p[kFcB], mm);  // GELU in the GEMM's epilogue on the GPU
    layer_args::row_parallel_forward(proj_whole, proj, s[kFchGelu], p[kFcProjW], p[kFcProjB], mm, tp_, rs);
  } else {
    // Tiled: each tile's fch and gelu in scratch, its rows of the projection's partial output.
    const std::int64_t C = cfg_.n_embd;
    for_each_row_tile(a.dims.B * a.dims.T, sp_.mlp_tile_rows, [&](std::int64_t r0, std::int64_t n) {
      const Tensor fch = row_range(a.scratch[kFchTile], 0, n, ff_), gelu = row_range(a.scratch[kGeluTile], 0, n, ff_);
      matmul_gelu_forward(gelu, fch, row_range(ln2, r0, n, C), p[kFcW], p[kFcB], mm);
      matmul_forward(row_range(proj_whole, r0, n, C), gelu, p[kFcProjW], tp_.rank == 0 ? p[kFcProjB] : Tensor{}, mm);
    });
    rs.reduce(proj_whole, proj);
  }
  const DropoutParams drop2 = layer_args::parallel_dropout(cfg_.resid_pdrop, a.rng, 2, a.train, stream);
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
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const std::int64_t B = a.dims.B, T = a.dims.T, C = cfg_.n_embd;
  const Shape whole{B, T, C};
  auto view = [&](const Tensor& t, std::int64_t width) { return Tensor(t.data, t.dtype, Shape{B, T, width}, t.device); };
  const int stream = layer_args::residual_stream(tp_, sp_, rs);
  // The LayerNorms' gradients: formed from this rank's rows and summed over the group when the
  // residual stream is cut (models/residual_shards.h), into the gradients directly otherwise.
  ReplicatedGradSum norm_grads(rs, {g[kLn1W], g[kLn1B], g[kLn2W], g[kLn2B]}, a.scratch[kNormGrads]);

  // dres holds d(out) now; through the residual connections it becomes d(residual2), then d(x).
  const Tensor dres = a.dinput;
  copy_tensor(dres, a.dout);  // a no-op when dinput is dout

  // ---- MLP branch: out = residual2 + dropout(mlp(ln2(residual2))) ----
  Tensor dproj = dres;
  const DropoutParams drop2 = layer_args::parallel_dropout(cfg_.resid_pdrop, a.rng, 2, a.train, stream);
  if (drop2.p > 0.0f) {
    dproj = btc_a;
    zero_tensor(dproj);
    dropout_backward(dproj, dres, drop2);
  }
  // Cut: d(proj) and ln2 of every token, gathered (ln2 again: only the rank's rows were kept).
  const Tensor dproj_whole = rs.whole(a.scratch[kWholeB], dproj, whole);
  rs.gather(dproj, dproj_whole);
  const Tensor ln2 = rs.whole(a.scratch[kWholeA], s[kLn2], whole);
  rs.gather(s[kLn2], ln2);
  const Tensor dgelu = view(bt4c_a, ff_), dfch = bt4c_b, dln2_whole = view(btc_b, C);
  zero_tensor(dln2_whole);
  if (!sp_.tiles_mlp(B * T)) {
    // dfch = gelu'(fch) ⊙ (dproj · W_fcproj) and the fc_proj weight / bias gradients (dgelu: the
    // unfused backends' d(fch_gelu)).
    matmul_gelu_backward(dfch, g[kFcProjW], g[kFcProjB], dproj_whole, s[kFchGelu], s[kFch], p[kFcProjW], dgelu, mm);
    matmul_backward(dln2_whole, g[kFcW], g[kFcB], dfch, ln2, p[kFcW], mm);
  } else {
    // Tiled: each tile's fch and gelu again, then its share of every gradient.
    for_each_row_tile(B * T, sp_.mlp_tile_rows, [&](std::int64_t r0, std::int64_t n) {
      const Tensor fch = row_range(a.scratch[kFchTile], 0, n, ff_), gelu = row_range(a.scratch[kGeluTile], 0, n, ff_);
      const Tensor ln2_rows = row_range(ln2, r0, n, C);
      matmul_gelu_forward(gelu, fch, ln2_rows, p[kFcW], p[kFcB], mm);
      const Tensor dfch_rows = row_range(dfch, 0, n, ff_);
      matmul_gelu_backward(dfch_rows, g[kFcProjW], g[kFcProjB], row_range(dproj_whole, r0, n, C), gelu, fch, p[kFcProjW], row_range(dgelu, 0, n, ff_),
                           mm);
      matmul_backward(row_range(dln2_whole, r0, n, C), g[kFcW], g[kFcB], dfch_rows, ln2_rows, p[kFcW], mm);
    });
  }
  // The column-parallel c_fc's input gradient, partial per rank: summed (cut: this rank's rows).
  const Tensor dln2 = rs.sharded ? btc_a : dln2_whole;
  rs.reduce(dln2_whole, dln2);
  layernorm_backward(dres, norm_grads.grad(2), norm_grads.grad(3), dln2, s[kResidual2], p[kLn2W], s[kLn2Mean], s[kLn2Rstd]);

  // ---- attention branch: residual2 = x + dropout(attn(ln1(x))) ----
  dproj = dres;
  const DropoutParams drop1 = layer_args::parallel_dropout(cfg_.resid_pdrop, a.rng, 1, a.train, stream);
  if (drop1.p > 0.0f) {
    dproj = btc_a;
    zero_tensor(dproj);
    dropout_backward(dproj, dres, drop1);
  }
  const Tensor dproj1_whole = rs.whole(a.scratch[kWholeB], dproj, whole);
  rs.gather(dproj, dproj1_whole);
  const Tensor datty = view(btc_b, width_);
  // d(ln1) of every token: written once d(proj) is dead (cut: the gathered copy's memory).
  const Tensor dln1_whole = rs.sharded ? dproj1_whole : btc_a;
  // Cut: ln1 of every token again, on every rank (a rank without heads joins the collective).
  const Tensor ln1 = rs.whole(a.scratch[kWholeA], s[kLn1], whole);
  rs.gather(s[kLn1], ln1);
  if (heads_ > 0) {
    zero_tensor(datty);
    matmul_backward(datty, g[kAttnProjW], g[kAttnProjB], dproj1_whole, s[kAtty], p[kAttnProjW], mm);
    const Tensor dqkv = view(bt4c_a, 3 * width_);
    attention(a.sequence_parallel, a.rng, a.train, a.scratch)
        .backward(dqkv, datty, s[kQkv], s[kAtty], s[kQkvHeads], s[kAttyHeads], s[kAttLse], a.scratch[kAttention], a.scratch[kDattyHeads],
                  a.scratch[kDqkvHeads]);
    zero_tensor(dln1_whole);
    matmul_backward(dln1_whole, g[kAttnW], g[kAttnB], dqkv, ln1, p[kAttnW], mm);
  } else {
    // No heads on this rank: only the (replicated) projection bias's gradient, as every rank forms it.
    matmul_backward(Tensor{}, Tensor{}, g[kAttnProjB], dproj1_whole, s[kAtty], p[kAttnProjW], mm);
    zero_tensor(dln1_whole);
  }
  // The column-parallel c_attn's input gradient, summed (cut: this rank's rows).
  const Tensor dln1 = btc_a;
  rs.reduce(dln1_whole, dln1);
  layernorm_backward(dres, norm_grads.grad(0), norm_grads.grad(1), dln1, a.input, p[kLn1W], s[kLn1Mean], s[kLn1Rstd]);
  norm_grads.finish();
}

UlyssesAttention Gpt2Block::attention(SequenceParallelGroup* group, const RngKey& rng, bool train, std::span<const Tensor> scratch) const {
  UlyssesAttention u;
  u.group = sp_.active() ? &layer_group(group, sp_, name()) : nullptr;
  u.heads = AttentionHeads{heads_};
  u.parts = {width_, width_, width_};
  u.dropout = layer_args::parallel_dropout(cfg_.attn_pdrop, rng, 0, train, layer_args::attention_stream(tp_, sp_));
  u.send = scratch[kSend];
  u.recv = scratch[kRecv];
  return u;
}

std::vector<std::unique_ptr<Layer>> make_gpt2_layers(const Gpt2Config& cfg, TensorParallelRank tp, SequenceParallelRank sp) {
  validate(cfg);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<Gpt2Embedding>(cfg, tp, sp));
  for (std::int64_t i = 0; i < cfg.n_layer; ++i) layers.push_back(std::make_unique<Gpt2Block>(cfg, i, tp, sp));
  layers.push_back(std::make_unique<Gpt2Head>(cfg, tp, sp.loss_tile_rows));
  return layers;
}

}  // namespace dstrain
