// ModelStates' communication groups (zero/model_states.h): those ZeRO++ and MiCS split off the
// data-parallel group (docs/zero.md §10), their traffic summed for the step's report, and the list
// every wait and drain orders compute after.
#include <algorithm>

#include "ops/error.h"
#include "zero/model_states_units.h"

namespace dstrain {

ZeroppGroupSizes zeropp_group_sizes(std::int64_t data_ranks, std::int64_t mics_shard_size, std::int64_t hpz_partition_size) {
  ZeroppGroupSizes g;
  if (mics_shard_size > 0 && data_ranks % mics_shard_size != 0) {
    fail("zero_optimization.mics_shard_size {}: the {} data-parallel ranks do not split into shard groups of {} ranks; use a divisor of {}",
         mics_shard_size, data_ranks, mics_shard_size, data_ranks);
  }
  g.shard = static_cast<int>(mics_shard_size > 0 ? mics_shard_size : data_ranks);
  // DeepSpeed's _create_zero_param_parallel_group takes min(zero_hpz_partition_size, world size).
  g.hpz = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(hpz_partition_size, g.shard)));
  if (g.shard % g.hpz != 0) {
    fail("zero_optimization.zero_hpz_partition_size {}: the {} ranks that partition the parameters do not split into groups of {}; use a divisor "
         "of {} (the ranks of one node)",
         hpz_partition_size, g.shard, g.hpz, g.shard);
  }
  return g;
}

// ZeRO++ and MiCS (docs/zero.md §10): the groups they split off the data-parallel group, every
// rank in the same order. MiCS's shard group (consecutive ranks) becomes the group the primary
// units partition over, its replica group (the same index in every shard group) the one the
// partition's gradients are averaged over; hpZ's groups are consecutive ranks of the partition
// group; qgZ and the hierarchical gather split the partition group by node.
void ModelStates::make_zeropp_groups() {
  partition_comm_ = comm_;
  const bool any = s_.quantized_weights || s_.hpz_partition_size > 1 || s_.quantized_gradients || s_.mics_shard_size > 0;
  if (!any) return;
  if (s_.stage != 3) fail("ModelStates: ZeRO++ and MiCS partition parameters: they need ZeRO stage 3, the stage is {}", s_.stage);
  if (expert_comm_ != nullptr) fail("ModelStates: ZeRO++ and MiCS do not apply to the expert-parallel units of a mixture of experts");
  if (comm_ == nullptr || world_ == 1) return;  // one rank: nothing is gathered or reduced
  const int r = comm_->rank();
  const ZeroppGroupSizes sizes = zeropp_group_sizes(world_, s_.mics_shard_size, s_.hpz_partition_size);
  if (sizes.shard < world_) {
    mics_shard_ = comm_->split(r / sizes.shard, r);
    mics_replica_ = comm_->split(r % sizes.shard, r);
    partition_comm_ = mics_shard_.get();
  }
  Communicator& p = *partition_comm_;
  if (sizes.hpz > 1) hpz_ = p.split(p.rank() / sizes.hpz, p.rank());
  const bool hierarchical = s_.mics_shard_size > 0 && s_.mics_hierarchical_gather;
  if (hierarchical || (s_.quantized_gradients && p.node_count() > 1)) {
    nodes_ = std::make_unique<NodeSplit>(
        split_by_node(p, hierarchical ? "zero_optimization.mics_hierarchical_params_gather" : "zero_optimization.zero_quantized_gradients"));
    if (hierarchical && nodes_->nodes == 1) {
      fail("zero_optimization.mics_hierarchical_params_gather: the shard group of {} ranks lies on one node, so there is no hierarchy to gather "
           "through (DeepSpeed asserts \"sharding spans on single node, no need for hierarchy allgather\"). Fix: set it false, or shard over "
           "ranks of several nodes (mics_shard_size, --ranks-per-node)",
           p.world_size());
    }
  }
}

CommStats ModelStates::group_stats() const {
  CommStats sum;
  for (const Communicator* c : {mics_shard_.get(), mics_replica_.get(), hpz_.get(), nodes_ ? nodes_->local.get() : nullptr,
                                nodes_ ? nodes_->cross.get() : nullptr}) {
    if (c == nullptr) continue;
    sum += c->stats();
  }
  return sum;
}

std::vector<Communicator*> ModelStates::groups() const {
  std::vector<Communicator*> out;
  for (Communicator* c : {comm_, partition_comm_, expert_comm_, mics_replica_.get(), hpz_.get(), nodes_ ? nodes_->local.get() : nullptr,
                          nodes_ ? nodes_->cross.get() : nullptr})
    if (c != nullptr && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  return out;
}

}  // namespace dstrain
