// How gradients are reduced across the data-parallel ranks, as DeepSpeed does it for its four
// top-level keys (docs/zero.md §3.1):
//   gradient_allreduce_op      "mean" averages, "sum" only sums (no division by the world size);
//   prescale_gradients         divide by W before the sum instead of after it;
//   gradient_predivide_factor  p: multiply by 1/p before the sum and by p/W after it;
//   communication_data_type    the dtype the sum runs in (default: the gradients' own dtype).
// DeepSpeed applies them differently on each of its reduction paths, and dstrain follows the path
// that matches the stage and zero_optimization.reduce_scatter (ReductionPath).
#pragma once

#include <optional>

#include "ops/allocator.h"
#include "ops/dtype.h"
#include "ops/tensor.h"
#include "zero/communicator.h"

namespace dstrain {

struct GradientReduction {
  bool average = true;                // gradient_allreduce_op "mean"; false: "sum"
  bool prescale = false;              // prescale_gradients
  double predivide = 1.0;             // gradient_predivide_factor
  std::optional<DType> comm_dtype{};  // communication_data_type; nullopt: the gradients' dtype

  bool is_default() const { return average && !prescale && predivide == 1.0 && !comm_dtype; }
};

// DeepSpeed's reduction paths, each with its own order of scaling:
enum class ReductionPath {
  // Stage 0 (engine.allreduce_bucket) and stages 1-2 with reduce_scatter false
  // (gradient_reduction_w_predivide): mean: ×1/p, sum, ×p/W; prescale: ×1/W, sum; sum: sum.
  all_reduce,
  // Stages 1-2 with reduce_scatter (average_tensor) and stage 3 with reduce_scatter
  // (reduce_scatter_coalesced): mean: ×1/W, sum; sum: sum. (predivide / prescale are refused at
  // stages 2-3 and have no effect at stage 1 on this path.)
  partition_reduce,
  // Stage 3 with reduce_scatter false: mean: ×1/(p·W), sum, ×p; prescale: ×1/W, sum.
  stage3_all_reduce,
};

ReductionPath reduction_path(int stage, bool reduce_scatter);

// The factors DeepSpeed multiplies the gradients by before and after the sum (1 = no pass).
struct ReductionScales {
  double before = 1.0;
  double after = 1.0;
};
ReductionScales reduction_scales(const GradientReduction& g, ReductionPath path, int world);

// Reduces `chunk` (every rank's whole gradients of one bucket) over the ranks of `comm`, in place:
// converted to the communication dtype, ×before, summed (a reduce-scatter when `scatter`, after
// which only shard_of(chunk, rank, W) holds the result; else an all-reduce), ×after, converted
// back. `scratch` holds the communication-dtype copy when it differs from the chunk's dtype.
// The default settings (mean, no prescale, p = 1, the chunk's dtype) are one averaging collective:
// the same sum, divided once in fp32 (docs/zero.md).
void reduce_gradients(Communicator& comm, const Tensor& chunk, bool scatter, const GradientReduction& g, ReductionPath path, Allocator& scratch);

}  // namespace dstrain
