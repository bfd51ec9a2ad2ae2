#include "models/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "models/layer_args.h"
#include "models/row_tiles.h"
#include "ops/error.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/moe.h"
#include "ops/kernels/swiglu.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

enum Param { kRouter, kExpGate, kExpUp, kExpDown, kSharedGate, kSharedUp, kSharedDown, kSharedExpertGate };
enum Saved { kLogits, kScores, kExpert, kWeight, kSlotAssign, kSlotOf, kCounts, kXg, kG, kU, kH, kY, kSG, kSU, kSH, kSY, kSLogit, kEpCounts, kNumSaved };
enum Scratch {
  kLogitsS, kDLogits, kDLogitsS, kDWeight, kDY, kDH, kDUp, kDXg, kMm, kAux, kAssigned, kProbSum, kDSY, kDSH, kDSUp, kDSLogit, kEpSend, kEpRecv, kNumScratch
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

// The rows of an expert-parallel exchange: what this rank sends each rank (its slots of the rank's
// experts) and receives from each (every source's rows for the local experts).
struct EpPlan {
  int W = 1;
  std::int64_t EL = 0;                     // local experts
  std::vector<std::int64_t> recv;          // W·EL rows: [source][local expert]
  std::vector<std::int64_t> send_elems;    // W: elements (rows·C) to each rank
  std::vector<std::int64_t> recv_elems;    // W: elements from each rank
  std::vector<std::int64_t> expert_rows;   // EL: each local expert's rows from every source
  std::int64_t rows = 0;                   // Σ recv
};

EpPlan ep_plan(std::span<const std::int32_t> counts, std::vector<std::int64_t> recv, int W, std::int64_t C, const std::string& who) {
  EpPlan p;
  p.W = W;
  p.EL = static_cast<std::int64_t>(counts.size()) / W;
  if (static_cast<std::int64_t>(recv.size()) != W * p.EL)
    fail("{}: the expert-parallel count exchange gave {} values, expected {} ({} ranks x {} local experts)", who, recv.size(), W * p.EL, W, p.EL);
  p.recv = std::move(recv);
  p.send_elems.assign(static_cast<std::size_t>(W), 0);
  p.recv_elems.assign(static_cast<std::size_t>(W), 0);
  p.expert_rows.assign(static_cast<std::size_t>(p.EL), 0);
  for (int j = 0; j < W; ++j)
    for (std::int64_t l = 0; l < p.EL; ++l) {
      const std::size_t i = static_cast<std::size_t>(j * p.EL + l);
      const std::int64_t got = p.recv[i];
      if (got < 0) fail("{}: expert-parallel rank {} sends {} rows to local expert {}", who, j, got, l);
      p.send_elems[static_cast<std::size_t>(j)] += static_cast<std::int64_t>(counts[i]) * C;
      p.recv_elems[static_cast<std::size_t>(j)] += got * C;
      p.expert_rows[static_cast<std::size_t>(l)] += got;
      p.rows += got;
    }
  return p;
}

// The received rows between their arrival order [source][local expert] and the experts' order
// [local expert][source], both packed: one block copy per (source, expert) pair.
void permute_rows(const Tensor& dst, const Tensor& src, const EpPlan& p, std::int64_t C, bool to_expert_major) {
  const std::size_t n = p.recv.size();
  std::vector<std::int64_t> source_major(n), expert_major(n);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    source_major[i] = at;
    at += p.recv[i];
  }
  at = 0;
  for (std::int64_t l = 0; l < p.EL; ++l)
    for (int j = 0; j < p.W; ++j) {
      const std::size_t i = static_cast<std::size_t>(j * p.EL + l);
      expert_major[i] = at;
      at += p.recv[i];
    }
  for (std::size_t i = 0; i < n; ++i) {
    if (p.recv[i] == 0) continue;
    const std::int64_t from = to_expert_major ? source_major[i] : expert_major[i];
    const std::int64_t to = to_expert_major ? expert_major[i] : source_major[i];
    copy_rows(dst, to * C, C, src, from * C, C, p.recv[i], C);
  }
}

}  // namespace

MoeMlp::MoeMlp(const MoeConfig& moe, std::int64_t n_embd, std::int64_t layer, std::string prefix, float init_std, ExpertParallelRank ep)
    : moe_(moe), C_(n_embd), layer_(layer), prefix_(std::move(prefix)), init_std_(init_std), ep_(ep) {
  if (ep_.ranks < 1 || ep_.rank < 0 || ep_.rank >= ep_.ranks)
    fail("{}: expert-parallel rank {} of {} does not exist", prefix_, ep_.rank, ep_.ranks);
  check_expert_split(moe_.num_experts, ep_.ranks, "num_experts");
}

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
  if (!moe_.drops()) return -1;  // dropless, or drop_tokens false: DeepSpeed's capacity is then the largest count
  const double c = std::ceil(static_cast<double>(moe_.top_k * N) * moe_.capacity_factor / static_cast<double>(moe_.num_experts));
  return std::max<std::int64_t>(moe_.min_capacity, static_cast<std::int64_t>(c));
}

std::int64_t MoeMlp::expert_rows(std::int64_t N) const {
  const std::int64_t M = N * moe_.top_k;
  if (!ep_.active()) return M;
  const std::int64_t dropless = ep_.ranks * M, cap = capacity(N);
  return cap < 0 ? dropless : std::min(dropless, moe_.num_experts * cap);
}

std::vector<ParamSpec> MoeMlp::params() const {
  const std::int64_t E = moe_.num_experts, I = moe_.expert_intermediate_size, C = C_, W = moe_.shared_expert_intermediate_size;
  const ParamInit n = ParamInit::normal(init_std_);
  std::vector<ParamSpec> v;
  v.push_back({prefix_ + "gate.weight", Shape{E, C}, n, true, {}});
  // The experts, stacked: expert parallelism hands each rank whole experts (ParamSplit::experts),
  // E/EP of them, as a piece of the whole stack.
  v.push_back(expert_piece_spec({prefix_ + "experts.gate_proj.weight", Shape{E, I, C}, n, true, {}, ParamSplit::experts()}, ep_));
  v.push_back(expert_piece_spec({prefix_ + "experts.up_proj.weight", Shape{E, I, C}, n, true, {}, ParamSplit::experts()}, ep_));
  v.push_back(expert_piece_spec({prefix_ + "experts.down_proj.weight", Shape{E, C, I}, n, true, {}, ParamSplit::experts()}, ep_));
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
  const std::int64_t R = expert_rows(N), EP = ep_.active() ? E : 0;  // the experts' rows; EP·EL received counts
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
      {"moe_xg", Shape{R, C}, S},
      {"moe_gate", Shape{R, I}, S},
      {"moe_up", Shape{R, I}, S},
      {"moe_h", Shape{R, I}, S},
      {"moe_y", Shape{M, C}, S},
      {"shared_gate", Shape{NS, W}, S},
      {"shared_up", Shape{NS, W}, S},
      {"shared_h", Shape{NS, W}, S},
      {"shared_y", Shape{NS, C}, S},
      {"shared_gate_logit", Shape{shared() && moe_.shared_expert_gate ? N : 0, 1}, S},
      {"moe_ep_recv_counts", Shape{EP}, I32},
  };
}

std::vector<ActivationSpec> MoeMlp::scratch(const LayerDims& d) const {
  const std::int64_t N = d.B * d.T, E = moe_.num_experts, k = moe_.top_k, M = N * k, I = moe_.expert_intermediate_size, C = C_;
  const std::int64_t R = expert_rows(N), ep = ep_.active() ? 1 : 0;
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
      {"moe_dh", Shape{R, I}, S},
      {"moe_dup", Shape{R, I}, S},
      {"moe_dxg", Shape{R, C}, S},  // expert parallelism: also the experts' y (forward), their d(y) (backward)
      {"moe_matmul", Shape{static_cast<std::int64_t>(matmul_scratch_elems(S, widest))}, F},
      {"moe_aux_grad", Shape{E}, F},
      {"moe_assigned", Shape{E}, DType::fp64},
      {"moe_prob_sum", Shape{E}, DType::fp64},
      {"shared_dy", Shape{shared() && moe_.shared_expert_gate ? N : 0, C}, S},
      {"shared_dh", Shape{NS, W}, S},
      {"shared_dup", Shape{NS, W}, S},
      {"shared_dgate_logit", Shape{shared() && moe_.shared_expert_gate ? N : 0, 1}, S},
      {"moe_ep_send", Shape{ep * M, C}, S},  // this rank's slots: x to send, then d(xg) received back
      {"moe_ep_recv", Shape{ep * R, C}, S},  // the rows as they arrive, [source][local expert]
  };
}

void MoeMlp::forward(const Tensor& out, const Tensor& x, std::span<const Tensor> p, std::span<const Tensor> s, std::span<const Tensor> sc,
                     MoeStats* stats, ExpertParallelGroup* group) const {
  layer_args::expect_count(prefix_, "saved", s, kNumSaved);
  layer_args::expect_count(prefix_, "scratch", sc, kNumScratch);
  const std::int64_t C = C_, N = x.numel() / C, E = moe_.num_experts, k = moe_.top_k, I = moe_.expert_intermediate_size;
  const Tensor xs = flat2(x, N, C), o = flat2(out, N, C);
  const Tensor mm = at(sc, kMm);
  ExpertParallelGroup* ep = ep_.active() ? &expert_layer_group(group, ep_, prefix_) : nullptr;
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
  // (expert parallelism: the local experts over the rows every rank sent them, y into scratch)
  const auto run_experts = [&](std::span<const std::int64_t> rows, const Tensor& y) {
    std::int64_t r0 = 0;
    for (std::size_t e = 0; e < rows.size(); ++e) {
      const std::int64_t n = rows[e];
      if (n > 0) {
        const std::int64_t b = static_cast<std::int64_t>(e);
        const Tensor xe = row_range(at(s, kXg), r0, n, C), g = row_range(at(s, kG), r0, n, I), u = row_range(at(s, kU), r0, n, I),
                     h = row_range(at(s, kH), r0, n, I);
        matmul_forward(g, xe, block(at(p, kExpGate), b), Tensor{}, mm);
        matmul_forward(u, xe, block(at(p, kExpUp), b), Tensor{}, mm);
        swiglu_forward(h, g, u);
        matmul_forward(row_range(y, r0, n, C), h, block(at(p, kExpDown), b), Tensor{}, mm);
      }
      r0 += n;
    }
  };
  if (ep == nullptr) {
    moe_gather_rows(at(s, kXg), xs, at(s, kSlotAssign), k, kept);
    const std::vector<std::int64_t> rows(counts.begin(), counts.end());
    run_experts(rows, at(s, kY));
  } else {
    const Tensor send = at(sc, kEpSend), recv = at(sc, kEpRecv), ye = at(sc, kDXg);
    moe_gather_rows(send, xs, at(s, kSlotAssign), k, kept);
    const std::vector<std::int64_t> sent(counts.begin(), counts.end());
    std::vector<std::int64_t> got = ep->exchange_counts(sent, E / ep_.ranks);
    const EpPlan plan = ep_plan(counts, std::move(got), ep_.ranks, C, prefix_);
    if (plan.rows > expert_rows(N))
      fail("{}: expert-parallel rank {} receives {} rows for its experts, more than the {} its buffers hold for {} tokens (do the ranks run the "
           "same model and micro-batch size?)",
           prefix_, ep_.rank, plan.rows, expert_rows(N), N);
    std::vector<std::int32_t> got32(plan.recv.begin(), plan.recv.end());
    copy_tensor(at(s, kEpCounts), Tensor(got32.data(), DType::int32, Shape{E}));
    ep->all_to_all_v(send, plan.send_elems, recv, plan.recv_elems);
    permute_rows(at(s, kXg), recv, plan, C, true);
    run_experts(plan.expert_rows, ye);
    permute_rows(recv, ye, plan, C, false);
    ep->all_to_all_v(recv, plan.recv_elems, at(s, kY), plan.send_elems);
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
                      std::span<const Tensor> s, std::span<const Tensor> sc, const MoeStats* stats, float dloss, ExpertParallelGroup* group) const {
  layer_args::expect_count(prefix_, "saved", s, kNumSaved);
  layer_args::expect_count(prefix_, "scratch", sc, kNumScratch);
  const std::int64_t C = C_, N = x.numel() / C, E = moe_.num_experts, k = moe_.top_k, I = moe_.expert_intermediate_size;
  const Tensor xs = flat2(x, N, C), dxs = flat2(dx, N, C), douts = flat2(dout, N, C);
  const Tensor mm = at(sc, kMm);
  ExpertParallelGroup* ep = ep_.active() ? &expert_layer_group(group, ep_, prefix_) : nullptr;
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
  Tensor dxg = at(sc, kDXg);  // d(xg) of this rank's slots
  if (ep == nullptr) {
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
  } else {
    // d(y) of the kept slots to the experts' ranks, in the forward's plan (its counts saved).
    const std::vector<std::int32_t> got32 = host_counts(at(s, kEpCounts));
    const EpPlan plan = ep_plan(counts, std::vector<std::int64_t>(got32.begin(), got32.end()), ep_.ranks, C, prefix_);
    const Tensor send = at(sc, kEpSend), recv = at(sc, kEpRecv), dye = at(sc, kDXg);
    ep->all_to_all_v(at(sc, kDY), plan.send_elems, recv, plan.recv_elems);
    permute_rows(dye, recv, plan, C, true);
    // The local experts over every source's rows. The weight gradients are formed from d(y),
    // d(gate) and d(up) scaled by 1/EP (models/expert_parallel.h), the input gradients from the
    // unscaled ones; d(xg) of an expert's rows takes their d(y)'s memory once it is consumed.
    const float inv = 1.0f / static_cast<float>(ep_.ranks);
    std::int64_t r0 = 0;
    for (std::int64_t l = 0; l < plan.EL; ++l) {
      const std::int64_t n = plan.expert_rows[static_cast<std::size_t>(l)];
      if (n > 0) {
        const Tensor xe = row_range(at(s, kXg), r0, n, C), ge = row_range(at(s, kG), r0, n, I), ue = row_range(at(s, kU), r0, n, I),
                     he = row_range(at(s, kH), r0, n, I);
        const Tensor dh = row_range(at(sc, kDH), r0, n, I), dup = row_range(at(sc, kDUp), r0, n, I), dy = row_range(dye, r0, n, C);
        zero_tensor(dh);
        matmul_backward(dh, Tensor{}, Tensor{}, dy, he, block(at(p, kExpDown), l), mm);
        scale_grads(dy, inv);
        matmul_backward(Tensor{}, block(at(g, kExpDown), l), Tensor{}, dy, he, block(at(p, kExpDown), l), mm);
        const Tensor dgate = he;  // h is dead once down_proj's backward has read it
        zero_tensor(dgate);
        zero_tensor(dup);
        swiglu_backward(dgate, dup, dh, ge, ue);
        const Tensor dxe = dy;
        zero_tensor(dxe);
        matmul_backward(dxe, Tensor{}, Tensor{}, dgate, xe, block(at(p, kExpGate), l), mm);
        matmul_backward(dxe, Tensor{}, Tensor{}, dup, xe, block(at(p, kExpUp), l), mm);
        scale_grads(dgate, inv);
        scale_grads(dup, inv);
        matmul_backward(Tensor{}, block(at(g, kExpGate), l), Tensor{}, dgate, xe, block(at(p, kExpGate), l), mm);
        matmul_backward(Tensor{}, block(at(g, kExpUp), l), Tensor{}, dup, xe, block(at(p, kExpUp), l), mm);
      }
      r0 += n;
    }
    // d(xg) back to the slots' ranks
    permute_rows(recv, dye, plan, C, false);
    ep->all_to_all_v(recv, plan.recv_elems, send, plan.send_elems);
    dxg = send;
  }
  // d(x): the sum of each token's slots (the gather's gradient)
  zero_tensor(dxs);
  moe_combine(dxs, dxg, at(s, kSlotOf), Tensor{}, k);
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
