// The device mesh: coordinates against a naive enumeration (dp outermost, then sp, then tp, counting
// ranks up), the round trip for every rank of every shape, the member list of each of the four
// groups (gathered through the group itself) against the members the test enumerates, and the
// errors that name the config keys.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/device_mesh.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::HostBuf;
using ::testing::HasSubstr;

namespace {

struct ShapeCase {
  int tp, sp, dp;
};
const ShapeCase kShapes[] = {{2, 1, 2}, {4, 1, 1}, {1, 2, 2}, {1, 4, 1}, {2, 2, 1}, {2, 2, 2}};

// coords[rank] by counting: the innermost loop is tp.
std::vector<std::array<int, 3>> enumerate(const ShapeCase& s) {
  std::vector<std::array<int, 3>> coords;  // {tp, sp, dp}
  for (int dp = 0; dp < s.dp; ++dp)
    for (int sp = 0; sp < s.sp; ++sp)
      for (int tp = 0; tp < s.tp; ++tp) coords.push_back({tp, sp, dp});
  return coords;
}

enum Group { kTp, kSp, kDp, kData };
const char* group_name(int g) {
  static const char* names[] = {"tp", "sp", "dp", "data"};
  return names[g];
}

// The ranks of rank r's group, ascending: those equal to r in every coordinate the group fixes.
std::vector<int> expected_members(const std::vector<std::array<int, 3>>& coords, int r, int group) {
  const auto& me = coords[static_cast<std::size_t>(r)];
  std::vector<int> m;
  for (int q = 0; q < static_cast<int>(coords.size()); ++q) {
    const auto& c = coords[static_cast<std::size_t>(q)];
    const bool same_tp = c[0] == me[0], same_sp = c[1] == me[1], same_dp = c[2] == me[2];
    const bool member = group == kTp ? same_dp && same_sp : group == kSp ? same_dp && same_tp : group == kDp ? same_sp && same_tp : same_tp;
    if (member) m.push_back(q);
  }
  return m;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(DeviceMesh, CoordinatesRoundTripForEveryRankOfEveryShape) {
  for (const ShapeCase& s : kShapes) {
    const int world = s.tp * s.sp * s.dp;
    SCOPED_TRACE(fmt::format("tp {} sp {} dp {}", s.tp, s.sp, s.dp));
    const MeshShape shape = make_mesh_shape(world, s.tp, s.sp);
    EXPECT_EQ(shape.tp, s.tp);
    EXPECT_EQ(shape.sp, s.sp);
    EXPECT_EQ(shape.dp, s.dp);
    EXPECT_EQ(shape.world(), world);
    const auto coords = enumerate(s);
    for (int r = 0; r < world; ++r) {
      const MeshCoord c = mesh_coord(shape, r);
      EXPECT_EQ(c.tp, coords[static_cast<std::size_t>(r)][0]) << "rank " << r;
      EXPECT_EQ(c.sp, coords[static_cast<std::size_t>(r)][1]) << "rank " << r;
      EXPECT_EQ(c.dp, coords[static_cast<std::size_t>(r)][2]) << "rank " << r;
      EXPECT_EQ(mesh_rank(shape, c), r);
    }
  }
}

// Each rank gathers the world ranks of every group through that group: the list, in the group's
// rank order, must be the enumerated members in ascending order, and the rank's place in it its
// rank in the group.
TEST(DeviceMesh, GroupsHoldExactlyTheEnumeratedMembers) {
  for (const ShapeCase& s : kShapes) {
    const int world = s.tp * s.sp * s.dp;
    SCOPED_TRACE(fmt::format("tp {} sp {} dp {}", s.tp, s.sp, s.dp));
    const MeshShape shape = make_mesh_shape(world, s.tp, s.sp);
    // gathered[rank][group]: the world ranks, in group rank order; place[rank][group]: its rank there.
    std::vector<std::array<std::vector<int>, 4>> gathered(static_cast<std::size_t>(world));
    std::vector<std::array<int, 4>> place(static_cast<std::size_t>(world));
    std::vector<std::array<int, 3>> coord(static_cast<std::size_t>(world));
    run_local_ranks(
        world,
        [&](Communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          MeshGroups g = make_mesh_groups(comm, shape);
          coord[r] = {g.coord.tp, g.coord.sp, g.coord.dp};
          Communicator* groups[] = {g.tp.get(), g.sp.get(), g.dp.get(), g.data.get()};
          for (int k = 0; k < 4; ++k) {
            Communicator& c = *groups[k];
            HostBuf mine(DType::int32, 1), all(DType::int32, c.world_size());
            mine.set(0, comm.rank());
            c.all_gather(mine.tensor(), all.tensor());
            for (int j = 0; j < c.world_size(); ++j) gathered[r][static_cast<std::size_t>(k)].push_back(static_cast<int>(all.get(j)));
            place[r][static_cast<std::size_t>(k)] = c.rank();
          }
        },
        std::chrono::milliseconds(30'000));
    const auto coords = enumerate(s);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(coord[static_cast<std::size_t>(r)], coords[static_cast<std::size_t>(r)]) << "rank " << r;
      for (int k = 0; k < 4; ++k) {
        const std::vector<int> want = expected_members(coords, r, k);
        EXPECT_EQ(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], want) << "rank " << r << " group " << group_name(k);
        EXPECT_EQ(place[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], std::find(want.begin(), want.end(), r) - want.begin())
            << "rank " << r << " group " << group_name(k);
      }
      // Sizes, independently of the lists: tp, sp, dp, dp·sp.
      EXPECT_EQ(gathered[static_cast<std::size_t>(r)][kTp].size(), static_cast<std::size_t>(s.tp));
      EXPECT_EQ(gathered[static_cast<std::size_t>(r)][kSp].size(), static_cast<std::size_t>(s.sp));
      EXPECT_EQ(gathered[static_cast<std::size_t>(r)][kDp].size(), static_cast<std::size_t>(s.dp));
      EXPECT_EQ(gathered[static_cast<std::size_t>(r)][kData].size(), static_cast<std::size_t>(s.dp * s.sp));
    }
  }
}

TEST(DeviceMesh, DescribesTheLayoutInOneLine) {
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 2, 2)),
            "world 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2 (tensor-parallel innermost: ranks 0-1 split one layer)");
  EXPECT_EQ(describe_mesh(make_mesh_shape(4, 1, 1)), "world 4 = data-parallel 4");
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 4, 1)),
            "world 8 = data-parallel 2 x tensor-parallel 4 (tensor-parallel innermost: ranks 0-3 split one layer)");
  EXPECT_EQ(describe_mesh(make_mesh_shape(4, 1, 2)),
            "world 4 = data-parallel 2 x sequence-parallel 2 (sequence-parallel innermost: ranks 0-1 split one sequence)");
}

TEST(DeviceMesh, ShapesThatDoNotFitTheWorldNameTheKeys) {
  std::string m = message_of([] { make_mesh_shape(6, 4, 1); });
  EXPECT_THAT(m, HasSubstr("tensor_parallel.autotp_size 4 does not divide the world size 6"));
  m = message_of([] { make_mesh_shape(8, 2, 3); });
  EXPECT_THAT(m, HasSubstr("sequence_parallel_size 3"));
  EXPECT_THAT(m, HasSubstr("world size 8"));
  m = message_of([] { make_mesh_shape(8, 0, 1); });
  EXPECT_THAT(m, HasSubstr("tensor_parallel.autotp_size is 0"));
  m = message_of([] { make_mesh_shape(8, 1, -2); });
  EXPECT_THAT(m, HasSubstr("sequence_parallel_size is -2"));
  m = message_of([] { make_mesh_shape(0, 1, 1); });
  EXPECT_THAT(m, HasSubstr("0 ranks"));
  m = message_of([] { make_mesh_shape(4, 8, 1); });
  EXPECT_THAT(m, HasSubstr("tensor_parallel.autotp_size 8 does not divide the world size 4"));
}

TEST(DeviceMesh, OutOfRangeRanksCoordinatesAndWorldsAreErrors) {
  const MeshShape shape = make_mesh_shape(8, 2, 2);
  EXPECT_THAT(message_of([&] { mesh_coord(shape, 8); }), HasSubstr("rank 8 is outside the world of 8 ranks"));
  EXPECT_THAT(message_of([&] { mesh_coord(shape, -1); }), HasSubstr("rank -1"));
  EXPECT_THAT(message_of([&] { mesh_rank(shape, MeshCoord{2, 0, 0}); }), HasSubstr("(tp 2, sp 0, dp 0) is outside the mesh"));
  EXPECT_THAT(message_of([&] { mesh_rank(shape, MeshCoord{0, 0, 2}); }), HasSubstr("outside the mesh"));
  // The groups need a communicator of the mesh's size: checked before any collective.
  std::vector<std::string> errors(4);
  run_local_ranks(4, [&](Communicator& comm) {
    errors[static_cast<std::size_t>(comm.rank())] = message_of([&] { (void)make_mesh_groups(comm, shape); });
  });
  for (const std::string& e : errors) EXPECT_THAT(e, HasSubstr("the communicator has 4 ranks but the mesh"));
}
