// The loss of a micro-batch and the scale of its gradient: the whole sequences' mean under
// sequence parallelism, a mixture of experts' load-balancing term, and d(objective)/d(loss) under
// fp16 loss scaling and gradient accumulation.
#include <vector>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/loss_scaler.h"
#include "engine/tensor_parallel.h"

namespace dstrain {

// Mixture of experts: the load-balancing loss of the micro-batch that just ran forward, as its
// weight in the objective times its value (0 without sparse layers or aux loss). Under sequence
// parallelism the statistics are first summed over the group, so that the loss and the layers'
// backward see the whole sequences' (models/moe_stats.h). Under a pipeline the last stage calls it,
// its statistics those of every stage's layers (engine_pipeline.cpp), and the sum runs there once.
float Engine::moe_aux_term() {
  Impl& im = *impl_;
  if (!im.moe.recorded()) return 0.0f;
  if (im.sp != nullptr) {
    std::vector<double> v = im.moe.pack();
    all_reduce_host(*im.sp, Tensor(v.data(), DType::fp64, Shape{static_cast<std::int64_t>(v.size())}), ReduceOp::sum, im.host_value_staging());
    im.moe.unpack(v);
  }
  im.last_aux_loss = im.moe.aux_loss();
  if (im.moe.reporting()) im.moe.report_aux(im.last_aux_loss);  // a training micro-batch's, for the report
  return static_cast<float>(im.moe.aux_weight() * im.last_aux_loss);
}

// Sequence parallelism: the head returned the mean of this rank's positions; the whole sequences'
// mean is the sum of the ranks' sums over the group's count. Without it: `loss`.
float Engine::whole_sequence_loss(float loss) {
  Impl& im = *impl_;
  if (im.sp == nullptr) return loss;
  double v = static_cast<double>(loss) * static_cast<double>(im.sp_local_targets);
  all_reduce_host(*im.sp, Tensor(&v, DType::fp64, Shape{1}), ReduceOp::sum, im.host_value_staging());
  return im.batch.target_count > 0 ? static_cast<float>(v / static_cast<double>(im.batch.target_count)) : 0.0f;
}

// d(objective)/d(mean loss of the micro-batch): fp16 multiplies the loss by the loss scale
// (docs/precision.md §6) so small gradients survive in fp16; fp32 / bf16 keep exactly 1/GAS.
float Engine::micro_batch_dloss() const {
  const Impl& im = *impl_;
  // Sequence parallelism: each rank's head differentiates its share of the sum over the whole
  // sequences' count, and the data group averages over its DP x SP ranks — SP times too many.
  const double sp = im.sp != nullptr ? static_cast<double>(im.sp->world_size()) : 1.0;
  return im.scaler.kind() == LossScalerKind::unscaled ? static_cast<float>(sp / static_cast<double>(gas_))
                                                      : static_cast<float>(im.scaler.scale() * sp / static_cast<double>(gas_));
}

}  // namespace dstrain
