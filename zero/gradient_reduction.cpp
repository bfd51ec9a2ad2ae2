#include "zero/gradient_reduction.h"

#include "ops/buffer.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {

ReductionPath reduction_path(int stage, bool reduce_scatter) {
  if (stage == 0) return ReductionPath::all_reduce;
  if (reduce_scatter) return ReductionPath::partition_reduce;
  return stage == 3 ? ReductionPath::stage3_all_reduce : ReductionPath::all_reduce;
}

ReductionScales reduction_scales(const GradientReduction& g, ReductionPath path, int world) {
  const double w = world;
  const double p = g.predivide;
  ReductionScales s;
  if (!g.average) return s;  // "sum": the plain sum on every path
  switch (path) {
    case ReductionPath::all_reduce:
      if (g.prescale) {
        s.before = 1.0 / w;
      } else {
        // DeepSpeed skips each multiplication when its factor is exactly 1 (p == 1, p == W).
        if (p != 1.0) s.before = 1.0 / p;
        if (p != w) s.after = p / w;
      }
      break;
    case ReductionPath::partition_reduce:
      s.before = 1.0 / w;
      break;
    case ReductionPath::stage3_all_reduce:
      s.before = (!g.prescale && p != 1.0 ? 1.0 / p : 1.0) / w;
      if (!g.prescale && p != w) s.after = p;
      break;
  }
  return s;
}

void reduce_gradients(Communicator& comm, const Tensor& chunk, bool scatter, const GradientReduction& g, ReductionPath path, Allocator& scratch) {
  const int r = comm.rank();
  const int w = comm.world_size();
  if (g.is_default()) {
    if (scatter) {
      comm.reduce_scatter(chunk, shard_of(chunk, r, w), ReduceOp::avg);
    } else {
      comm.all_reduce(chunk, ReduceOp::avg);
    }
    return;
  }
  const ReductionScales sc = reduction_scales(g, path, w);
  const DType cd = g.comm_dtype.value_or(chunk.dtype);
  Buffer converted;
  Tensor buf = chunk;
  if (cd != chunk.dtype) {
    converted = Buffer(scratch, static_cast<std::size_t>(chunk.numel()) * dtype_size(cd), MemoryPurpose::buffers);
    buf = converted.tensor(cd, Shape{chunk.numel()});
    convert_tensor(buf, chunk);
  }
  if (sc.before != 1.0) scale_grads(buf, static_cast<float>(sc.before));
  if (scatter) {
    comm.reduce_scatter(buf, shard_of(buf, r, w), ReduceOp::sum);
  } else {
    comm.all_reduce(buf, ReduceOp::sum);
  }
  const Tensor result = scatter ? shard_of(buf, r, w) : buf;
  if (sc.after == 1.0 && cd == chunk.dtype) return;
  comm.order_compute_after_collectives();  // the passes below read what the collective wrote
  if (sc.after != 1.0) scale_grads(result, static_cast<float>(sc.after));
  if (cd != chunk.dtype) convert_tensor(scatter ? shard_of(chunk, r, w) : chunk, result);
}

}  // namespace dstrain
