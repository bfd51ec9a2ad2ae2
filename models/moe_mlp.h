// MoeMlp: the mixture-of-experts feed-forward of a sparse decoder layer (models/moe_config.h has
// the equations), as a part of the layer that owns it (LlamaBlock): its parameters, activations and
// scratch are a range of the layer's lists, its forward and backward work on the N = B·T rows of
// the post-attention norm.
//
// forward (S = storage dtype, M = N·k slots, I = an expert's width, W = the shared expert's):
//   logits = x · gateᵀ                     (N, E)  S, kept in fp32
//   scores, expert, weight = route(logits)  (N, E) fp32, (N, k) int32, (N, k) fp32
//   plan = dispatch(expert)                 slot_assignment, slot_of (M) int32, counts (E) int32
//   xg = x[token of each slot]              (M, C)  the experts' packed input, grouped by expert
//   per expert e over its counts[e] rows:   g = xg·Wg_eᵀ, u = xg·Wu_eᵀ, h = silu(g)·u   (M, I)
//                                           y = h·Wd_eᵀ                                 (M, C)
//   out = Σ_j weight[t, j]·y[slot of (t, j)]  (N, C), + the shared expert (gated by sigmoid(x·w) or not)
// One GEMM per expert over exactly its rows: no capacity padding (dropless) unless a capacity
// factor drops some assignments. The counts go to the host (the GEMMs' sizes); on a GPU that is one
// small copy per layer and direction.
//
// backward: d(y) and d(weight) from the combine, the experts' GEMMs backward per expert, d(x) as
// the sum over each token's slots, the router through d(weight) (plus the load-balancing loss's
// term, models/moe_stats.h), the shared expert.
//
// Expert parallelism (models/expert_parallel.h; EP ranks, each with its own tokens, rank r holding
// the EL = E/EP experts [r·EL, (r+1)·EL)): the routing, the plan, the combine, the shared expert,
// the load-balancing statistics and the per-expert counts are the rank's own, over all E experts,
// exactly as above. Between the gather and the combine:
//   send = x[token of each slot]            (M, C)  scratch; grouped by expert, so the rows for
//                                                   rank j's experts are contiguous
//   recv_counts = exchange_counts(counts, EL)       rows per (source rank, local expert), saved
//   recv = all_to_all_v(send)               (R, C)  scratch; rows arrive [source][local expert]
//   xg = recv permuted to [local expert][source]    (R, C) saved (one block copy per pair)
//   per local expert: g, u, h, y over its rows from every source, as above (g, u, h saved; y in scratch)
//   y permuted back to [source][local expert], all_to_all_v back into the saved y (M, C) slots.
// backward mirrors it: d(y) of the kept slots travels to the experts' ranks, the experts' GEMMs
// backward run there over every source's rows (the local experts' weight gradients), d(xg) travels
// back, then the combine's and router's backward as above. The received counts are saved (EP·EL
// int32), so backward exchanges no counts; it reads them and the local counts back to the host.
//   Sizes: R = the rows one rank's experts may receive: EP·M dropless (every peer may route every
// assignment to this rank's experts); with a capacity, at most E·capacity (each of EP sources
// sends each of the EL local experts at most `capacity` rows), so min(EP·M, E·capacity). The
// saved xg, g, u, h have R rows (the activation memory of the worst case, allocated up front).
//   The expert weights' gradients are scaled by 1/EP (d(y) and d(gate), d(up) are scaled by 1/EP
// just before their weight-gradient GEMMs; the input gradients use the unscaled ones): a rank's
// expert gradient sums its peers' tokens' contributions while the objective is the mean over the
// data-parallel ranks, and the engine averages expert gradients over the DP/EP ranks holding the
// same experts only. With it, EP ranks train exactly as EP = 1 with the same data-parallel size.
//   Capacity (DeepSpeed MoE's semantics, deepspeed/moe/sharded_moe.py: the capacity is computed
// from the gates of the rank's own tokens, before the all-to-all): each rank drops by
// capacity(N) of its own N tokens, per expert; an expert then receives at most EP·capacity rows.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/expert_parallel.h"
#include "models/layer.h"
#include "models/moe_config.h"
#include "models/moe_stats.h"
#include "ops/kernels/moe.h"

namespace dstrain {

class MoeMlp {
 public:
  // prefix: "model.layers.N.mlp."; layer: N (what the report and MoeStats key on); ep: the
  // expert-parallel rank it is built for (Error when the experts do not divide by ep.ranks).
  MoeMlp(const MoeConfig& moe, std::int64_t n_embd, std::int64_t layer, std::string prefix, float init_std, ExpertParallelRank ep = {});

  std::vector<ParamSpec> params() const;
  // How many entries params(), saved_activations() and scratch() hold (the owning layer's slices).
  static std::size_t param_count(const MoeConfig& moe);
  static std::size_t saved_count();
  static std::size_t scratch_count();
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const;

  // out (N, C) = the feed-forward of x (N, C); records into `stats` when given. `group`: the
  // expert-parallel group, required (and checked) when built for more than one rank.
  void forward(const Tensor& out, const Tensor& x, std::span<const Tensor> params, std::span<const Tensor> saved, std::span<const Tensor> scratch,
               MoeStats* stats, ExpertParallelGroup* group = nullptr) const;
  // dx (N, C) WRITTEN, and may be dout's memory; grads accumulate. dloss: d(objective)/d(this micro-batch's mean loss), which
  // the load-balancing loss's gradient carries.
  void backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::span<const Tensor> params, std::span<const Tensor> grads,
                std::span<const Tensor> saved, std::span<const Tensor> scratch, const MoeStats* stats, float dloss,
                ExpertParallelGroup* group = nullptr) const;

  MoeRouting routing() const;
  // The capacity of each expert for N tokens (DeepSpeed: max(min_capacity, ceil(k·N·factor / E))),
  // -1 when dropless (no factor, or drop_tokens false).
  // Under expert parallelism, the rank's own N tokens (DeepSpeed's semantics).
  std::int64_t capacity(std::int64_t N) const;
  // The rows the experts' packed input (and g, u, h) hold for N tokens: N·top_k, or under expert
  // parallelism the most this rank's experts may receive, min(EP·N·k, E·capacity(N)).
  std::int64_t expert_rows(std::int64_t N) const;
  ExpertParallelRank expert_parallel() const { return ep_; }

 private:
  bool shared() const { return moe_.shared_expert_intermediate_size > 0; }
  MoeConfig moe_;
  std::int64_t C_;
  std::int64_t layer_;
  std::string prefix_;
  float init_std_;
  ExpertParallelRank ep_;
};

}  // namespace dstrain
