// Megatron's sequence parallelism in the norm and dropout regions (Korthikanti et al., 2022,
// "Reducing Activation Recomputation in Large Transformer Models"; docs/parallelism.md §2.3), as
// a layer sees it.
//
// Under tensor parallelism the LayerNorms / RMSNorms, the residual adds and the residual dropouts
// sit between the tensor-parallel regions and are replicated: every rank computes and keeps the
// same (B, T, C) activations. Megatron cuts them along the tokens instead: each rank keeps its
// 1/TP of the residual stream, and the region boundaries change collective —
//
//   entering a region (before the column-parallel QKV, MLP up, LM head):  all-gather   (g)
//   leaving it (after the row-parallel attention output, MLP down):        reduce-scatter (ḡ)
//
// in place of the one all-reduce at the exit (an all-reduce is a reduce-scatter then an
// all-gather: the forward's bytes are the same). Backward mirrors it: the gradient entering a
// row-parallel GEMM is all-gathered, the column-parallel GEMMs' partial input gradients are
// reduce-scattered. As Megatron, the gathered norm output is not kept: backward gathers it again
// (one more all-gather per region) so that only the rank's rows are saved.
//
// The cut: rank r holds rows [r·n, (r+1)·n) of the micro-batch's B·T tokens flattened, n = B·T/TP
// (Megatron cuts the outermost sequence dimension of its (s, b, h) layout; dstrain's (B, T, C) is
// cut where it is contiguous, so the collectives need no packing). Norms, dropouts and residual
// adds are token-wise and run on any rows; positions (GPT-2's wpe, RoPE) are applied inside the
// regions, on whole tensors. The residual stream's shape is TensorParallelRank::residual_shape.
//
// Replicated parameters used in the cut region (the norms' weights and biases) get each rank's
// share of their gradient; the layer sums them over the group (ReplicatedGradSum below) so that,
// as without the cut, every rank leaves backward with the same gradient.
#pragma once

#include <utility>
#include <vector>

#include "models/tensor_parallel.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/tensor.h"

namespace dstrain {

struct ResidualShards {
  TensorParallelGroup* group = nullptr;  // the layer's tensor-parallel group; null without tensor parallelism
  bool sharded = false;                  // the residual stream is cut (TensorParallelRank::shards_residual)

  // The tensor a region's whole input or output lives in: `scratch` viewed as `whole_shape` when
  // the stream is cut, `local` itself otherwise (then whole and local are one tensor).
  Tensor whole(const Tensor& scratch, const Tensor& local, const Shape& whole_shape) const {
    return sharded ? Tensor(scratch.data, local.dtype, whole_shape, scratch.device) : local;
  }
  // Entering a region: whole <- every rank's local rows (nothing when not cut).
  void gather(const Tensor& local, const Tensor& whole) const {
    if (sharded) group->all_gather(local, whole);
  }
  // Leaving a region: local <- this rank's rows of the sum over the group of each rank's partial
  // whole; when not cut, the sum in place (local is whole); without a group, nothing.
  void reduce(const Tensor& whole, const Tensor& local) const {
    if (sharded) {
      group->reduce_scatter(whole, local);
    } else if (group != nullptr) {
      group->sum(local);
    }
  }
};

// The gradients of replicated parameters that a layer forms from its rank's rows of a cut
// residual stream (the norms' weights): formed into `partial` (one scratch tensor holding them all
// back to back), summed over the group, then added to the accumulated gradients. Not cut: the
// layer forms them into the gradients directly (grad() returns them).
class ReplicatedGradSum {
 public:
  // grads: the accumulated gradients in order; partial: scratch of their summed sizes in their
  // dtype (empty when not cut).
  ReplicatedGradSum(const ResidualShards& shards, std::vector<Tensor> grads, const Tensor& partial) : shards_(shards), grads_(std::move(grads)) {
    if (!shards_.sharded || grads_.empty()) return;
    const DType dtype = grads_[0].dtype;
    std::int64_t total = 0;
    for (const Tensor& g : grads_) {
      DSTRAIN_CHECK(g.dtype == dtype, "ReplicatedGradSum: the gradients are of different dtypes");
      parts_.emplace_back(static_cast<char*>(partial.data) + static_cast<std::size_t>(total) * dtype_size(dtype), dtype, g.shape, partial.device);
      total += g.numel();
    }
    DSTRAIN_CHECK(partial.nbytes() >= static_cast<std::size_t>(total) * dtype_size(dtype), "ReplicatedGradSum: the scratch is too small");
    partial_ = Tensor(partial.data, dtype, Shape{total}, partial.device);
    zero_tensor(partial_);
  }
  // Where the layer forms gradient i.
  Tensor grad(std::size_t i) const { return shards_.sharded ? parts_[i] : grads_[i]; }
  // After the last one is formed: the sums over the group, added to the gradients.
  void finish() {
    if (!shards_.sharded || grads_.empty()) return;
    shards_.group->sum(partial_);
    for (std::size_t i = 0; i < grads_.size(); ++i) residual_forward(grads_[i], grads_[i], parts_[i]);
  }

 private:
  ResidualShards shards_;
  std::vector<Tensor> grads_;
  std::vector<Tensor> parts_;
  Tensor partial_;
};

}  // namespace dstrain
