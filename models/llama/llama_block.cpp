// LlamaBlock: one pre-norm decoder layer of the Llama family.
//
// forward (S = storage dtype, W = (NH + 2·NKV)·D, I = intermediate_size):
//   ln1, rstd1 = rmsnorm(x) (input_layernorm)                       (B, T, C), (B, T)
//   qkv_raw = ln1 · qkv_projᵀ (+ b)                                 (B, T, W)   [only with q/k norm]
//   qkv = qkv_raw; q/k heads RMSNorm'd in place (Qwen3)             (B, T, W), rstd (B, T, NH + NKV)
//   qkv: q and k heads rotated in place (RoPE, positions 0 .. T-1)
//   atty, lse = attention(qkv, NH, NKV) (attention_dropout, site 0) (B, T, NH·D), (B, NH, T)
//     causal, or within Mistral's sliding_window (cfg.attention_window())
//   proj = atty · o_projᵀ (+ b)                                     (B, T, C) scratch
//   residual2 = x + proj; ln2, rstd2 = rmsnorm(residual2)           one fused pass
//   gate = ln2 · gate_projᵀ, up = ln2 · up_projᵀ (+ b)              (B, T, I) each
//   h = silu(gate) * up                                             (B, T, I)
//   out = residual2 + h · down_projᵀ (+ b)
// backward runs the same in reverse; RoPE and the q/k norm backward run in place on dqkv.
// dinput carries the residual stream's gradient and may be the same memory as dout.
//
// Tensor parallelism (models/tensor_parallel.h, docs/parallelism.md): built for rank r of W, the
// block holds NKVr = units_of_rank(NKV, W, r) key/value heads and their NKVr·NH/NKV query heads
// (AutoTP's whole-head split: 6 KV heads over 4 ranks are 2, 2, 1, 1; with more ranks than KV
// heads the surplus ranks hold no attention weights and add zeros), and Ir = units_of_rank(I, W, r)
// MLP features. o_proj's and down_proj's partial outputs are summed over the group (their biases
// added by rank 0 alone); the partial d(ln1), d(ln2) are summed before the RMSNorm backward;
// Qwen3's q/k norm weights' gradients (partial: a rank sees its own heads) are summed in backward,
// so every replicated parameter leaves with the same gradient on every rank. OLMoE's q/k norm
// (over the whole q and k projections) is cut with the heads, its weights too: each token's sum
// of squares, and in backward its Σ(w·dy·x̂), is the rank's share summed over the group (one
// all-reduce of 2·B·T fp32 per direction, every rank joining); the weights' gradients stay local.
//
// Megatron's sequence parallelism (models/residual_shards.h), where the tensor-parallel rank's
// shard_residual asks for it and B·T divides by TP: x, ln1, residual2, ln2, their rstd and out hold
// this rank's B·T/TP rows of the tokens; ln1 and ln2 are all-gathered into scratch before qkv_proj
// and gate/up (again in backward), o_proj's and down_proj's partial outputs reduce-scattered; the
// RMSNorms' gradients, formed from the rank's rows, are summed over the group.
//
// ALST's tiled MLP (sp.mlp_tile_rows, models/row_tiles.h): gate, up and h are computed a tile of
// positions at a time into scratch and not kept; backward computes each tile's again, then its
// gradients (d(W) and d(b) summed over the tiles in order).
//
// Expert parallelism (models/expert_parallel.h): built for EP rank e, a sparse block holds its
// E/EP experts and its MoeMlp exchanges the rows with the group's other ranks (ForwardArgs::
// expert_parallel, checked here, naming the block); a dense block is the same as without it.
//
// Sequence parallelism (DeepSpeed-Ulysses, models/ulysses_attention.h): built for SP rank s, the
// block runs on its T tokens (positions s·T ..), RoPE rotating them at their positions; around
// attention two all-to-alls trade them for every token of 1/SP of the rank's heads.
#include <algorithm>
#include <cstdint>

#include "ops/kernels/attention.h"
#include "ops/kernels/head_rmsnorm.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/rmsnorm.h"
#include "ops/kernels/rope.h"
#include "ops/kernels/swiglu.h"
#include "ops/kernels/tensor_ops.h"
#include "models/layer_args.h"
#include "models/llama/llama_layers.h"
#include "models/param_split.h"
#include "models/row_tiles.h"
#include "models/tensor_parallel.h"
#include "models/ulysses_attention.h"

namespace dstrain {

using layer_args::expect_count;

namespace {

// Positions of the optional parameters in params(): -1 when the config has none.
struct ParamIndex {
  int ln1 = -1, qkv_w = -1, qkv_b = -1, q_norm = -1, k_norm = -1, o_w = -1, o_b = -1, ln2 = -1, gate_w = -1, gate_b = -1, up_w = -1, up_b = -1,
      down_w = -1, down_b = -1, moe = -1, count = 0;
};

ParamIndex param_index(const LlamaConfig& c, std::int64_t layer) {
  ParamIndex p;
  int n = 0;
  p.ln1 = n++;
  p.qkv_w = n++;
  if (c.qkv_bias) p.qkv_b = n++;
  if (c.qk_norm) {
    p.q_norm = n++;
    p.k_norm = n++;
  }
  p.o_w = n++;
  if (c.o_bias) p.o_b = n++;
  p.ln2 = n++;
  if (c.moe.is_sparse_layer(layer)) {
    p.moe = n;  // the MoE feed-forward's parameters follow (MoeMlp::params)
    p.count = n + static_cast<int>(MoeMlp::param_count(c.moe));
    return p;
  }
  p.gate_w = n++;
  if (c.mlp_bias) p.gate_b = n++;
  p.up_w = n++;
  if (c.mlp_bias) p.up_b = n++;
  p.down_w = n++;
  if (c.mlp_bias) p.down_b = n++;
  p.count = n;
  return p;
}

enum Saved {
  kLn1,
  kRstd1,
  kQkvRaw,
  kQkNormRstd,
  kQkv,
  kInvFreq,
  kAtty,
  kLse,
  kResidual2,
  kLn2,
  kRstd2,
  kGate,
  kUp,
  kH,
  kQkvHeads,
  kAttyHeads,
  kNumSaved
};
enum Scratch {
  kBtcA, kBtcB, kDqkv, kBtiA, kBtiB, kMatmul, kAttention, kQkNormGrad, kSend, kRecv, kDattyHeads, kDqkvHeads, kWholeA, kWholeB, kNormGrads, kGateTile,
  kUpTile, kHTile, kQkWholeA, kQkWholeB, kQkWholeC, kQkWholeSums, kNumScratch
};

Tensor opt(std::span<const Tensor> v, int i) { return i < 0 ? Tensor{} : v[static_cast<std::size_t>(i)]; }

// One tile of the tiled MLP: its rows' gate, up and h in the block's scratch.
struct MlpTile {
  Tensor gate, up, h;
};
MlpTile mlp_tile(std::span<const Tensor> scratch, std::int64_t n) {
  const auto rows = [&](int k) { return row_range(scratch[static_cast<std::size_t>(k)], 0, n, scratch[static_cast<std::size_t>(k)].shape[1]); };
  return {rows(kGateTile), rows(kUpTile), rows(kHTile)};
}

// A tile's gate = x · gate_projᵀ, up = x · up_projᵀ (+ biases), h = silu(gate) * up; x: its rows of ln2.
void mlp_tile_forward(const MlpTile& t, const Tensor& x, std::span<const Tensor> p, const ParamIndex& pi, const Tensor& mm) {
  matmul_forward(t.gate, x, p[static_cast<std::size_t>(pi.gate_w)], opt(p, pi.gate_b), mm);
  matmul_forward(t.up, x, p[static_cast<std::size_t>(pi.up_w)], opt(p, pi.up_b), mm);
  swiglu_forward(t.h, t.gate, t.up);
}

// OLMoE's q/k norm: RMSNorm over the `width` columns at `col` of each of the `rows` rows of qkv
// (row pitch W), in place, through two contiguous scratch tensors; rstd (rows) fp32.
void whole_norm_forward(const Tensor& qkv, std::int64_t rows, std::int64_t W, std::int64_t col, std::int64_t width, const Tensor& weight,
                        const Tensor& rstd, const Tensor& a, const Tensor& b, float eps) {
  const Tensor in(a.data, qkv.dtype, Shape{rows, width}, a.device), out(b.data, qkv.dtype, Shape{rows, width}, b.device);
  copy_rows(in, 0, width, qkv, col, W, rows, width);
  rmsnorm_forward(out, rstd, in, weight, eps);
  copy_rows(qkv, col, W, out, 0, width, rows, width);
}

// Its backward, in place on dqkv's columns: raw is the norm's input (the saved projection).
void whole_norm_backward(const Tensor& dqkv, const Tensor& raw, std::int64_t rows, std::int64_t W, std::int64_t col, std::int64_t width,
                         const Tensor& weight, const Tensor& dweight, const Tensor& rstd, const Tensor& a, const Tensor& b, const Tensor& c) {
  const Shape sh{rows, width};
  const Tensor x(a.data, raw.dtype, sh, a.device), dy(b.data, raw.dtype, sh, b.device), dx(c.data, raw.dtype, sh, c.device);
  copy_rows(x, 0, width, raw, col, W, rows, width);
  copy_rows(dy, 0, width, dqkv, col, W, rows, width);
  zero_tensor(dx);
  rmsnorm_backward(dx, dweight, dy, x, weight, rstd);
  copy_rows(dqkv, col, W, dx, 0, width, rows, width);
}

// OLMoE's q/k norm under tensor parallelism: the rank holds qw of the q projection's nq = NH·D
// columns of every token's row and kw of k's nk = NKV·D (its heads; none on a rank without heads,
// which joins the sums with zeros). Each norm's statistic is a sum over the whole row, so each
// direction forms the rank's share per token and norm, sums the 2·rows values over the group in
// one all-reduce, and finishes on the rank's columns (ops/kernels/rmsnorm.h rmsnorm_shard_*).
struct CutQkNorm {
  TensorParallelGroup* group = nullptr;
  std::int64_t rows = 0, W = 0, qw = 0, kw = 0, nq = 0, nk = 0;
  Tensor wq, wk;   // the rank's pieces of the norm weights
  Tensor rstd;     // (2·rows) fp32: q's, then k's; empty on a rank without heads
  Tensor sums;     // (2·rows) fp32 scratch: the group's sums
  Tensor a, b, c;  // (rows, ≥ qw) scratch: contiguous columns
  // q's (k = 0) or k's (k = 1) rows of a (2·rows) fp32 tensor
  Tensor rows_of(const Tensor& t, int k) const { return Tensor(static_cast<float*>(t.data) + k * rows, DType::fp32, Shape{rows}, t.device); }
  Tensor cols(const Tensor& scratch, DType dtype, std::int64_t width) const {
    return Tensor(scratch.data, dtype, Shape{rows, width}, scratch.device);
  }
  std::int64_t col(int k) const { return k == 0 ? 0 : qw; }
  std::int64_t width(int k) const { return k == 0 ? qw : kw; }
  std::int64_t whole(int k) const { return k == 0 ? nq : nk; }
  const Tensor& weight(int k) const { return k == 0 ? wq : wk; }

  // In place on qkv (rows, W): q's and k's columns normalised over the whole rows; rstd saved.
  void forward(const Tensor& qkv, float eps) const {
    const DType S = qkv.dtype;
    if (qw > 0) {
      const Tensor xq = cols(a, S, qw), xk = cols(b, S, kw);
      copy_rows(xq, 0, qw, qkv, 0, W, rows, qw);
      copy_rows(xk, 0, kw, qkv, qw, W, rows, kw);
      rmsnorm_shard_sum_squares(rows_of(sums, 0), xq);
      rmsnorm_shard_sum_squares(rows_of(sums, 1), xk);
    } else {
      zero_tensor(sums);
    }
    group->sum(sums);
    if (qw == 0) return;
    for (int k : {0, 1}) {
      const Tensor x = cols(k == 0 ? a : b, S, width(k)), y = cols(c, S, width(k));
      rmsnorm_shard_forward(y, rows_of(rstd, k), x, weight(k), rows_of(sums, k), whole(k), eps);
      copy_rows(qkv, col(k), W, y, 0, width(k), rows, width(k));
    }
  }

  // In place on dqkv (rows, W): d(normalised) becomes d(projection) on q's and k's columns; raw is
  // the norm's input (the saved projection, (rows, W)); the pieces' gradients accumulate into dwq, dwk.
  void backward(const Tensor& dqkv, const Tensor& raw, const Tensor& dwq, const Tensor& dwk) const {
    const DType S = dqkv.dtype;
    const auto load = [&](int k) {  // x into a, d(normalised) into b
      copy_rows(cols(a, S, width(k)), 0, width(k), raw, col(k), W, rows, width(k));
      copy_rows(cols(b, S, width(k)), 0, width(k), dqkv, col(k), W, rows, width(k));
    };
    if (qw > 0) {
      for (int k : {0, 1}) {
        load(k);
        rmsnorm_shard_backward_dot(rows_of(sums, k), cols(b, S, width(k)), cols(a, S, width(k)), weight(k), rows_of(rstd, k));
      }
    } else {
      zero_tensor(sums);
    }
    group->sum(sums);
    if (qw == 0) return;
    for (int k : {1, 0}) {  // k's columns are still loaded
      if (k == 0) load(0);
      const Tensor dx = cols(c, S, width(k));
      zero_tensor(dx);
      rmsnorm_shard_backward(dx, k == 0 ? dwq : dwk, cols(b, S, width(k)), cols(a, S, width(k)), weight(k), rows_of(rstd, k), rows_of(sums, k),
                             whole(k));
      copy_rows(dqkv, col(k), W, dx, 0, width(k), rows, width(k));
    }
  }
};

// The cut norm of a block built for a tensor-parallel rank: rstd_saved is the block's saved
// qk_norm_rstd, whose first 2·rows values it uses.
CutQkNorm cut_qk_norm(TensorParallelGroup* group, const LlamaConfig& cfg, std::int64_t rows, std::int64_t W, std::int64_t qw, std::int64_t kw,
                      std::span<const Tensor> p, const ParamIndex& pi, const Tensor& rstd_saved, std::span<const Tensor> scratch) {
  CutQkNorm n;
  n.group = group;
  n.rows = rows;
  n.W = W;
  n.qw = qw;
  n.kw = kw;
  n.nq = cfg.q_dim();
  n.nk = cfg.kv_dim();
  n.wq = p[static_cast<std::size_t>(pi.q_norm)];
  n.wk = p[static_cast<std::size_t>(pi.k_norm)];
  if (qw > 0) n.rstd = Tensor(rstd_saved.data, DType::fp32, Shape{2 * rows}, rstd_saved.device);
  n.sums = scratch[kQkWholeSums];
  n.a = scratch[kQkWholeA];
  n.b = scratch[kQkWholeB];
  n.c = scratch[kQkWholeC];
  return n;
}

// (B, T, H, D) view of a (B, T, H·D) tensor.
Tensor heads_view(const Tensor& t, std::int64_t H, std::int64_t D) { return Tensor(t.data, t.dtype, Shape{t.shape[0], t.shape[1], H, D}, t.device); }

}  // namespace

LlamaBlock::LlamaBlock(const LlamaConfig& cfg, std::int64_t index, TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep)
    : cfg_(cfg),
      index_(index),
      tp_(tp),
      sp_(sp),
      ep_(ep),
      nkv_(units_of_rank(cfg.n_kv_head, tp.ranks, tp.rank)),
      nh_(nkv_ * (cfg.n_kv_head > 0 ? cfg.n_head / cfg.n_kv_head : 0)),
      inter_(cfg.moe.is_sparse_layer(index) ? 0 : units_of_rank(cfg.intermediate_size, tp.ranks, tp.rank)),
      inv_freq_(rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)) {
  validate(cfg_);
  if (cfg_.moe.is_sparse_layer(index_))
    moe_.emplace(cfg_.moe, cfg_.n_embd, index_, "model.layers." + std::to_string(index_) + ".mlp.", cfg_.initializer_range, ep_);
}

std::vector<ParamSpec> LlamaBlock::params() const {
  const std::int64_t C = cfg_.n_embd, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const float sd = cfg_.initializer_range;
  const std::string p = "model.layers." + std::to_string(index_) + ".";
  // Tensor parallelism (Megatron): qkv_proj, gate_proj and up_proj column-parallel, o_proj and
  // down_proj row-parallel. q, k and v are cut per key/value head: k and v in whole heads, q in the
  // group of n_head / n_kv_head query heads that share each, so that a rank's queries see its keys.
  const std::int64_t group = cfg_.n_head / cfg_.n_kv_head * D;
  const ParamSplit qkv = ParamSplit::rows({{cfg_.q_dim(), group}, {cfg_.kv_dim(), D}, {cfg_.kv_dim(), D}});
  std::vector<ParamSpec> v;
  v.push_back({p + "input_layernorm.weight", Shape{C}, ParamInit::ones(), false, {}});
  v.push_back({p + "self_attn.qkv_proj.weight", Shape{cfg_.qkv_dim(), C}, ParamInit::normal(sd), true, {}, qkv});  // [q_proj | k_proj | v_proj]
  if (cfg_.qkv_bias) v.push_back({p + "self_attn.qkv_proj.bias", Shape{cfg_.qkv_dim()}, ParamInit::zeros(), false, {}, qkv});
  if (cfg_.qk_norm_whole) {
    // OLMoE: one weight per column of the whole q and k projections, cut with their heads (q in
    // the groups of query heads, k in key/value heads, as qkv_proj's rows).
    v.push_back({p + "self_attn.q_norm.weight", Shape{cfg_.q_dim()}, ParamInit::ones(), false, {}, ParamSplit::rows({{cfg_.q_dim(), group}})});
    v.push_back({p + "self_attn.k_norm.weight", Shape{cfg_.kv_dim()}, ParamInit::ones(), false, {}, ParamSplit::rows({{cfg_.kv_dim(), D}})});
  } else if (cfg_.qk_norm) {
    // Qwen3: one weight per head dimension, shared by the heads (replicated)
    v.push_back({p + "self_attn.q_norm.weight", Shape{D}, ParamInit::ones(), false, {}});
    v.push_back({p + "self_attn.k_norm.weight", Shape{D}, ParamInit::ones(), false, {}});
  }
  v.push_back({p + "self_attn.o_proj.weight", Shape{C, cfg_.q_dim()}, ParamInit::normal(sd), true, {}, ParamSplit::columns({{cfg_.q_dim(), group}})});
  if (cfg_.o_bias) v.push_back({p + "self_attn.o_proj.bias", Shape{C}, ParamInit::zeros(), false, {}});
  v.push_back({p + "post_attention_layernorm.weight", Shape{C}, ParamInit::ones(), false, {}});
  if (moe_) {
    for (ParamSpec& spec : v) spec = piece_spec(std::move(spec), tp_);
    // Tensor parallelism keeps the experts whole on every rank; expert parallelism cuts them (MoeMlp::params).
    for (ParamSpec& spec : moe_->params()) v.push_back(std::move(spec));
    return v;
  }
  v.push_back({p + "mlp.gate_proj.weight", Shape{I, C}, ParamInit::normal(sd), true, {}, ParamSplit::rows()});
  if (cfg_.mlp_bias) v.push_back({p + "mlp.gate_proj.bias", Shape{I}, ParamInit::zeros(), false, {}, ParamSplit::rows()});
  v.push_back({p + "mlp.up_proj.weight", Shape{I, C}, ParamInit::normal(sd), true, {}, ParamSplit::rows()});
  if (cfg_.mlp_bias) v.push_back({p + "mlp.up_proj.bias", Shape{I}, ParamInit::zeros(), false, {}, ParamSplit::rows()});
  v.push_back({p + "mlp.down_proj.weight", Shape{C, I}, ParamInit::normal(sd), true, {}, ParamSplit::columns()});
  if (cfg_.mlp_bias) v.push_back({p + "mlp.down_proj.bias", Shape{C}, ParamInit::zeros(), false, {}});
  for (ParamSpec& spec : v) spec = piece_spec(std::move(spec), tp_);
  return v;
}

ActivationSpec LlamaBlock::output(const LayerDims& d) const { return {"x", tp_.residual_shape(d.B, d.T, cfg_.n_embd), d.dtype}; }

std::vector<ActivationSpec> LlamaBlock::saved_activations(const LayerDims& d) const {
  llama_check_sequence(cfg_, d.T);
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd, I = inter_, W = qkv_dim();
  const DType S = d.dtype, F = DType::fp32;
  // Without q/k norm the raw qkv is not needed after the forward (RoPE's backward needs no input).
  const std::int64_t raw = cfg_.qk_norm ? B * T * W : 0;
  const std::int64_t qk_rows = cfg_.qk_norm ? B * T * (nh_ + nkv_) : 0;
  // The residual stream and its norms: (B, T, C), or this rank's rows under Megatron's SP.
  const Shape R = tp_.residual_shape(B, T, C), Rs = layer_args::token_stats_shape(R);
  std::vector<ActivationSpec> v{
      {"ln1", R, S},
      {"ln1_rstd", Rs, F},
      {"qkv_raw", Shape{raw}, S},
      {"qk_norm_rstd", Shape{qk_rows}, F},
      {"qkv", Shape{B, sp_.active() ? 0 : T, W}, S},  // sequence parallelism: not kept (qkv_heads is)
      {"rope_inv_freq", Shape{cfg_.head_dim / 2}, F},
      {"atty", Shape{B, T, q_dim()}, S},
      {"att_lse", Shape{B, nh_ / sp_.ranks, sp_.ranks * T}, F},
      {"residual2", R, S},
      {"ln2", R, S},
      {"ln2_rstd", Rs, F},
      {"gate", Shape{B, sp_.tiles_mlp(B * T) ? 0 : T, I}, S},  // tiled MLP: not kept
      {"up", Shape{B, sp_.tiles_mlp(B * T) ? 0 : T, I}, S},
      {"h", Shape{B, sp_.tiles_mlp(B * T) ? 0 : T, I}, S},
      // sequence parallelism: every token of this rank's share of the heads
      {"qkv_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, W / sp_.ranks}, S},
      {"atty_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, q_dim() / sp_.ranks}, S},
  };
  if (moe_)
    for (ActivationSpec& spec : moe_->saved_activations(d)) v.push_back(std::move(spec));
  return v;
}

std::vector<ActivationSpec> LlamaBlock::scratch(const LayerDims& d) const {
  const std::int64_t B = d.B, T = d.T, C = cfg_.n_embd, I = inter_;
  const std::int64_t widest_in = std::max({C, q_dim(), I});
  const bool cut = tp_.shards_residual(B * T);
  std::vector<ActivationSpec> v{
      {"btc_a", tp_.residual_shape(B, T, C), d.dtype},             // forward: branch outputs; backward: d(ln2), then d(ln1)
      {"btc_b", Shape{B, T, std::max(C, q_dim())}, d.dtype},  // backward: d(atty)
      {"dqkv", Shape{B, T, qkv_dim()}, d.dtype},
      {"bti_a", Shape{B, T, I}, d.dtype},  // backward: d(h), then d(gate)
      {"bti_b", Shape{B, T, I}, d.dtype},  // backward: d(up)
      {"matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(d.dtype, widest_in))}, DType::fp32},
      {"attention",
       Shape{static_cast<std::int64_t>(attention_backward_scratch_elems(B, sp_.ranks * T, q_dim() / sp_.ranks, nh_ / sp_.ranks))},
       DType::fp32},
      // tensor parallelism with Qwen3's q/k norm: this rank's share of the two norm weights' gradients, summed over the group
      {"qk_norm_grad", Shape{tp_.active() && cfg_.qk_norm && !cfg_.qk_norm_whole ? 2 * cfg_.head_dim : 0}, d.dtype},
      // sequence parallelism: the all-to-alls' buffers and the head-split gradients
      {"ulysses_send", Shape{sp_.active() ? B * T * qkv_dim() : 0}, d.dtype},
      {"ulysses_recv", Shape{sp_.active() ? B * T * qkv_dim() : 0}, d.dtype},
      {"datty_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, q_dim() / sp_.ranks}, d.dtype},
      {"dqkv_heads", Shape{B, sp_.active() ? sp_.ranks * T : 0, qkv_dim() / sp_.ranks}, d.dtype},
      // Megatron's sequence parallelism: every token of ln1 / ln2 (gathered); of a projection's
      // partial output, d(out), d(ln2), d(ln1); the RMSNorms' gradients before the group's sum
      {"whole_a", Shape{B, cut ? T : 0, C}, d.dtype},
      {"whole_b", Shape{B, cut ? T : 0, C}, d.dtype},
      {"norm_grads", Shape{cut ? 2 * C : 0}, d.dtype},
      // tiled MLP: one tile's gate, up and h
      {"gate_tile", Shape{sp_.tiles_mlp(B * T) ? sp_.mlp_tile_rows : 0, I}, d.dtype},
      {"up_tile", Shape{sp_.tiles_mlp(B * T) ? sp_.mlp_tile_rows : 0, I}, d.dtype},
      {"h_tile", Shape{sp_.tiles_mlp(B * T) ? sp_.mlp_tile_rows : 0, I}, d.dtype},
      // OLMoE's q/k norm over whole projections: a projection's rows, contiguous (input, output, gradient)
      {"qk_whole_a", Shape{cfg_.qk_norm_whole ? B * T : 0, q_dim()}, d.dtype},
      {"qk_whole_b", Shape{cfg_.qk_norm_whole ? B * T : 0, q_dim()}, d.dtype},
      {"qk_whole_c", Shape{cfg_.qk_norm_whole ? B * T : 0, q_dim()}, d.dtype},
      // ... cut by tensor parallelism: each token's two row statistics, summed over the group
      {"qk_whole_sums", Shape{cfg_.qk_norm_whole && tp_.active() ? 2 * B * T : 0}, DType::fp32},
  };
  if (moe_)
    for (ActivationSpec& spec : moe_->scratch(d)) v.push_back(std::move(spec));
  return v;
}

void LlamaBlock::forward(const ForwardArgs& a) {
  const ParamIndex pi = param_index(cfg_, index_);
  expect_count(name(), "params", a.params, static_cast<std::size_t>(pi.count));
  expect_count(name(), "saved", a.saved, kNumSaved + moe_saved_count());
  expect_count(name(), "scratch", a.scratch, kNumScratch + moe_scratch_count());
  const auto& p = a.params;
  const auto& s = a.saved;
  const std::int64_t B = a.dims.B, T = a.dims.T, C = cfg_.n_embd, NH = nh_, NKV = nkv_, D = cfg_.head_dim;
  const Tensor proj = a.scratch[kBtcA];
  const Tensor mm = a.scratch[kMatmul];
  const float eps = cfg_.rms_norm_eps;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Shape whole{B, T, C};
  // A projection's partial output over every token; the residual stream's rows of its sum.
  const Tensor proj_whole = rs.whole(a.scratch[kWholeB], proj, whole);
  auto row_parallel = [&](const Tensor& inp, const Tensor& w, const Tensor& b) {
    layer_args::row_parallel_forward(proj_whole, proj, inp, w, b, mm, tp_, rs);
  };

  rmsnorm_forward(s[kLn1], s[kRstd1], a.input, p[pi.ln1], eps);
  const Tensor ln1 = rs.whole(a.scratch[kWholeA], s[kLn1], whole);
  rs.gather(s[kLn1], ln1);
  // Sequence parallelism: the rank's tokens' qkv lives in the all-to-all's receive buffer, read
  // only while the send buffer is packed; the attention keeps qkv_heads.
  const Tensor qkv = sp_.active() ? Tensor(a.scratch[kRecv].data, a.dims.dtype, Shape{B, T, qkv_dim()}, a.scratch[kRecv].device) : s[kQkv];
  // OLMoE's q/k norm cut across the tensor-parallel ranks: its row sums need the group
  TensorParallelGroup* group = tp_.active() ? &layer_group(a.tensor_parallel, tp_, name()) : nullptr;
  const bool cut_norm = group != nullptr && cfg_.qk_norm_whole;
  if (nh_ == 0) {
    // no heads on this rank: nothing to attend; o_proj adds zeros below. A cut q/k norm's sums
    // are the group's: this rank adds zeros.
    if (cut_norm) cut_qk_norm(group, cfg_, B * T, qkv_dim(), 0, 0, p, pi, s[kQkNormRstd], a.scratch).forward(qkv, eps);
  } else if (cfg_.qk_norm) {
    const Tensor raw(s[kQkvRaw].data, a.dims.dtype, qkv.shape, s[kQkvRaw].device);
    matmul_forward(raw, ln1, p[pi.qkv_w], opt(p, pi.qkv_b), mm);
    copy_tensor(qkv, raw);
    const Tensor heads = heads_view(qkv, NH + 2 * NKV, D);
    const Tensor rstd(s[kQkNormRstd].data, DType::fp32, Shape{B, T, NH + NKV}, s[kQkNormRstd].device);
    const std::int64_t q_rows = B * T * NH;
    if (cut_norm) {  // OLMoE under tensor parallelism: the rank's columns of the whole rows
      cut_qk_norm(group, cfg_, B * T, qkv_dim(), q_dim(), kv_dim(), p, pi, s[kQkNormRstd], a.scratch)
          .forward(Tensor(qkv.data, qkv.dtype, Shape{B * T, qkv_dim()}, qkv.device), eps);
    } else if (cfg_.qk_norm_whole) {  // OLMoE: over the whole q and k projections, rstd per token
      float* r = static_cast<float*>(rstd.data);
      const Device rd = rstd.device;
      const auto& sc = a.scratch;
      whole_norm_forward(qkv, B * T, qkv_dim(), 0, q_dim(), p[pi.q_norm], Tensor(r, DType::fp32, Shape{B * T}, rd), sc[kQkWholeA], sc[kQkWholeB], eps);
      whole_norm_forward(qkv, B * T, qkv_dim(), q_dim(), kv_dim(), p[pi.k_norm], Tensor(r + B * T, DType::fp32, Shape{B * T}, rd), sc[kQkWholeA],
                         sc[kQkWholeB], eps);
    } else {
      head_rmsnorm_forward(heads, Tensor(rstd.data, DType::fp32, Shape{B, T, NH}, rstd.device), p[pi.q_norm], 0, NH, eps);
      head_rmsnorm_forward(heads, Tensor(static_cast<float*>(rstd.data) + q_rows, DType::fp32, Shape{B, T, NKV}, rstd.device), p[pi.k_norm], NH,
                           NKV, eps);
    }
  } else {
    matmul_forward(qkv, ln1, p[pi.qkv_w], opt(p, pi.qkv_b), mm);
  }
  copy_tensor(s[kInvFreq], Tensor(inv_freq_.data(), DType::fp32, Shape{D / 2}));
  if (nh_ > 0) {
    const Tensor heads = heads_view(qkv, NH + 2 * NKV, D);
    rope_forward(heads, heads, s[kInvFreq], NH + NKV, sp_.rank * T);
    attention(a.sequence_parallel, a.rng, a.train, a.scratch).forward(s[kAtty], s[kLse], qkv, s[kQkvHeads], s[kAttyHeads]);
  }
  row_parallel(s[kAtty], p[pi.o_w], opt(p, pi.o_b));
  fused_residual_rmsnorm_forward(s[kResidual2], s[kLn2], s[kRstd2], a.input, proj, p[pi.ln2], eps);

  const Tensor ln2 = rs.whole(a.scratch[kWholeA], s[kLn2], whole);
  rs.gather(s[kLn2], ln2);
  if (moe_) {
    // Every token's experts on every tensor-parallel rank (the experts are whole there): the
    // output of every token, of which a cut residual stream keeps this rank's rows.
    ExpertParallelGroup* experts = ep_.active() ? &expert_layer_group(a.expert_parallel, ep_, name()) : nullptr;
    moe_->forward(proj_whole, ln2, p.subspan(static_cast<std::size_t>(pi.moe)), s.subspan(kNumSaved), a.scratch.subspan(kNumScratch), a.moe,
                  experts);
    if (rs.sharded) copy_tensor(proj, row_range(Tensor(proj_whole.data, proj_whole.dtype, Shape{B * T, C}, proj_whole.device), tp_.rank * proj.numel() / C, proj.numel() / C, C));
  } else if (!sp_.tiles_mlp(B * T)) {
    matmul_forward(s[kGate], ln2, p[pi.gate_w], opt(p, pi.gate_b), mm);
    matmul_forward(s[kUp], ln2, p[pi.up_w], opt(p, pi.up_b), mm);
    swiglu_forward(s[kH], s[kGate], s[kUp]);
    row_parallel(s[kH], p[pi.down_w], opt(p, pi.down_b));
  } else {
    // Tiled: each tile's gate, up and h in scratch, its rows of down_proj's partial output.
    for_each_row_tile(B * T, sp_.mlp_tile_rows, [&](std::int64_t r0, std::int64_t n) {
      const MlpTile t = mlp_tile(a.scratch, n);
      mlp_tile_forward(t, row_range(ln2, r0, n, C), p, pi, mm);
      matmul_forward(row_range(proj_whole, r0, n, C), t.h, p[pi.down_w], tp_.rank == 0 ? opt(p, pi.down_b) : Tensor{}, mm);
    });
    rs.reduce(proj_whole, proj);
  }
  residual_forward(a.output, s[kResidual2], proj);
}

void LlamaBlock::backward(const BackwardArgs& a) {
  const ParamIndex pi = param_index(cfg_, index_);
  expect_count(name(), "params", a.params, static_cast<std::size_t>(pi.count));
  expect_count(name(), "grads", a.grads, static_cast<std::size_t>(pi.count));
  expect_count(name(), "saved", a.saved, kNumSaved + moe_saved_count());
  expect_count(name(), "scratch", a.scratch, kNumScratch + moe_scratch_count());
  const auto& p = a.params;
  const auto& g = a.grads;
  const auto& s = a.saved;
  const std::int64_t B = a.dims.B, T = a.dims.T, C = cfg_.n_embd, NH = nh_, NKV = nkv_, D = cfg_.head_dim;
  const DType S = a.dims.dtype;
  const Device dev = a.scratch[kBtcA].device;
  const Tensor btc_a = a.scratch[kBtcA];
  const Tensor mm = a.scratch[kMatmul];
  TensorParallelGroup* group = tp_.active() ? &layer_group(a.tensor_parallel, tp_, name()) : nullptr;
  const ResidualShards rs = layer_args::residual_shards(a.tensor_parallel, tp_, a.dims, name());
  const Shape whole{B, T, C};
  // The RMSNorms' gradients: formed from this rank's rows and summed over the group when the
  // residual stream is cut (models/residual_shards.h), into the gradients directly otherwise.
  ReplicatedGradSum norm_grads(rs, {g[pi.ln1], g[pi.ln2]}, a.scratch[kNormGrads]);

  const Tensor dres = a.dinput;
  copy_tensor(dres, a.dout);  // a no-op when dinput is dout

  // ---- MLP branch: out = residual2 + down(silu(gate(ln2)) * up(ln2)) ----
  // Cut: d(out) of every token, gathered, and ln2 of every token again (only this rank's rows were
  // kept); d(ln2) of every token goes into the gathered d(out)'s memory as d(out) is consumed.
  const Tensor dout_whole = rs.whole(a.scratch[kWholeB], dres, whole);
  rs.gather(dres, dout_whole);
  const Tensor ln2 = rs.whole(a.scratch[kWholeA], s[kLn2], whole);
  rs.gather(s[kLn2], ln2);
  const Tensor dln2_whole = rs.sharded ? dout_whole : btc_a;
  const Tensor dh = a.scratch[kBtiA], dup = a.scratch[kBtiB];
  if (moe_) {
    // d(ln2) of every token, whole on every rank (not a partial sum: the experts are not cut)
    ExpertParallelGroup* experts = ep_.active() ? &expert_layer_group(a.expert_parallel, ep_, name()) : nullptr;
    moe_->backward(dln2_whole, dout_whole, ln2, p.subspan(static_cast<std::size_t>(pi.moe)), g.subspan(static_cast<std::size_t>(pi.moe)),
                   s.subspan(kNumSaved), a.scratch.subspan(kNumScratch), a.moe, a.dloss, experts);
  } else if (!sp_.tiles_mlp(B * T)) {
    zero_tensor(dh);
    matmul_backward(dh, g[pi.down_w], opt(g, pi.down_b), dout_whole, s[kH], p[pi.down_w], mm);
    // d(gate) goes into the saved h, which is dead once down_proj's backward has read it.
    const Tensor dgate = s[kH];
    zero_tensor(dgate);
    zero_tensor(dup);
    swiglu_backward(dgate, dup, dh, s[kGate], s[kUp]);
    zero_tensor(dln2_whole);
    matmul_backward(dln2_whole, g[pi.gate_w], opt(g, pi.gate_b), dgate, ln2, p[pi.gate_w], mm);
    matmul_backward(dln2_whole, g[pi.up_w], opt(g, pi.up_b), dup, ln2, p[pi.up_w], mm);
  } else {
    // Tiled: each tile's gate, up and h again, then its share of every gradient; a tile's rows of
    // d(ln2) are written after its rows of d(out) are read (they may be the same memory).
    for_each_row_tile(B * T, sp_.mlp_tile_rows, [&](std::int64_t r0, std::int64_t n) {
      const MlpTile t = mlp_tile(a.scratch, n);
      const Tensor ln2_rows = row_range(ln2, r0, n, C);
      mlp_tile_forward(t, ln2_rows, p, pi, mm);
      const Tensor dh_rows = row_range(dh, 0, n, inter_), dup_rows = row_range(dup, 0, n, inter_);
      zero_tensor(dh_rows);
      matmul_backward(dh_rows, g[pi.down_w], opt(g, pi.down_b), row_range(dout_whole, r0, n, C), t.h, p[pi.down_w], mm);
      const Tensor dgate_rows = t.h;  // h is dead once read
      zero_tensor(dgate_rows);
      zero_tensor(dup_rows);
      swiglu_backward(dgate_rows, dup_rows, dh_rows, t.gate, t.up);
      const Tensor dln2_rows = row_range(dln2_whole, r0, n, C);
      zero_tensor(dln2_rows);
      matmul_backward(dln2_rows, g[pi.gate_w], opt(g, pi.gate_b), dgate_rows, ln2_rows, p[pi.gate_w], mm);
      matmul_backward(dln2_rows, g[pi.up_w], opt(g, pi.up_b), dup_rows, ln2_rows, p[pi.up_w], mm);
    });
  }
  // The column-parallel gate/up's input gradient, partial per rank: summed (cut: this rank's rows).
  // The experts' is whole on every rank: a cut stream takes this rank's rows of it.
  const Tensor dln2 = btc_a;
  if (!moe_) {
    rs.reduce(dln2_whole, dln2);
  } else if (rs.sharded) {
    const std::int64_t rows = dln2.numel() / C;
    copy_tensor(dln2, row_range(Tensor(dln2_whole.data, dln2_whole.dtype, Shape{B * T, C}, dln2_whole.device), tp_.rank * rows, rows, C));
  }
  rmsnorm_backward(dres, norm_grads.grad(1), dln2, s[kResidual2], p[pi.ln2], s[kRstd2]);

  // ---- attention branch: residual2 = x + o_proj(attn(...)) ----
  const Tensor dres_whole = rs.whole(a.scratch[kWholeB], dres, whole);
  rs.gather(dres, dres_whole);
  // d(ln1) of every token: btc_a (d(ln2) is dead), or when cut the gathered d(residual2)'s memory
  // once o_proj's backward has read it.
  const Tensor dln1_whole = rs.sharded ? dres_whole : btc_a;
  // Cut: ln1 of every token again, on every rank (a rank without heads joins the collective).
  const Tensor ln1 = rs.whole(a.scratch[kWholeA], s[kLn1], whole);
  rs.gather(s[kLn1], ln1);
  // Tensor parallelism with q/k norm: the norm weights' gradients from this rank's heads go to a
  // scratch that is summed over the group (every rank joins the sum, with or without heads).
  const Tensor qk_partial = a.scratch[kQkNormGrad];
  const bool sum_qk_norm = group != nullptr && cfg_.qk_norm && !cfg_.qk_norm_whole;
  // OLMoE's q/k norm weights are cut with the heads: each rank's gradient is its piece's. Its
  // backward's row sums are the group's (every rank joins, with or without heads).
  const bool cut_norm = group != nullptr && cfg_.qk_norm_whole;
  const Tensor dq_norm = sum_qk_norm ? Tensor(qk_partial.data, S, Shape{D}, dev) : opt(g, pi.q_norm);
  const Tensor dk_norm =
      sum_qk_norm ? Tensor(static_cast<char*>(qk_partial.data) + D * static_cast<std::int64_t>(dtype_size(S)), S, Shape{D}, dev) : opt(g, pi.k_norm);
  if (sum_qk_norm) zero_tensor(qk_partial);
  if (nh_ > 0) {
    const Tensor datty(a.scratch[kBtcB].data, S, Shape{B, T, q_dim()}, dev);
    zero_tensor(datty);
    matmul_backward(datty, g[pi.o_w], opt(g, pi.o_b), dres_whole, s[kAtty], p[pi.o_w], mm);
    const Tensor dqkv = a.scratch[kDqkv];
    attention(a.sequence_parallel, a.rng, a.train, a.scratch)
        .backward(dqkv, datty, s[kQkv], s[kAtty], s[kQkvHeads], s[kAttyHeads], s[kLse], a.scratch[kAttention], a.scratch[kDattyHeads],
                  a.scratch[kDqkvHeads]);
    const Tensor dheads = heads_view(dqkv, NH + 2 * NKV, D);
    rope_backward(dheads, dheads, s[kInvFreq], NH + NKV, sp_.rank * T);
    if (cfg_.qk_norm) {
      const Tensor raw = heads_view(Tensor(s[kQkvRaw].data, S, Shape{B, T, qkv_dim()}, s[kQkvRaw].device), NH + 2 * NKV, D);
      float* rstd = static_cast<float*>(s[kQkNormRstd].data);
      const Device rd = s[kQkNormRstd].device;
      if (cut_norm) {
        const Tensor raw2(s[kQkvRaw].data, S, Shape{B * T, qkv_dim()}, s[kQkvRaw].device);
        cut_qk_norm(group, cfg_, B * T, qkv_dim(), q_dim(), kv_dim(), p, pi, s[kQkNormRstd], a.scratch)
            .backward(Tensor(dqkv.data, S, Shape{B * T, qkv_dim()}, dqkv.device), raw2, dq_norm, dk_norm);
      } else if (cfg_.qk_norm_whole) {
        const Tensor raw2(s[kQkvRaw].data, S, Shape{B * T, qkv_dim()}, s[kQkvRaw].device);
        const auto& sc = a.scratch;
        whole_norm_backward(dqkv, raw2, B * T, qkv_dim(), 0, q_dim(), p[pi.q_norm], dq_norm, Tensor(rstd, DType::fp32, Shape{B * T}, rd), sc[kQkWholeA],
                            sc[kQkWholeB], sc[kQkWholeC]);
        whole_norm_backward(dqkv, raw2, B * T, qkv_dim(), q_dim(), kv_dim(), p[pi.k_norm], dk_norm, Tensor(rstd + B * T, DType::fp32, Shape{B * T}, rd),
                            sc[kQkWholeA], sc[kQkWholeB], sc[kQkWholeC]);
      } else {
        head_rmsnorm_backward(dheads, dq_norm, raw, p[pi.q_norm], Tensor(rstd, DType::fp32, Shape{B, T, NH}, rd), 0, NH);
        head_rmsnorm_backward(dheads, dk_norm, raw, p[pi.k_norm], Tensor(rstd + B * T * NH, DType::fp32, Shape{B, T, NKV}, rd), NH, NKV);
      }
    }
    zero_tensor(dln1_whole);
    matmul_backward(dln1_whole, g[pi.qkv_w], opt(g, pi.qkv_b), dqkv, ln1, p[pi.qkv_w], mm);
  } else {
    // No heads on this rank: only the (replicated) o_proj bias's gradient, as every rank forms it.
    if (pi.o_b >= 0) matmul_backward(Tensor{}, Tensor{}, g[pi.o_b], dres_whole, s[kAtty], p[pi.o_w], mm);
    if (cut_norm) {
      cut_qk_norm(group, cfg_, B * T, qkv_dim(), 0, 0, p, pi, s[kQkNormRstd], a.scratch)
          .backward(Tensor{}, Tensor{}, Tensor{}, Tensor{});  // adds zeros to the group's sums
    }
    zero_tensor(dln1_whole);
  }
  if (sum_qk_norm) {
    group->sum(qk_partial);
    residual_forward(g[pi.q_norm], g[pi.q_norm], dq_norm);
    residual_forward(g[pi.k_norm], g[pi.k_norm], dk_norm);
  }
  // The column-parallel qkv_proj's input gradient, summed (cut: this rank's rows).
  const Tensor dln1 = btc_a;
  rs.reduce(dln1_whole, dln1);
  rmsnorm_backward(dres, norm_grads.grad(0), dln1, a.input, p[pi.ln1], s[kRstd1]);
  norm_grads.finish();
}

UlyssesAttention LlamaBlock::attention(SequenceParallelGroup* group, const RngKey& rng, bool train, std::span<const Tensor> scratch) const {
  UlyssesAttention u;
  u.group = sp_.active() ? &layer_group(group, sp_, name()) : nullptr;
  u.heads = AttentionHeads{nh_, nkv_};
  u.parts = {q_dim(), kv_dim(), kv_dim()};
  u.dropout = layer_args::parallel_dropout(cfg_.attention_dropout, rng, 0, train, layer_args::attention_stream(tp_, sp_));
  u.window = cfg_.attention_window();
  u.send = scratch[kSend];
  u.recv = scratch[kRecv];
  return u;
}

std::vector<std::unique_ptr<Layer>> make_llama_layers(const LlamaConfig& cfg, TensorParallelRank tp, SequenceParallelRank sp, ExpertParallelRank ep) {
  validate(cfg);
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<LlamaEmbedding>(cfg, tp));
  for (std::int64_t i = 0; i < cfg.n_layer; ++i) layers.push_back(std::make_unique<LlamaBlock>(cfg, i, tp, sp, ep));
  layers.push_back(std::make_unique<LlamaHead>(cfg, tp, sp.loss_tile_rows));
  return layers;
}

}  // namespace dstrain
