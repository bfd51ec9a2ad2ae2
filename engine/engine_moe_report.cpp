// A mixture of experts' per-expert report (Engine::take_moe_report, take_data_group_moe_report):
// the counts each rank's MoeStats kept since the last report, summed over the pipeline's stages
// (each holds its own layers') and, for the progress line, over the data group's ranks.
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tensor_parallel.h"

namespace dstrain {

void Engine::sum_moe_report_over_pipeline() {
  Impl& im = *impl_;
  if (im.pp != nullptr && im.moe_pack > 0) {
    // Each stage counted its own layers: the sum over the pipeline group is the whole model's.
    std::vector<double> v = im.moe.report_pack(im.moe_layers, im.moe_experts);
    all_reduce_host(*im.pp, Tensor(v.data(), DType::fp64, Shape{static_cast<std::int64_t>(v.size())}), ReduceOp::sum, im.host_value_staging());
    im.moe.report_unpack(v, im.moe_layers, im.moe_experts);
  }
}

MoeStats::Report Engine::take_moe_report() {
  sum_moe_report_over_pipeline();
  return impl_->moe.take_report();
}

MoeStats::Report Engine::take_data_group_moe_report() {
  Impl& im = *impl_;
  // First the stages' layers (every stage then holds the whole model's), then the data group's ranks.
  sum_moe_report_over_pipeline();
  const MoeConfig* moe = model_.architecture ? model_.architecture->moe_config() : nullptr;
  const bool dense = model_.architecture != nullptr && (moe == nullptr || !moe->active());  // no rank of the group records: nothing to sum
  if (im.world <= 1 || dense) return im.moe.take_report();
  return im.moe.take_report([&](std::span<double> v) {
    im.states->all_reduce_sum(Tensor(v.data(), DType::fp64, Shape{static_cast<std::int64_t>(v.size())}));
  });
}

}  // namespace dstrain
