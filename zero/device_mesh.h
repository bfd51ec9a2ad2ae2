// The device mesh: how the world's ranks divide into data-, sequence- and tensor-parallel groups,
// and the communicator of each group.
//
// World = DP × SP × TP, ranks laid out tensor-parallel innermost (Megatron-LM's and DeepSpeed's
// order), so the ranks that split one layer's weights — which talk in every layer, twice per pass —
// are neighbours (one node, NVLink), and data parallelism, which talks once per step, spans nodes:
//
//   rank = (dp · SP + sp) · TP + tp        tp ∈ [0, TP), sp ∈ [0, SP), dp ∈ [0, DP)
//
// e.g. TP = 2, SP = 2, DP = 2: ranks 0,1 are one tensor-parallel group, ranks 0,2 one
// sequence-parallel group, ranks 0,4 one data-parallel group, and ranks 0,2,4,6 the group that
// reduces gradients and partitions ZeRO state (DeepSpeed's sequence-data-parallel group: Ulysses
// sequence parallelism replicates the weights over SP, so its ranks reduce gradients like data
// parallel ones).
//
// A pipeline dimension is to come (the pipeline issue) as the outermost one,
// rank = ((pp · DP + dp) · SP + sp) · TP + tp, with a `pp` field in MeshShape and MeshCoord
// (default 1 and 0, so the shapes and coordinates here keep their meaning) and a `pp` group in
// MeshGroups; the data group then becomes "same (pp, tp)". Nothing here implements it yet.
#pragma once

#include <memory>
#include <string>

#include "zero/communicator.h"

namespace dstrain {

struct MeshShape {
  int tp = 1;  // tensor_parallel.autotp_size
  int sp = 1;  // sequence_parallel_size
  int dp = 1;  // world / (tp · sp)
  int world() const { return tp * sp * dp; }
};

// One rank's place in the mesh: 0 <= tp < shape.tp, and so on.
struct MeshCoord {
  int tp = 0;
  int sp = 0;
  int dp = 0;
};

// world / (tp * sp) data-parallel ranks; Error naming tensor_parallel.autotp_size /
// sequence_parallel_size and the world size when they do not divide it or are < 1.
MeshShape make_mesh_shape(int world, int tp, int sp);

// TP innermost, then SP, then DP (the formula above). Error when rank is outside the world or the
// shape has a dimension < 1.
MeshCoord mesh_coord(const MeshShape& shape, int rank);
// The inverse of mesh_coord. Error when a coordinate is outside the shape.
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// One line for the start of a run and check-config, e.g.
// "world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2 (tensor-parallel innermost:
// ranks 0-1 split one layer)"; for tp = sp = 1 simply "world 4 = data-parallel 4". A dimension of 1
// other than data-parallel is left out.
std::string describe_mesh(const MeshShape& shape);

// This rank's communicator of each group it belongs to. Each is ordered by the varying index
// (rank i of `tp` has tp coordinate i; rank i of `data` is dp · SP + sp = i), which is also the
// world ranks' order.
struct MeshGroups {
  MeshShape shape;
  MeshCoord coord;
  std::unique_ptr<Communicator> tp;  // same (dp, sp): the ranks that split each layer's weights
  std::unique_ptr<Communicator> sp;  // same (dp, tp): the ranks that split each sequence
  std::unique_ptr<Communicator> dp;  // same (sp, tp)
  // same tp: the dp x sp ranks that reduce gradients and partition ZeRO state (DeepSpeed's
  // sequence-data-parallel group)
  std::unique_ptr<Communicator> data;
};

// Collective over `world` (world.world_size() == shape.world(), else Error naming both): four
// splits, in this order: tp, sp, dp, data. Every group is made even when it has one rank, so the
// caller never branches on the shape (a group of one sends nothing).
MeshGroups make_mesh_groups(Communicator& world, const MeshShape& shape);

}  // namespace dstrain
