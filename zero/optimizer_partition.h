// OptimizerPartition: what an optimizer sees of a rank's training state during its step — the
// rank's partition, one sub-group at a time (docs/training_state.md §4).
//
//   partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
//     for (const OptimizerSegment& s : segments) update(s.master, s.grads, s.states[0], ...);
//   });
//
// Segments are contiguous runs of one layer's elements inside one sub-group with one weight-decay
// setting. Whole-tensor quantities (Lamb's trust ratio) come from the segments' tensor pieces:
// sum per tensor over the sub-groups, all_reduce_sum() across the ranks (and, for a tensor that
// tensor parallelism cuts, tensor_parallel_sum() across its group), then visit again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ops/tensor.h"

namespace dstrain {

// Where a segment's elements sit inside one parameter tensor.
struct TensorPiece {
  std::int32_t tensor = 0;  // the parameter's index among the model's owned parameters (layer order)
  std::int64_t offset = 0;  // first element, counted from the segment's start
  std::int64_t numel = 0;
  std::int64_t tensor_offset = 0;  // the same first element, counted from the tensor's start
  std::int64_t tensor_numel = 0;   // the whole tensor's element count (== numel when the rank holds all of it)
};

// One run of the rank's partition: `master` (fp32, updated in place), its gradient (`grads`: fp32,
// or the storage dtype), the optimizer's states in its declared order (fp32), and `params_lowp`:
// the copy the layers read that the update rewrites in the same pass (fp16 / bf16; empty when the
// master is itself the parameter). Elements outside every piece are alignment padding.
struct OptimizerSegment {
  Tensor params, grads;
  std::vector<Tensor> states;
  bool weight_decay = true;  // false: biases, norm weights (ParamSpec::weight_decay)
  Tensor params_lowp{};
  std::vector<TensorPiece> pieces{};
  // Where the first element sits in the model: layer index and offset in that layer's flat buffer
  // (the same for any ZeRO split) — numbers stochastic rounding's random bits.
  std::uint32_t layer = 0;
  std::int64_t layer_offset = 0;
};

class OptimizerPartition {
 public:
  virtual ~OptimizerPartition() = default;
  // Calls fn once per sub-group, in order, with the sub-group's segments (views valid during the
  // call); the values fn writes reach the partition's home. May be called more than once per step.
  virtual void for_each_subgroup(const std::function<void(std::span<const OptimizerSegment>)>& fn) = 0;
  // Sums `values` over the ranks that split the partition (in place; fp64); one rank: unchanged.
  // Every rank must call it the same number of times with the same count.
  virtual void all_reduce_sum(std::span<double> values) = 0;
  // The same for fp32 values: for gathers, where each element has one non-zero term, so the sum is
  // exact (Muon's whole matrices) at half the bytes of fp64. The default goes through fp64.
  virtual void all_reduce_sum(std::span<float> values) {
    std::vector<double> wide(values.begin(), values.end());
    all_reduce_sum(std::span<double>(wide));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(wide[i]);
  }
  // The number of owned parameter tensors (TensorPiece::tensor is below it).
  virtual std::int32_t tensor_count() const = 0;

  // Tensor parallelism (docs/parallelism.md §2): a tensor the layers hold as a tensor-parallel piece
  // (ParamSpec::piece) has its other pieces on the other ranks of this group, which hold the same
  // tensors in the same order (each its own piece; a replicated tensor whole, the same values).
  // The per-tensor optimizers (Lamb, Muon, Adafactor) add the group's partial sums of a cut tensor
  // to the data-parallel ones (all_reduce_sum) and gather Muon's whole matrices over it. The
  // default is one rank: no tensor parallelism, the sum is the identity and the gather a copy.
  virtual int tensor_parallel_size() const { return 1; }
  virtual int tensor_parallel_rank() const { return 0; }
  // Sums `values` over the tensor-parallel group (in place, fp64). Every rank of the group calls it
  // the same number of times with the same count.
  virtual void tensor_parallel_sum(std::span<double> values) { (void)values; }
  // All-gather over the tensor-parallel group: `recv` (size · n) gets rank r's `send` (n) at r · n.
  virtual void tensor_parallel_all_gather(std::span<const float> send, std::span<float> recv) {
    std::copy(send.begin(), send.end(), recv.begin());
  }
};

}  // namespace dstrain
