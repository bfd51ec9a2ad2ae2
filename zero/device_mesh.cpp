#include "zero/device_mesh.h"

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

void check_shape(const MeshShape& s, const char* call) {
  DSTRAIN_CHECK(s.tp >= 1 && s.sp >= 1 && s.dp >= 1,
                "{}: the device mesh tp {} x sp {} x dp {} has a dimension below 1. Fix: make the shape with make_mesh_shape", call, s.tp, s.sp,
                s.dp);
}

}  // namespace

MeshShape make_mesh_shape(int world, int tp, int sp) {
  DSTRAIN_CHECK(world >= 1, "the world has {} ranks; a device mesh needs at least 1", world);
  DSTRAIN_CHECK(tp >= 1,
                "tensor_parallel.autotp_size is {}; it must be at least 1 (1: no tensor parallelism). Fix: set it to a divisor of the {} ranks", tp,
                world);
  DSTRAIN_CHECK(sp >= 1, "sequence_parallel_size is {}; it must be at least 1 (1: no sequence parallelism). Fix: set it to a divisor of the {} ranks",
                sp, world);
  DSTRAIN_CHECK(world % tp == 0,
                "tensor_parallel.autotp_size {} does not divide the world size {}: the ranks must split into whole tensor-parallel "
                "groups. Fix: use a divisor of {} (or run on a multiple of {} ranks)",
                tp, world, world, tp);
  DSTRAIN_CHECK((world / tp) % sp == 0,
                "sequence_parallel_size {} does not divide the {} ranks left by tensor_parallel.autotp_size {} (world size {} = {} x {}): "
                "tensor_parallel.autotp_size x sequence_parallel_size = {} must divide the world size. Fix: choose the two so that their "
                "product divides {}",
                sp, world / tp, tp, world, tp, world / tp, static_cast<long long>(tp) * sp, world);
  return MeshShape{tp, sp, world / (tp * sp)};
}

MeshCoord mesh_coord(const MeshShape& shape, int rank) {
  check_shape(shape, "mesh_coord");
  DSTRAIN_CHECK(rank >= 0 && rank < shape.world(), "mesh_coord: rank {} is outside the world of {} ranks ({})", rank, shape.world(),
                describe_mesh(shape));
  return MeshCoord{rank % shape.tp, (rank / shape.tp) % shape.sp, rank / (shape.tp * shape.sp)};
}

int mesh_rank(const MeshShape& shape, const MeshCoord& c) {
  check_shape(shape, "mesh_rank");
  DSTRAIN_CHECK(c.tp >= 0 && c.tp < shape.tp && c.sp >= 0 && c.sp < shape.sp && c.dp >= 0 && c.dp < shape.dp,
                "mesh_rank: coordinate (tp {}, sp {}, dp {}) is outside the mesh tp {} x sp {} x dp {}", c.tp, c.sp, c.dp, shape.tp, shape.sp,
                shape.dp);
  return (c.dp * shape.sp + c.sp) * shape.tp + c.tp;
}

std::string describe_mesh(const MeshShape& s) {
  std::string line = fmt::format("world {} = data-parallel {}", s.world(), s.dp);
  if (s.sp > 1) line += fmt::format(" x sequence-parallel {}", s.sp);
  if (s.tp > 1) line += fmt::format(" x tensor-parallel {}", s.tp);
  if (s.tp > 1) {
    line += fmt::format(" (tensor-parallel innermost: ranks 0-{} split one layer)", s.tp - 1);
  } else if (s.sp > 1) {
    line += fmt::format(" (sequence-parallel innermost: ranks 0-{} split one sequence)", s.sp - 1);
  }
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
  // color: the coordinates the group shares, numbered densely; key: the one that varies.
  g.tp = world.split(c.dp * shape.sp + c.sp, c.tp);
  g.sp = world.split(c.dp * shape.tp + c.tp, c.sp);
  g.dp = world.split(c.sp * shape.tp + c.tp, c.dp);
  g.data = world.split(c.tp, c.dp * shape.sp + c.sp);
  return g;
}

}  // namespace dstrain
