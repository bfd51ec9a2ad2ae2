// The device mesh: how the world's ranks divide into pipeline stages and, within a stage, into
// data-, sequence- and tensor-parallel groups, the data-parallel ranks into expert-parallel and
// expert-data-parallel groups, and the communicator of each group.
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
//
// Expert parallelism (expert_parallel.autoep_size = EP, which divides DP) splits the data-parallel
// coordinate, as DeepSpeed's groups._create_expert_and_data_parallel does (E + D order:
// expert-parallel groups are consecutive data-parallel ranks, expert-data-parallel groups strided):
//
//   ep = dp % EP    edp = dp / EP    (dp = edp · EP + ep; EDP = DP / EP)
//
// The EP ranks with the same (pp, sp, tp, edp) hold different experts of each MoE layer and
// exchange tokens (all_to_all_v); the EDP × SP ranks with the same (pp, tp, ep) hold the same
// experts and reduce and ZeRO-partition their gradients. e.g. world 8, TP = 2, DP = 4, EP = 2:
// ranks 0,2 are one expert-parallel group (dp 0 and 1), ranks 0,4 one expert-data-parallel group
// (dp 0 and 2), ranks 0,2,4,6 the data-parallel group. EP = 1 (the default) leaves every other
// group as above: the expert-parallel group is the rank alone, the expert-data group the data group.
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
  int ep = 1;  // expert_parallel.autoep_size: divides dp
  int world() const { return pp * dp * sp * tp; }
  int stage_size() const { return dp * sp * tp; }  // ranks per pipeline stage
  int edp() const { return dp / ep; }              // expert-data-parallel size: the replicas of one expert slice per (sp, tp)
};

// One rank's place in the mesh: 0 <= tp < shape.tp, and so on.
struct MeshCoord {
  int tp = 0;
  int sp = 0;
  int dp = 0;
  int pp = 0;  // the pipeline stage
  int ep = 0;   // dp % shape.ep: which slice of each MoE layer's experts the rank holds
  int edp = 0;  // dp / shape.ep: which replica of that slice
};

// world / (tp * sp) data-parallel ranks, one pipeline stage; Error naming
// tensor_parallel.autotp_size / sequence_parallel_size and the world size when they do not divide
// it or are < 1.
MeshShape make_mesh_shape(int world, int tp, int sp);
// `pp` pipeline stages of world / pp ranks each, every stage world / (pp * tp * sp) data-parallel
// ranks. Error naming the sizes when pp does not divide the world (or is < 1), or tp and sp do not
// divide a stage's ranks. pp = 1 is make_mesh_shape(world, tp, sp), messages included.
MeshShape make_mesh_shape(int world, int tp, int sp, int pp);
// As above, with `ep` expert-parallel ranks splitting the data-parallel ranks (ep = 1: the shape
// above). Error naming expert_parallel.autoep_size, the data-parallel size and the sizes that
// divide it when ep does not divide the data-parallel size or is < 1.
MeshShape make_mesh_shape(int world, int tp, int sp, int pp, int ep);

// TP innermost, then SP, then DP, then PP (the formula above); ep and edp from dp. Error when rank
// is outside the world or the shape has a dimension < 1 (or an ep that does not divide dp).
MeshCoord mesh_coord(const MeshShape& shape, int rank);
// The inverse of mesh_coord. Error when a coordinate is outside the shape. The rank follows from
// (tp, sp, dp, pp); coord.ep and coord.edp, derived from dp, are not read.
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// One line for the start of a run and check-config, e.g.
// "world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2 (tensor-parallel innermost:
// ranks 0-1 split one layer)"; for tp = sp = 1 simply "world 4 = data-parallel 4". A dimension of 1
// other than data-parallel is left out. With pipeline stages it comes first:
// "world 8 = pipeline 2 x data-parallel 2 x tensor-parallel 2 (tensor-parallel innermost: ranks
// 0-1 split one layer; pipeline outermost: ranks 0-3 are stage 0)". With expert parallelism the
// data-parallel part says its split: "world 8 = data-parallel 4 (expert-parallel 2 x
// expert-data-parallel 2) x tensor-parallel 2 (...)"; with ep = 1 the text is the one above.
std::string describe_mesh(const MeshShape& shape);

// This rank's communicator of each group it belongs to. Each is ordered by the varying index
// (rank i of `tp` has tp coordinate i; rank i of `data` is dp · SP + sp = i; rank i of `pp` is
// stage i; rank i of `ep` has ep coordinate i; rank i of `expert_data` is edp · SP + sp = i), which
// is also the world ranks' order.
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
  // same (pp, sp, tp, edp): the EP ranks whose experts differ (they exchange tokens,
  // all_to_all_v); rank = ep coordinate. The rank alone when EP = 1.
  std::unique_ptr<Communicator> ep;
  // same (pp, tp, ep): the edp x sp ranks that reduce and ZeRO-partition one expert slice's
  // gradients; rank = edp · SP + sp. The data group's members when EP = 1.
  std::unique_ptr<Communicator> expert_data;
};

// Collective over `world` (world.world_size() == shape.world(), else Error naming both): seven
// splits, in this order: tp, sp, dp, data, pp, ep, expert_data (the expert groups last, so the
// other groups' collective sequences are those of a mesh without experts). Every group is made even when it has one rank, so
// the caller never branches on the shape (a group of one sends nothing).
MeshGroups make_mesh_groups(Communicator& world, const MeshShape& shape);

}  // namespace dstrain
