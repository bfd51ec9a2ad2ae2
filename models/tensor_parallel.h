// Tensor parallelism as a model sees it (docs/parallelism.md): a family builds the layers of one
// tensor-parallel rank — each cut parameter reduced to the rank's piece (its ParamSpec::split,
// models/param_split.h) — and those layers call the collectives of their group through
// TensorParallelGroup, which the engine provides over the device mesh's tensor-parallel
// communicator. Models sit below the communicators (docs/design.md), so they name only what they
// call: an in-place sum and max over the group, and the all-gather and reduce-scatter of Megatron's
// sequence parallelism (models/residual_shards.h).
//
// Megatron's split of a transformer block (Shoeybi et al., 2019): the column-parallel GEMMs (QKV,
// MLP up/gate) need nothing in forward, the row-parallel ones (attention output, MLP down) are
// summed over the group (one all-reduce each), and in backward the input gradients of the
// column-parallel GEMMs are summed (one each): 2 + 2 all-reduces of B·T·C per block. A parameter
// that is replicated but whose gradient is computed from a rank's own heads (Qwen3's q/k norm
// weights) is summed by the layer in backward, so every replicated parameter leaves backward with
// the same gradient on every rank of the group. A norm over a cut dimension (OLMoE's q/k norm over
// the whole q and k projections) sums its per-token statistics over the group with `sum`, in
// forward and in backward, and its weight is cut with the columns it scales.
#pragma once

#include <string>

#include "models/layer.h"
#include "ops/tensor.h"

namespace dstrain {

// Which tensor-parallel rank the layers are built for.
struct TensorParallelRank {
  int rank = 0;
  int ranks = 1;
  // Megatron's sequence parallelism in the norm and dropout regions (models/residual_shards.h):
  // between the tensor-parallel regions each rank holds 1/ranks of the residual stream's tokens.
  bool shard_residual = false;
  bool active() const { return ranks > 1; }
  // Whether the residual stream of a micro-batch of B·T tokens is cut across the ranks: asked for,
  // and the tokens divide evenly (otherwise it stays whole and the regions end in an all-reduce).
  bool shards_residual(std::int64_t tokens) const { return active() && shard_residual && tokens % ranks == 0; }
  // The residual stream's shape for a (B, T) micro-batch of width C: (B, T, C) whole, or this
  // rank's (1, B·T/ranks, C) rows of the flattened tokens when cut.
  Shape residual_shape(std::int64_t B, std::int64_t T, std::int64_t C) const {
    return shards_residual(B * T) ? Shape{1, B * T / ranks, C} : Shape{B, T, C};
  }
};

// The collectives of a tensor-parallel group. Every rank of the group calls them in the same order
// with the same sizes (the layers do, as they run the same code on the same batch).
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank's `buf` becomes the element-wise sum over the group (fp32 accumulation;
  // fp32, fp16 or bf16).
  virtual void sum(Tensor buf) = 0;
  // In place: the element-wise maximum over the group (fp32).
  virtual void max(Tensor buf) = 0;
  // whole (size()·n elements) <- every rank's local (n), rank r's at [r·n, (r+1)·n).
  virtual void all_gather(Tensor local, Tensor whole) = 0;
  // local (n) <- elements [rank()·n, (rank()+1)·n) of the sum over the group of whole (size()·n).
  virtual void reduce_scatter(Tensor whole, Tensor local) = 0;
};

// `whole` as rank tp.rank's piece: the shape piece_shape gives, ParamSpec::piece set. A replicated
// spec, or tp.ranks == 1, comes back unchanged.
ParamSpec piece_spec(ParamSpec whole, TensorParallelRank tp);

// The group a layer built for `tp` was handed, checked: an Error naming the layer when it is
// missing or does not match the build (a driver that forgot ForwardArgs::tensor_parallel).
TensorParallelGroup& layer_group(TensorParallelGroup* group, TensorParallelRank tp, const std::string& layer);

}  // namespace dstrain
