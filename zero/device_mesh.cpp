#include "zero/device_mesh.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

void check_shape(const MeshShape& s, const char* call) {
  DSTRAIN_CHECK(s.tp >= 1 && s.sp >= 1 && s.dp >= 1 && s.pp >= 1,
                "{}: the device mesh pp {} x dp {} x sp {} x tp {} has a dimension below 1. Fix: make the shape with make_mesh_shape", call, s.pp,
                s.dp, s.sp, s.tp);
  DSTRAIN_CHECK(s.ep >= 1 && s.dp % s.ep == 0,
                "{}: the device mesh's expert-parallel size {} does not divide its data-parallel size {}. Fix: make the shape with "
                "make_mesh_shape",
                call, s.ep, s.dp);
}

// "1, 2, 4": the sizes that divide n.
std::string divisors_of(int n) {
  std::string d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d += (d.empty() ? "" : ", ") + std::to_string(i);
  return d;
}

}  // namespace

MeshShape make_mesh_shape(int world, int tp, int sp) { return make_mesh_shape(world, tp, sp, 1); }

MeshShape make_mesh_shape(int world, int tp, int sp, int pp) {
  DSTRAIN_CHECK(world >= 1, "the world has {} ranks; a device mesh needs at least 1", world);
  DSTRAIN_CHECK(pp >= 1,
                "the pipeline has {} stages; it needs at least 1 (1: no pipeline parallelism). Fix: set the number of pipeline stages to a "
                "divisor of the {} ranks",
                pp, world);
  DSTRAIN_CHECK(tp >= 1,
                "tensor_parallel.autotp_size is {}; it must be at least 1 (1: no tensor parallelism). Fix: set it to a divisor of the {} ranks", tp,
                world / std::max(pp, 1));
  DSTRAIN_CHECK(sp >= 1, "sequence_parallel_size is {}; it must be at least 1 (1: no sequence parallelism). Fix: set it to a divisor of the {} ranks",
                sp, world / std::max(pp, 1));
  DSTRAIN_CHECK(world % pp == 0,
                "{} pipeline stages do not divide the world size {}: every stage must hold the same number of ranks. Fix: use a divisor of "
                "{} stages (or run on a multiple of {} ranks)",
                pp, world, world, pp);
  // The ranks tp and sp divide: the world, or with pipeline stages one stage's share of it.
  const int ranks = world / pp;
  const std::string scope = pp == 1 ? fmt::format("the world size {}", world)
                                    : fmt::format("the {} ranks of a pipeline stage (world size {} = {} stages x {})", ranks, world, pp, ranks);
  DSTRAIN_CHECK(ranks % tp == 0,
                "tensor_parallel.autotp_size {} does not divide {}: the ranks must split into whole tensor-parallel "
                "groups. Fix: use a divisor of {} (or run on a multiple of {} ranks{})",
                tp, scope, ranks, tp, pp == 1 ? "" : " per stage");
  DSTRAIN_CHECK((ranks / tp) % sp == 0,
                "sequence_parallel_size {} does not divide the {} ranks left by tensor_parallel.autotp_size {} ({} = {} x {}): "
                "tensor_parallel.autotp_size x sequence_parallel_size = {} must divide {}. Fix: choose the two so that their "
                "product divides {}",
                sp, ranks / tp, tp, pp == 1 ? fmt::format("world size {}", world) : fmt::format("{} ranks per stage", ranks), tp, ranks / tp,
                static_cast<long long>(tp) * sp, pp == 1 ? "the world size" : "a stage's ranks", ranks);
  return MeshShape{tp, sp, ranks / (tp * sp), pp};
}

MeshShape make_mesh_shape(int world, int tp, int sp, int pp, int ep) {
  MeshShape shape = make_mesh_shape(world, tp, sp, pp);
  // The data-parallel size in words: how it follows from the world and the other sizes.
  std::string from = fmt::format("world size {}", world);
  if (pp > 1) from += fmt::format(" / {} pipeline stages", pp);
  if (tp > 1) from += fmt::format(" / tensor_parallel.autotp_size {}", tp);
  if (sp > 1) from += fmt::format(" / sequence_parallel_size {}", sp);
  const std::string dp_text = from == fmt::format("world size {}", world) ? fmt::format("the data-parallel size {} (the world size)", shape.dp)
                                                                          : fmt::format("the data-parallel size {} ({})", shape.dp, from);
  DSTRAIN_CHECK(ep >= 1,
                "expert_parallel.autoep_size is {}; it must be at least 1 (1: every rank holds all experts). Fix: set it to a divisor of {}: "
                "{}",
                ep, dp_text, divisors_of(shape.dp));
  DSTRAIN_CHECK(shape.dp % ep == 0,
                "expert_parallel.autoep_size {} does not divide {}: the expert-parallel groups split the data-parallel ranks into groups "
                "of {} (DeepSpeed's expert and expert-data parallel groups). Fix: set expert_parallel.autoep_size to one of {}, or run on "
                "a world size whose data-parallel size is a multiple of {}",
                ep, dp_text, ep, divisors_of(shape.dp), ep);
  shape.ep = ep;
  return shape;
}

MeshCoord mesh_coord(const MeshShape& shape, int rank) {
  check_shape(shape, "mesh_coord");
  DSTRAIN_CHECK(rank >= 0 && rank < shape.world(), "mesh_coord: rank {} is outside the world of {} ranks ({})", rank, shape.world(),
                describe_mesh(shape));
  MeshCoord c{rank % shape.tp, (rank / shape.tp) % shape.sp, (rank / (shape.tp * shape.sp)) % shape.dp, rank / shape.stage_size()};
  c.ep = c.dp % shape.ep;
  c.edp = c.dp / shape.ep;
  return c;
}

int mesh_rank(const MeshShape& shape, const MeshCoord& c) {
  check_shape(shape, "mesh_rank");
  if (!(c.tp >= 0 && c.tp < shape.tp && c.sp >= 0 && c.sp < shape.sp && c.dp >= 0 && c.dp < shape.dp && c.pp >= 0 && c.pp < shape.pp)) {
    // The pipeline coordinate is named where it means something (a pipeline, or a stage given).
    const bool pipeline = shape.pp > 1 || c.pp != 0;
    fail("mesh_rank: coordinate (tp {}, sp {}, dp {}{}) is outside the mesh tp {} x sp {} x dp {}{}", c.tp, c.sp, c.dp,
         pipeline ? fmt::format(", pp {}", c.pp) : "", shape.tp, shape.sp, shape.dp, pipeline ? fmt::format(" x pp {}", shape.pp) : "");
  }
  return ((c.pp * shape.dp + c.dp) * shape.sp + c.sp) * shape.tp + c.tp;
}

std::string describe_mesh(const MeshShape& s) {
  std::string line = fmt::format("world {} = ", s.world());
  if (s.pp > 1) line += fmt::format("pipeline {} x ", s.pp);
  line += fmt::format("data-parallel {}", s.dp);
  if (s.ep > 1) line += fmt::format(" (expert-parallel {} x expert-data-parallel {})", s.ep, s.edp());
  if (s.sp > 1) line += fmt::format(" x sequence-parallel {}", s.sp);
  if (s.tp > 1) line += fmt::format(" x tensor-parallel {}", s.tp);
  std::string notes;
  if (s.tp > 1) {
    notes = fmt::format("tensor-parallel innermost: ranks 0-{} split one layer", s.tp - 1);
  } else if (s.sp > 1) {
    notes = fmt::format("sequence-parallel innermost: ranks 0-{} split one sequence", s.sp - 1);
  }
  if (s.pp > 1) {
    notes += notes.empty() ? "" : "; ";
    notes += s.stage_size() == 1 ? std::string("pipeline outermost: rank 0 is stage 0")
                                 : fmt::format("pipeline outermost: ranks 0-{} are stage 0", s.stage_size() - 1);
  }
  if (!notes.empty()) line += " (" + notes + ")";
  return line;
}

MeshGroups make_mesh_groups(Communicator& world, const MeshShape& shape) {
  check_shape(shape, "make_mesh_groups");
  DSTRAIN_CHECK(world.world_size() == shape.world(),
                "make_mesh_groups: the communicator has {} ranks but the mesh ({}) has {}. Fix: make the shape with "
                "make_mesh_shape(world.world_size(), ...)",
                world.world_size(), describe_mesh(shape), shape.world());
  MeshGroups g;
  g.shape = shape;
  g.coord = mesh_coord(shape, world.rank());
  const MeshCoord& c = g.coord;
  // color: the coordinates the group shares, numbered densely; key: the one that varies. The
  // groups within a stage have the stage among their shared coordinates (pp = 0 when PP = 1: the
  // colors of a single stage are those of the mesh without pipeline).
  g.tp = world.split((c.pp * shape.dp + c.dp) * shape.sp + c.sp, c.tp);
  g.sp = world.split((c.pp * shape.dp + c.dp) * shape.tp + c.tp, c.sp);
  g.dp = world.split((c.pp * shape.sp + c.sp) * shape.tp + c.tp, c.dp);
  g.data = world.split(c.pp * shape.tp + c.tp, c.dp * shape.sp + c.sp);
  g.pp = world.split((c.dp * shape.sp + c.sp) * shape.tp + c.tp, c.pp);
  // The expert groups last: the splits above are the collectives of a mesh without experts.
  g.ep = world.split(((c.pp * shape.edp() + c.edp) * shape.sp + c.sp) * shape.tp + c.tp, c.ep);
  g.expert_data = world.split((c.pp * shape.tp + c.tp) * shape.ep + c.ep, c.edp * shape.sp + c.sp);
  return g;
}

}  // namespace dstrain
