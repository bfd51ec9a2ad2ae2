// The device mesh: how the world's ranks divide into pipeline stages and, within a stage, into
// data-, sequence- and tensor-parallel groups, and the communicator of each group.
//
// World = PP × DP × SP × TP, ranks laid out tensor-parallel innermost (Megatron-LM's and
// DeepSpeed's order), so the ranks that split one layer's weights — which talk in every layer,
// twice per pass — are neighbours (one node, NVLink), data parallelism, which talks once per step,
// spans nodes, and pipeline stages, which pass one activation per micro-batch between neighbouring
// stages (point-to-point, Communicator::send / recv), are outermost:
//
//   rank = ((pp · DP + dp) · SP + sp) · TP + tp    tp ∈ [0, TP), sp ∈ [0, SP), dp ∈ [0, DP), pp ∈ [0, PP)
//
// e.g. TP = 2, SP = 2, DP = 2: ranks 0,1 are one tensor-parallel group, ranks 0,2 one
// sequence-parallel group, ranks 0,4 one data-parallel group, and ranks 0,2,4,6 the group that
// reduces gradients and partitions ZeRO state (DeepSpeed's sequence-data-parallel group: Ulysses
// sequence parallelism replicates the weights over SP, so its ranks reduce gradients like data
// parallel ones).
//
// With PP > 1 each stage is such a mesh of DP × SP × TP consecutive ranks (stage s: ranks
// s·DP·SP·TP ...), every group above lies within one stage (its ranks share pp), and the pipeline
// group joins the ranks with the same (dp, sp, tp) across the stages: its rank is the stage. PP = 1
// (the default) is the layout above, rank for rank.
#pragma once

#include <memory>
#include <string>

#include "zero/communicator.h"

namespace dstrain {

struct MeshShape {
  int tp = 1;  // tensor_parallel.autotp_size
  int sp = 1;  // sequence_parallel_size
  int dp = 1;  // world / (pp · tp · sp)
  int pp = 1;  // pipeline stages (outermost)
  int world() const { return pp * dp * sp * tp; }
  int stage_size() const { return dp * sp * tp; }  // ranks per pipeline stage
};

// One rank's place in the mesh: 0 <= tp < shape.tp, and so on.
struct MeshCoord {
  int tp = 0;
  int sp = 0;
  int dp = 0;
  int pp = 0;  // the pipeline stage
};

// world / (tp * sp) data-parallel ranks, one pipeline stage; Error naming
// tensor_parallel.autotp_size / sequence_parallel_size and the world size when they do not divide
// it or are < 1.
MeshShape make_mesh_shape(int world, int tp, int sp);
// `pp` pipeline stages of world / pp ranks each, every stage world / (pp * tp * sp) data-parallel
// ranks. Error naming the sizes when pp does not divide the world (or is < 1), or tp and sp do not
// divide a stage's ranks. pp = 1 is make_mesh_shape(world, tp, sp), messages included.
MeshShape make_mesh_shape(int world, int tp, int sp, int pp);

// TP innermost, then SP, then DP, then PP (the formula above). Error when rank is outside the world
// or the shape has a dimension < 1.
MeshCoord mesh_coord(const MeshShape& shape, int rank);
// The inverse of mesh_coord. Error when a coordinate is outside the shape.
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// One line for the start of a run and check-config, e.g.
// "world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2 (tensor-parallel innermost:
// ranks 0-1 split one layer)"; for tp = sp = 1 simply "world 4 = data-parallel 4". A dimension of 1
// other than data-parallel is left out. With pipeline stages it comes first:
// "world 8 = pipeline 2 x data-parallel 2 x tensor-parallel 2 (tensor-parallel innermost: ranks
// 0-1 split one layer; pipeline outermost: ranks 0-3 are stage 0)".
std::string describe_mesh(const MeshShape& shape);

// This rank's communicator of each group it belongs to. Each is ordered by the varying index
// (rank i of `tp` has tp coordinate i; rank i of `data` is dp · SP + sp = i; rank i of `pp` is
// stage i), which is also the world ranks' order.
struct MeshGroups {
  MeshShape shape;
  MeshCoord coord;
  std::unique_ptr<Communicator> tp;  // same (pp, dp, sp): the ranks that split each layer's weights
  std::unique_ptr<Communicator> sp;  // same (pp, dp, tp): the ranks that split each sequence
  std::unique_ptr<Communicator> dp;  // same (pp, sp, tp)
  // same (pp, tp): the dp x sp ranks of a stage that reduce gradients and partition ZeRO state
  // (DeepSpeed's sequence-data-parallel group)
  std::unique_ptr<Communicator> data;
  // same (dp, sp, tp): one pipeline, its rank the stage; activations and gradients pass between
  // neighbouring stages over it (send / recv)
  std::unique_ptr<Communicator> pp;
};

// Collective over `world` (world.world_size() == shape.world(), else Error naming both): five
// splits, in this order: tp, sp, dp, data, pp. Every group is made even when it has one rank, so
// the caller never branches on the shape (a group of one sends nothing).
MeshGroups make_mesh_groups(Communicator& world, const MeshShape& shape);

}  // namespace dstrain
