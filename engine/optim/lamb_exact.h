// Lamb (DeepSpeed FusedLamb, ops/kernels/lamb.h) when parameter tensors are split — across the
// ranks of ZeRO stages 1-3, or across optimizer sub-groups: the trust ratio needs each tensor's
// whole ‖θ‖ and ‖u‖, so pass 1 updates m and v and sums the pieces' squares per tensor (fp64),
// OptimizerPartition::all_reduce_sum adds the other ranks' partial sums, and pass 2 applies
// θ −= step_size · clamp(‖θ‖/‖u‖) · u. The fp32 arithmetic is the kernel's, element for element, so
// a sharded run equals the unsharded one (docs/optimizers_onebit.md §6 says where DeepSpeed's own
// ZeRO partitions would give other ratios). Under tensor parallelism a cut tensor's sums are also
// summed over the tensor-parallel group (engine/optim/tensor_cut.h), a replicated one's are not.
#pragma once

#include <span>

#include "engine/optim/tensor_cut.h"
#include "ops/kernels/lamb.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

// `config.weight_decay` applies to segments with weight_decay true (others: 0). `cuts`: the owned
// tensors' tensor-parallel cuts, by TensorPiece::tensor (empty: none is cut). Collective: every
// rank of the partition (and of its tensor-parallel group) calls it.
void lamb_step_exact(OptimizerPartition& partition, const LambConfig& config, std::span<const TensorCut> cuts = {});

// True when some tensor of this rank's partition is cut into more than one piece (sub-groups, or
// another rank holding the rest).
bool has_split_tensors(OptimizerPartition& partition);

}  // namespace dstrain
