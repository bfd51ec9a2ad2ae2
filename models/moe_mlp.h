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
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/layer.h"
#include "models/moe_config.h"
#include "models/moe_stats.h"
#include "ops/kernels/moe.h"

namespace dstrain {

class MoeMlp {
 public:
  // prefix: "model.layers.N.mlp."; layer: N (what the report and MoeStats key on).
  MoeMlp(const MoeConfig& moe, std::int64_t n_embd, std::int64_t layer, std::string prefix, float init_std);

  std::vector<ParamSpec> params() const;
  // How many entries params(), saved_activations() and scratch() hold (the owning layer's slices).
  static std::size_t param_count(const MoeConfig& moe);
  static std::size_t saved_count();
  static std::size_t scratch_count();
  std::vector<ActivationSpec> saved_activations(const LayerDims& d) const;
  std::vector<ActivationSpec> scratch(const LayerDims& d) const;

  // out (N, C) = the feed-forward of x (N, C); records into `stats` when given.
  void forward(const Tensor& out, const Tensor& x, std::span<const Tensor> params, std::span<const Tensor> saved, std::span<const Tensor> scratch,
               MoeStats* stats) const;
  // dx (N, C) WRITTEN, and may be dout's memory; grads accumulate. dloss: d(objective)/d(this micro-batch's mean loss), which
  // the load-balancing loss's gradient carries.
  void backward(const Tensor& dx, const Tensor& dout, const Tensor& x, std::span<const Tensor> params, std::span<const Tensor> grads,
                std::span<const Tensor> saved, std::span<const Tensor> scratch, const MoeStats* stats, float dloss) const;

  MoeRouting routing() const;
  // The capacity of each expert for N tokens (DeepSpeed: max(min_capacity, ceil(k·N·factor / E))),
  // -1 when dropless.
  std::int64_t capacity(std::int64_t N) const;

 private:
  bool shared() const { return moe_.shared_expert_intermediate_size > 0; }
  MoeConfig moe_;
  std::int64_t C_;
  std::int64_t layer_;
  std::string prefix_;
  float init_std_;
};

}  // namespace dstrain
