#include "models/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "models/layer_args.h"
#include "models/row_tiles.h"
#include "ops/error.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/moe.h"
#include "ops/kernels/swiglu.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

enum Param { kRouter, kExpGate, kExpUp, kExpDown, kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate };
enum Saved { kLogits, kScores, kExpert, kWeight, kSlotAssign, kSlotOf, kCounts, kXg, kG, kU, kH, kY, kSG, kSU, kSH, kSY, kSLogit, kNumSaved };
enum Scratch {
  kLogitsS, kDLogits, kDLogitsS, kDWeight, kDY, kDH, kDUp, kDXg, kMm, kAux, kAssigned, kProbSum, kDSY, kDSH, kDSUp, kDSLogit, kNumScratch
};

const Tensor& at(std::span<const Tensor> v, int i) { return v[static_cast<std::size_t>(i)]; }

// Block e of a stacked (E, a, b) parameter as an (a, b) matrix.
Tensor block(const Tensor& stacked, std::int64_t e) {
  const std::int64_t a = stacked.shape[1], b = stacked.shape[2];
  return Tensor(static_cast<char*>(stacked.data) + static_cast<std::size_t>(e * a * b) * dtype_size(stacked.dtype), stacked.dtype, Shape{a, b},
                stacked.device);
}

Tensor flat2(const Tensor& t, std::int64_t rows, std::int64_t cols) { return Tensor(t.data, t.dtype, Shape{rows, cols}, t.device); }

// counts (E) int32, wherever they live, on the host.
std::vector<std::int32_t> host_counts(const Tensor& counts) {
  std::vector<std::int32_t> c(static_cast<std::size_t>(counts.numel()));
  copy_tensor(Tensor(c.data(), DType::int32, counts.shape), counts);
  return c;
}

}  // namespace

MoeMlp::MoeMlp(const MoeConfig& moe, std::int64_t n_embd, std::int64_t layer, std::string prefix, float init_std)
    : moe_(moe), C_(n_embd), layer_(layer), prefix_(std::move(prefix)), init_std_(init_std) {}

std::size_t MoeMlp::param_count(const MoeConfig& moe) {
  if (moe.shared_expert_intermediate_size <= 0) return kSharedGate;
  return moe.shared_expert_gate ? kSharedExpertGate + 1 : kSharedExpertGate;
}
std::size_t MoeMlp::saved_count() { return kNumSaved; }
std::size_t MoeMlp::scratch_count() { return kNumScratch; }

MoeRouting MoeMlp::routing() const {
  MoeRouting r;
  r.top_k = moe_.top_k;
  r.sigmoid = moe_.score == MoeConfig::Score::sigmoid;
  r.renormalize = moe_.norm_topk_prob;
  r.scale = static_cast<float>(moe_.routed_scaling_factor);
  r.n_group = moe_.n_group;
  r.topk_group = moe_.topk_group;
  return r;
}

std::int64_t MoeMlp::capacity(std::int64_t N) const {
  if (moe_.capacity_factor <= 0.0) return -1;
  const double c = std::ceil(static_cast<double>(moe_.top_k * N) * moe_.capacity_factor / static_cast<double>(moe_.num_experts));
  return std::max<std::int64_t>(moe_.min_capacity, static_cast<std::int64_t>(c));
}

std::vector<ParamSpec> MoeMlp::params() const {
  const std::int64_t E = moe_.num_experts, I = moe_.expert_intermediate_size, C = C_, W = moe_.shared_expert_intermediate_size;
  const ParamInit n = ParamInit::normal(init_std_);
  std::vector<ParamSpec> v;
  v.push_back({prefix_ + "gate.weight", Shape{E, C}, n, true, {}});
  // The experts, stacked: expert parallelism hands each rank whole experts (ParamSplit::experts).
  v.push_back({prefix_ + "experts.gate_proj.weight", Shape{E, I, C}, n, true, {}, ParamSplit::experts()});
  v.push_back({prefix_ + "experts.up_proj.weight", Shape{E, I, C}, n, true, {}, ParamSplit::experts()});
  v.push_back({prefix_ + "experts.down_proj.weight", Shape{E, C, I}, n, true, {}, ParamSplit::experts()});
  if (shared()) {
    v.push_back({prefix_ + "shared_expert.gate_proj.weight", Shape{W, C}, n, true, {}});
    v.push_back({prefix_ + "shared_expert.up_proj.weight", Shape{W, C}, n, true, {}});
    v.push_back({prefix_ + "shared_expert.down_proj.weight", Shape{C, W}, n, true, {}});
    if (moe_.shared_expert_gate) v.push_back({prefix_ + "shared_expert_gate.weight", Shape{1, C}, n, true, {}});
  }
  return v;
}

std::vector<ActivationSpec> MoeMlp::saved_activations(const LayerDims& d) const {
  const std::int64_t N = d.B * d.T, E = moe_.num_experts, k = moe_.top_k, M = N * k, I = moe_.expert_intermediate_size, C = C_;
  const std::int64_t W = shared() ? moe_.shared_expert_intermediate_size : 0, NS = shared() ? N : 0;
  const DType S = d.dtype, F = DType::fp32, I32 = DType::int32;
  return {
      {"moe_logits", Shape{N, E}, F},
      {"moe_scores", Shape{N, E}, F},
      {"moe_expert", Shape{N, k}, I32},
      {"moe_weight", Shape{N, k}, F},
      {"moe_slot_assignment", Shape{M}, I32},
      {"moe_slot_of", Shape{M}, I32},
      {"moe_counts", Shape{E}, I32},
      {"moe_xg", Shape{M, C}, S},
      {"moe_gate", Shape{M, I}, S},
      {"moe_up", Shape{M, I}, S},
      {"moe_h", Shape{M, I}, S},
      {"moe_y", Shape{M, C}, S},
      {"shared_gate", Shape{NS, W}, S},
      {"shared_up", Shape{NS, W}, S},
      {"shared_h", Shape{NS, W}, S},
      {"shared_y", Shape{NS, C}, S},
      {"shared_gate_logit", Shape{shared() && moe_.shared_expert_gate ? N : 0, 1}, S},
  };
}

std::vector<ActivationSpec> MoeMlp::scratch(const LayerDims& d) const {
  const std::int64_t N = d.B * d.T, E = moe_.num_experts, k = moe_.top_k, M = N * k, I = moe_.expert_intermediate_size, C = C_;
  const std::int64_t W = shared() ? moe_.shared_expert_intermediate_size : 0, NS = shared() ? N : 0;
  const DType S = d.dtype, F = DType::fp32;
  const bool narrow = S != DType::fp32;  // the router's GEMM runs in S, the routing in fp32
  const std::int64_t widest = std::max({C, I, W});
  return {
      {"moe_logits_s", Shape{narrow ? N : 0, E}, S},
      {"moe_dlogits", Shape{N, E}, F},
      {"moe_dlogits_s", Shape{narrow ? N : 0, E}, S},
      {"moe_dweight", Shape{N, k}, F},
      {"moe_dy", Shape{M, C}, S},
      {"moe_dh", Shape{M, I}, S},
      {"moe_dup", Shape{M, I}, S},
      {"moe_dxg", Shape{M, C}, S},
      {"moe_matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(S, widest))}, F},
      {"moe_aux_grad", Shape{E}, F},
      {"moe_assigned", Shape{E}, DType::fp64},
      {"moe_prob_sum", Shape{E}, DType::fp64},
      {"shared_dy", Shape{shared() && moe_.shared_expert_gate ? N : 0, C}, S},
      {"shared_dh", Shape{NS, W}, S},
      {"shared_dup", Shape{NS, W}, S},
      {"shared_dgate_logit", Shape{shared() && moe_.shared_expert_gate ? N : 0, 1}, S},
  };
}

void MoeMlp::forward(const Tensor& out, const Tensor& x, std::span<const Tensor> p, std::span<const Tensor> s, std::span<const Tensor> sc,
                     MoeStats* stats) const {
  layer_args::expect_count(prefix_, "saved", s, kNumSaved);
  layer_args::expect_count(prefix_, "scratch", sc, kNumScratch);
  const std::int64_t C = C_, N = x.numel() / C, E = moe_.num_experts, k = moe_.top_k, I = moe_.expert_intermediate_size;
  const Tensor xs = flat2(x, N, C), o = flat2(out, N, C);
  const Tensor mm = at(sc, kMm);
  // ---- the router ----
  const Tensor logits = at(s, kLogits);
  if (x.dtype == DType::fp32) {
    matmul_forward(logits, xs, at(p, kRouter), Tensor{}, mm);
  } else {
    matmul_forward(at(sc, kLogitsS), xs, at(p, kRouter), Tensor{}, mm);
    convert_tensor(logits, at(sc, kLogitsS));
  }
  moe_route_forward(at(s, kScores), at(s, kExpert), at(s, kWeight), logits, routing());
  moe_dispatch_plan(at(s, kSlotAssign), at(s, kSlotOf), at(s, kCounts), at(s, kExpert), capacity(N));
  const std::vector<std::int32_t> counts = host_counts(at(s, kCounts));
  std::int64_t kept = 0;
  for (std::int32_t c : counts) kept += c;
  // ---- the experts, one GEMM each over exactly its rows ----
  moe_gather_rows(at(s, kXg), xs, at(s, kSlotAssign), k, kept);
  std::int64_t r0 = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t n = counts[static_cast<std::size_t>(e)];
    if (n > 0) {
      const Tensor xe = row_range(at(s, kXg), r0, n, C), g = row_range(at(s, kG), r0, n, I), u = row_range(at(s, kU), r0, n, I),
                   h = row_range(at(s, kH), r0, n, I);
      matmul_forward(g, xe, block(at(p, kExpGate), e), Tensor{}, mm);
      matmul_forward(u, xe, block(at(p, kExpUp), e), Tensor{}, mm);
      swiglu_forward(h, g, u);
      matmul_forward(row_range(at(s, kY), r0, n, C), h, block(at(p, kExpDown), e), Tensor{}, mm);
    }
    r0 += n;
  }
  zero_tensor(o);
  moe_combine(o, at(s, kY), at(s, kSlotOf), at(s, kWeight), k);
  // ---- the shared expert ----
  if (shared()) {
    const Tensor sg = at(s, kSG), su = at(s, kSU), sh = at(s, kSH), sy = at(s, kSY);
    matmul_forward(sg, xs, at(p, kSharedGate), Tensor{}, mm);
    matmul_forward(su, xs, at(p, kSharedUp), Tensor{}, mm);
    swiglu_forward(sh, sg, su);
    matmul_forward(sy, sh, at(p, kSharedDown), Tensor{}, mm);
    if (moe_.shared_expert_gate) {
      const Tensor gl = at(s, kSLogit);
      matmul_forward(gl, xs, at(p, kSharedExpertGate), Tensor{}, mm);
      moe_gated_add_forward(o, sy, Tensor(gl.data, gl.dtype, Shape{N}, gl.device));
    } else {
      residual_forward(o, o, sy);
    }
  }
  // ---- the load-balancing statistics and the report ----
  if (stats != nullptr && stats->recording) {
    moe_aux_stats(at(sc, kAssigned), at(sc, kProbSum), logits, k);
    std::vector<double> assigned(static_cast<std::size_t>(E)), prob(static_cast<std::size_t>(E));
    copy_tensor(Tensor(assigned.data(), DType::fp64, Shape{E}), at(sc, kAssigned));
    copy_tensor(Tensor(prob.data(), DType::fp64, Shape{E}), at(sc, kProbSum));
    stats->record(layer_, assigned, prob, counts, N * k - kept, N, moe_.aux_loss_weight());
  }
}

void MoeMlp::backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::span<const Tensor> p, std::span<const Tensor> g,
                      std::span<const Tensor> s, std::span<const Tensor> sc, const MoeStats* stats, float dloss) const {
  layer_args::expect_count(prefix_, "saved", s, kNumSaved);
  layer_args::expect_count(prefix_, "scratch", sc, kNumScratch);
  const std::int64_t C = C_, N = x.numel() / C, E = moe_.num_experts, k = moe_.top_k, I = moe_.expert_intermediate_size;
  const Tensor xs = flat2(x, N, C), dxs = flat2(dx, N, C), douts = flat2(dout, N, C);
  const Tensor mm = at(sc, kMm);
  const std::vector<std::int32_t> counts = host_counts(at(s, kCounts));
  // ---- the combine: d(y) of each kept slot, d(weight) of each assignment ----
  moe_combine_backward(at(sc, kDY), at(sc, kDWeight), douts, at(s, kY), at(s, kSlotOf), at(s, kWeight), k);
  // The shared expert's reads of d(out) come next, so that dx may be dout's memory from here on.
  const Tensor dsh = at(sc, kDSH), dgl = at(sc, kDSLogit);
  if (shared()) {
    Tensor dsy = douts;
    if (moe_.shared_expert_gate) {
      const Tensor gl = at(s, kSLogit);
      dsy = at(sc, kDSY);
      moe_gated_add_backward(dsy, Tensor(dgl.data, dgl.dtype, Shape{N}, dgl.device), douts, at(s, kSY), Tensor(gl.data, gl.dtype, Shape{N}, gl.device));
    }
    zero_tensor(dsh);
    matmul_backward(dsh, at(g, kSharedDown), Tensor{}, dsy, at(s, kSH), at(p, kSharedDown), mm);
  }
  // ---- the experts ----
  std::int64_t r0 = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t n = counts[static_cast<std::size_t>(e)];
    if (n > 0) {
      const Tensor xe = row_range(at(s, kXg), r0, n, C), ge = row_range(at(s, kG), r0, n, I), ue = row_range(at(s, kU), r0, n, I),
                   he = row_range(at(s, kH), r0, n, I);
      const Tensor dh = row_range(at(sc, kDH), r0, n, I), dup = row_range(at(sc, kDUp), r0, n, I), dxe = row_range(at(sc, kDXg), r0, n, C);
      zero_tensor(dh);
      matmul_backward(dh, block(at(g, kExpDown), e), Tensor{}, row_range(at(sc, kDY), r0, n, C), he, block(at(p, kExpDown), e), mm);
      const Tensor dgate = he;  // h is dead once down_proj's backward has read it
      zero_tensor(dgate);
      zero_tensor(dup);
      swiglu_backward(dgate, dup, dh, ge, ue);
      zero_tensor(dxe);
      matmul_backward(dxe, block(at(g, kExpGate), e), Tensor{}, dgate, xe, block(at(p, kExpGate), e), mm);
      matmul_backward(dxe, block(at(g, kExpUp), e), Tensor{}, dup, xe, block(at(p, kExpUp), e), mm);
    }
    r0 += n;
  }
  // d(x): the sum of each token's slots (the gather's gradient)
  zero_tensor(dxs);
  moe_combine(dxs, at(sc, kDXg), at(s, kSlotOf), Tensor{}, k);
  // ---- the router: through the weights, and the load-balancing loss's term ----
  Tensor aux;
  if (stats != nullptr && stats->aux_weight() > 0.0) {
    const std::vector<float> ag = stats->aux_grad(dloss);
    if (static_cast<std::int64_t>(ag.size()) != E) fail("{}: the load-balancing statistics hold {} experts, this layer {}", prefix_, ag.size(), E);
    aux = at(sc, kAux);
    copy_tensor(aux, Tensor(const_cast<float*>(ag.data()), DType::fp32, Shape{E}));
  }
  const Tensor dlogits = at(sc, kDLogits);
  moe_route_backward(dlogits, at(sc, kDWeight), at(s, kScores), at(s, kExpert), at(s, kWeight), at(s, kLogits), aux, routing());
  if (x.dtype == DType::fp32) {
    matmul_backward(dxs, at(g, kRouter), Tensor{}, dlogits, xs, at(p, kRouter), mm);
  } else {
    convert_tensor(at(sc, kDLogitsS), dlogits);
    matmul_backward(dxs, at(g, kRouter), Tensor{}, at(sc, kDLogitsS), xs, at(p, kRouter), mm);
  }
  // ---- the shared expert's input side ----
  if (shared()) {
    if (moe_.shared_expert_gate) matmul_backward(dxs, at(g, kSharedExpertGate), Tensor{}, dgl, xs, at(p, kSharedExpertGate), mm);
    const Tensor dsu = at(sc, kDSUp);
    const Tensor dsg = at(s, kSH);  // dead once the down projection's backward has read it
    zero_tensor(dsg);
    zero_tensor(dsu);
    swiglu_backward(dsg, dsu, dsh, at(s, kSG), at(s, kSU));
    matmul_backward(dxs, at(g, kSharedGate), Tensor{}, dsg, xs, at(p, kSharedGate), mm);
    matmul_backward(dxs, at(g, kSharedUp), Tensor{}, dsu, xs, at(p, kSharedUp), mm);
  }
}

}  // namespace dstrain
