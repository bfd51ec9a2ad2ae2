// The device mesh: coordinates against a naive enumeration (dp outermost, then sp, then tp, counting
// ranks up), the round trip for every rank of every shape, the member list of each of the four
// groups (gathered through the group itself) against the members the test enumerates, and the
// errors that name the config keys. With pipeline stages: every (pp, dp, sp, tp) of two shapes of 8
// ranks against the formula written out, the five groups' members and ranks, send/recv between
// the stages of the pipeline group, and the errors naming the stage count. With expert parallelism:
// ep and edp of every rank, the seven groups of seven shapes against the members written out from
// (pp, edp, ep, sp, tp), three shapes by hand, ep = 1, and the errors naming autoep_size.
#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <memory>
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
          // One stage: the pipeline group of every rank is the rank alone.
          EXPECT_EQ(g.coord.pp, 0);
          EXPECT_EQ(g.pp->world_size(), 1);
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

// ---- pipeline stages (pp, outermost) ----

namespace {

struct PipelineCase {
  int pp, dp, sp, tp;
};
// world 8 = 2 x 2 x 1 x 2 and 2 x 1 x 2 x 2 (pp x dp x sp x tp)
const PipelineCase kPipelineShapes[] = {{2, 2, 1, 2}, {2, 1, 2, 2}};

// rank = ((pp·DP + dp)·SP + sp)·TP + tp, written out.
int pipeline_rank(const PipelineCase& s, int pp, int dp, int sp, int tp) { return ((pp * s.dp + dp) * s.sp + sp) * s.tp + tp; }

}  // namespace

TEST(DeviceMesh, PipelineStagesAreTheOutermostDimension) {
  for (const PipelineCase& s : kPipelineShapes) {
    SCOPED_TRACE(fmt::format("pp {} dp {} sp {} tp {}", s.pp, s.dp, s.sp, s.tp));
    const MeshShape shape = make_mesh_shape(8, s.tp, s.sp, s.pp);
    EXPECT_EQ(shape.pp, s.pp);
    EXPECT_EQ(shape.dp, s.dp);
    EXPECT_EQ(shape.sp, s.sp);
    EXPECT_EQ(shape.tp, s.tp);
    EXPECT_EQ(shape.world(), 8);
    EXPECT_EQ(shape.stage_size(), 4);
    int seen = 0;
    for (int pp = 0; pp < s.pp; ++pp)
      for (int dp = 0; dp < s.dp; ++dp)
        for (int sp = 0; sp < s.sp; ++sp)
          for (int tp = 0; tp < s.tp; ++tp) {
            const int r = pipeline_rank(s, pp, dp, sp, tp);
            const MeshCoord c = mesh_coord(shape, r);
            EXPECT_EQ(c.pp, pp) << "rank " << r;
            EXPECT_EQ(c.dp, dp) << "rank " << r;
            EXPECT_EQ(c.sp, sp) << "rank " << r;
            EXPECT_EQ(c.tp, tp) << "rank " << r;
            EXPECT_EQ(mesh_rank(shape, MeshCoord{tp, sp, dp, pp}), r);
            ++seen;
          }
    EXPECT_EQ(seen, 8);
  }
  // Stage 0 is ranks 0-3, stage 1 ranks 4-7, whatever the layout within a stage.
  EXPECT_EQ(mesh_coord(make_mesh_shape(8, 2, 1, 2), 3).pp, 0);
  EXPECT_EQ(mesh_coord(make_mesh_shape(8, 2, 1, 2), 4).pp, 1);
  // pp = 1 is the mesh without pipeline, rank for rank (make_mesh_shape's 3-argument form).
  for (const ShapeCase& s : kShapes) {
    const int world = s.tp * s.sp * s.dp;
    const MeshShape three = make_mesh_shape(world, s.tp, s.sp), four = make_mesh_shape(world, s.tp, s.sp, 1);
    EXPECT_EQ(three.pp, 1);
    EXPECT_EQ(four.dp, three.dp);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(mesh_coord(four, r).pp, 0);
      EXPECT_EQ(mesh_coord(four, r).dp, mesh_coord(three, r).dp);
      EXPECT_EQ(mesh_rank(four, mesh_coord(three, r)), r);
    }
  }
}

// Each rank gathers the world ranks of its five groups through the groups themselves; they must
// be the ranks the formula gives when the group's own coordinate varies (data: dp and sp vary,
// dp-major; pp: the stage varies), in that order, with the rank's place there its group rank.
TEST(DeviceMesh, PipelineGroupsHoldTheMembersTheFormulaGives) {
  for (const PipelineCase& s : kPipelineShapes) {
    SCOPED_TRACE(fmt::format("pp {} dp {} sp {} tp {}", s.pp, s.dp, s.sp, s.tp));
    const MeshShape shape = make_mesh_shape(8, s.tp, s.sp, s.pp);
    constexpr int kGroups = 5;  // tp, sp, dp, data, pp
    std::vector<std::array<std::vector<int>, kGroups>> gathered(8);
    std::vector<std::array<int, kGroups>> place(8);
    run_local_ranks(
        8,
        [&](Communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          MeshGroups g = make_mesh_groups(comm, shape);
          Communicator* groups[] = {g.tp.get(), g.sp.get(), g.dp.get(), g.data.get(), g.pp.get()};
          for (int k = 0; k < kGroups; ++k) {
            Communicator& c = *groups[k];
            HostBuf mine(DType::int32, 1), all(DType::int32, c.world_size());
            mine.set(0, comm.rank());
            c.all_gather(mine.tensor(), all.tensor());
            for (int j = 0; j < c.world_size(); ++j) gathered[r][static_cast<std::size_t>(k)].push_back(static_cast<int>(all.get(j)));
            place[r][static_cast<std::size_t>(k)] = c.rank();
          }
        },
        std::chrono::milliseconds(30'000));
    for (int pp = 0; pp < s.pp; ++pp)
      for (int dp = 0; dp < s.dp; ++dp)
        for (int sp = 0; sp < s.sp; ++sp)
          for (int tp = 0; tp < s.tp; ++tp) {
            const int r = pipeline_rank(s, pp, dp, sp, tp);
            std::array<std::vector<int>, kGroups> want;
            for (int t = 0; t < s.tp; ++t) want[0].push_back(pipeline_rank(s, pp, dp, sp, t));
            for (int q = 0; q < s.sp; ++q) want[1].push_back(pipeline_rank(s, pp, dp, q, tp));
            for (int d = 0; d < s.dp; ++d) want[2].push_back(pipeline_rank(s, pp, d, sp, tp));
            for (int d = 0; d < s.dp; ++d)
              for (int q = 0; q < s.sp; ++q) want[3].push_back(pipeline_rank(s, pp, d, q, tp));
            for (int p = 0; p < s.pp; ++p) want[4].push_back(pipeline_rank(s, p, dp, sp, tp));
            const int want_place[kGroups] = {tp, sp, dp, dp * s.sp + sp, pp};
            for (int k = 0; k < kGroups; ++k) {
              EXPECT_EQ(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], want[static_cast<std::size_t>(k)])
                  << "rank " << r << " group " << k;
              EXPECT_EQ(place[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], want_place[k]) << "rank " << r << " group " << k;
            }
          }
  }
}

// The pipeline group of world 4 = 2 stages x 2 data-parallel ranks: each stage-0 rank sends an
// activation to its stage-1 partner and gets a gradient back, over the group's own ranks (the
// stage), while the data-parallel group of each stage all-reduces; the bytes are the pipeline
// group's, not the data group's.
TEST(DeviceMesh, StagesExchangeOverThePipelineGroup) {
  const MeshShape shape = make_mesh_shape(4, 1, 1, 2);
  EXPECT_EQ(shape.dp, 2);
  constexpr std::int64_t n = 9;
  std::vector<std::vector<double>> got(4);
  std::vector<std::uint64_t> pipe_bytes(4), data_bytes(4);
  run_local_ranks(4, [&](Communicator& comm) {
    MeshGroups g = make_mesh_groups(comm, shape);
    const int r = comm.rank();
    HostBuf out(DType::fp32, n), in(DType::fp32, n);
    for (std::int64_t i = 0; i < n; ++i) out.set(i, r * 100 + i);
    const CommStats data_before = g.data->stats();
    if (g.coord.pp == 0) {
      g.pp->send(out.tensor(), 1);  // activation forward
      g.pp->recv(in.tensor(), 1);   // gradient back
    } else {
      g.pp->recv(in.tensor(), 0);
      g.pp->send(out.tensor(), 0);
    }
    HostBuf sum(DType::fp32, 1);
    sum.set(0, 1.0);
    g.data->all_reduce(sum.tensor(), ReduceOp::sum);
    EXPECT_EQ(sum.get(0), 2.0);
    for (std::int64_t i = 0; i < n; ++i) got[static_cast<std::size_t>(r)].push_back(in.get(i));
    pipe_bytes[static_cast<std::size_t>(r)] = g.pp->stats().total_bytes_sent();
    data_bytes[static_cast<std::size_t>(r)] = (g.data->stats() - data_before).bytes_sent(CollectiveKind::send);
  });
  for (int r = 0; r < 4; ++r) {
    const int partner = (r + 2) % 4;  // same dp, the other stage
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], partner * 100 + i) << r;
    EXPECT_EQ(pipe_bytes[static_cast<std::size_t>(r)], static_cast<std::uint64_t>(n) * 4);
    EXPECT_EQ(data_bytes[static_cast<std::size_t>(r)], 0u);
  }
}

TEST(DeviceMesh, PipelineIsNamedFirstAndItsErrorsNameTheSizes) {
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 2, 1, 2)),
            "world 8 = pipeline 2 x data-parallel 2 x tensor-parallel 2 (tensor-parallel innermost: ranks 0-1 split one layer; pipeline "
            "outermost: ranks 0-3 are stage 0)");
  EXPECT_EQ(describe_mesh(make_mesh_shape(4, 1, 1, 4)), "world 4 = pipeline 4 x data-parallel 1 (pipeline outermost: rank 0 is stage 0)");
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 1, 2, 2)),
            "world 8 = pipeline 2 x data-parallel 2 x sequence-parallel 2 (sequence-parallel innermost: ranks 0-1 split one sequence; "
            "pipeline outermost: ranks 0-3 are stage 0)");
  std::string m = message_of([] { make_mesh_shape(8, 1, 1, 3); });
  EXPECT_THAT(m, HasSubstr("3 pipeline stages do not divide the world size 8"));
  EXPECT_THAT(m, HasSubstr("Fix:"));
  m = message_of([] { make_mesh_shape(8, 1, 1, 0); });
  EXPECT_THAT(m, HasSubstr("the pipeline has 0 stages"));
  m = message_of([] { make_mesh_shape(12, 4, 1, 2); });
  EXPECT_THAT(m, HasSubstr("tensor_parallel.autotp_size 4 does not divide the 6 ranks of a pipeline stage (world size 12 = 2 stages x 6)"));
  m = message_of([] { make_mesh_shape(8, 2, 4, 2); });
  EXPECT_THAT(m, HasSubstr("sequence_parallel_size 4 does not divide the 2 ranks left by tensor_parallel.autotp_size 2 (4 ranks per stage"));
  const MeshShape shape = make_mesh_shape(8, 2, 1, 2);
  m = message_of([&] { mesh_rank(shape, MeshCoord{0, 0, 0, 2}); });
  EXPECT_THAT(m, HasSubstr("(tp 0, sp 0, dp 0, pp 2) is outside the mesh tp 2 x sp 1 x dp 2 x pp 2"));
  EXPECT_THAT(message_of([&] { mesh_coord(shape, 8); }), HasSubstr("rank 8 is outside the world of 8 ranks (world 8 = pipeline 2"));
}

// ---- expert parallelism (ep, edp: the data-parallel coordinate split) ----

namespace {

struct ExpertCase {
  int pp, dp, sp, tp, ep;
};
// world 8 tp 2 ep 2; world 8 pp 2 ep 2; world 4 sp 2 ep 2; world 8 ep 4; world 16 pp 2 sp 2 ep 2
// (dp 2 per stage, tp 2); world 8 sp 2 ep 2 (dp 4); world 8 tp 2 (ep 1: the expert groups trivial).
const ExpertCase kExpertShapes[] = {{1, 4, 1, 2, 2}, {2, 4, 1, 1, 2}, {1, 2, 2, 1, 2}, {1, 8, 1, 1, 4},
                                    {2, 2, 2, 2, 2}, {1, 4, 2, 1, 2}, {1, 4, 1, 2, 1}};

int world_of(const ExpertCase& s) { return s.pp * s.dp * s.sp * s.tp; }

// The rank of (pp, edp, ep, sp, tp), written out: dp = edp·EP + ep (expert-parallel groups are
// consecutive data-parallel ranks, DeepSpeed's E + D order).
int expert_rank(const ExpertCase& s, int pp, int edp, int ep, int sp, int tp) {
  const int dp = edp * s.ep + ep;
  return ((pp * s.dp + dp) * s.sp + sp) * s.tp + tp;
}

}  // namespace

TEST(DeviceMesh, ExpertParallelSplitsTheDataParallelCoordinate) {
  for (const ExpertCase& s : kExpertShapes) {
    SCOPED_TRACE(fmt::format("pp {} dp {} sp {} tp {} ep {}", s.pp, s.dp, s.sp, s.tp, s.ep));
    const MeshShape shape = make_mesh_shape(world_of(s), s.tp, s.sp, s.pp, s.ep);
    EXPECT_EQ(shape.ep, s.ep);
    EXPECT_EQ(shape.dp, s.dp);
    EXPECT_EQ(shape.edp(), s.dp / s.ep);
    EXPECT_EQ(shape.world(), world_of(s));
    int visited = 0;
    for (int pp = 0; pp < s.pp; ++pp)
      for (int edp = 0; edp < s.dp / s.ep; ++edp)
        for (int ep = 0; ep < s.ep; ++ep)
          for (int sp = 0; sp < s.sp; ++sp)
            for (int tp = 0; tp < s.tp; ++tp) {
              const int r = expert_rank(s, pp, edp, ep, sp, tp);
              const MeshCoord c = mesh_coord(shape, r);
              EXPECT_EQ(c.ep, ep) << "rank " << r;
              EXPECT_EQ(c.edp, edp) << "rank " << r;
              EXPECT_EQ(c.dp, edp * s.ep + ep) << "rank " << r;
              EXPECT_EQ(c.tp, tp) << "rank " << r;
              EXPECT_EQ(c.sp, sp) << "rank " << r;
              EXPECT_EQ(c.pp, pp) << "rank " << r;
              EXPECT_EQ(mesh_rank(shape, c), r);
              ++visited;
            }
    EXPECT_EQ(visited, world_of(s));
  }
  // The existing overloads make ep = 1: every rank's ep is 0 and its edp its dp.
  const MeshShape plain = make_mesh_shape(8, 2, 1, 1);
  EXPECT_EQ(plain.ep, 1);
  EXPECT_EQ(plain.edp(), 4);
  EXPECT_EQ(mesh_coord(plain, 6).ep, 0);
  EXPECT_EQ(mesh_coord(plain, 6).edp, 3);
}

// All seven groups of every expert shape, gathered through the groups, against the members the
// test writes out from (pp, edp, ep, sp, tp); each rank's place in ep is its ep coordinate and in
// expert_data edp·SP + sp.
TEST(DeviceMesh, ExpertGroupsHoldTheEnumeratedMembers) {
  for (const ExpertCase& s : kExpertShapes) {
    SCOPED_TRACE(fmt::format("pp {} dp {} sp {} tp {} ep {}", s.pp, s.dp, s.sp, s.tp, s.ep));
    const int world = world_of(s);
    const MeshShape shape = make_mesh_shape(world, s.tp, s.sp, s.pp, s.ep);
    constexpr int kGroups = 7;  // tp, sp, dp, data, pp, ep, expert_data
    std::vector<std::array<std::vector<int>, kGroups>> gathered(static_cast<std::size_t>(world));
    std::vector<std::array<int, kGroups>> place(static_cast<std::size_t>(world));
    run_local_ranks(
        world,
        [&](Communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          MeshGroups g = make_mesh_groups(comm, shape);
          Communicator* groups[] = {g.tp.get(), g.sp.get(), g.dp.get(), g.data.get(), g.pp.get(), g.ep.get(), g.expert_data.get()};
          for (int k = 0; k < kGroups; ++k) {
            ASSERT_NE(groups[k], nullptr) << "group " << k;
            Communicator& c = *groups[k];
            HostBuf mine(DType::int32, 1), all(DType::int32, c.world_size());
            mine.set(0, comm.rank());
            c.all_gather(mine.tensor(), all.tensor());
            for (int j = 0; j < c.world_size(); ++j) gathered[r][static_cast<std::size_t>(k)].push_back(static_cast<int>(all.get(j)));
            place[r][static_cast<std::size_t>(k)] = c.rank();
          }
        },
        std::chrono::milliseconds(30'000));
    const int EDP = s.dp / s.ep;
    for (int pp = 0; pp < s.pp; ++pp)
      for (int edp = 0; edp < EDP; ++edp)
        for (int ep = 0; ep < s.ep; ++ep)
          for (int sp = 0; sp < s.sp; ++sp)
            for (int tp = 0; tp < s.tp; ++tp) {
              const int r = expert_rank(s, pp, edp, ep, sp, tp);
              const int dp = edp * s.ep + ep;
              std::array<std::vector<int>, kGroups> want;
              for (int t = 0; t < s.tp; ++t) want[0].push_back(expert_rank(s, pp, edp, ep, sp, t));
              for (int q = 0; q < s.sp; ++q) want[1].push_back(expert_rank(s, pp, edp, ep, q, tp));
              for (int e2 = 0; e2 < EDP; ++e2)
                for (int e = 0; e < s.ep; ++e) want[2].push_back(expert_rank(s, pp, e2, e, sp, tp));
              for (int e2 = 0; e2 < EDP; ++e2)
                for (int e = 0; e < s.ep; ++e)
                  for (int q = 0; q < s.sp; ++q) want[3].push_back(expert_rank(s, pp, e2, e, q, tp));
              for (int p = 0; p < s.pp; ++p) want[4].push_back(expert_rank(s, p, edp, ep, sp, tp));
              for (int e = 0; e < s.ep; ++e) want[5].push_back(expert_rank(s, pp, edp, e, sp, tp));
              for (int e2 = 0; e2 < EDP; ++e2)
                for (int q = 0; q < s.sp; ++q) want[6].push_back(expert_rank(s, pp, e2, ep, q, tp));
              const int want_place[kGroups] = {tp, sp, dp, dp * s.sp + sp, pp, ep, edp * s.sp + sp};
              for (int k = 0; k < kGroups; ++k) {
                EXPECT_EQ(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], want[static_cast<std::size_t>(k)])
                    << "rank " << r << " group " << k;
                EXPECT_EQ(place[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], want_place[k]) << "rank " << r << " group " << k;
              }
              // Sizes, independently of the lists.
              EXPECT_EQ(gathered[static_cast<std::size_t>(r)][5].size(), static_cast<std::size_t>(s.ep));
              EXPECT_EQ(gathered[static_cast<std::size_t>(r)][6].size(), static_cast<std::size_t>(EDP * s.sp));
            }
  }
}

// The member lists of three shapes written out by hand (the layout DeepSpeed's E + D order gives:
// expert-parallel = consecutive data-parallel ranks of one tensor/sequence lane).
TEST(DeviceMesh, ExpertGroupsOfThreeShapesByHand) {
  struct Case {
    int world, tp, sp, pp, ep;
    std::vector<std::vector<int>> ep_groups, expert_data_groups;  // indexed by world rank
  };
  const std::vector<Case> cases = {
      // world 8 = dp 4 x tp 2; ranks 2·dp + tp
      {8, 2, 1, 1, 2,
       {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {4, 6}, {5, 7}},
       {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}}},
      // world 8 = pp 2 x dp 4; stage 0 ranks 0-3
      {8, 1, 1, 2, 2,
       {{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4, 5}, {4, 5}, {6, 7}, {6, 7}},
       {{0, 2}, {1, 3}, {0, 2}, {1, 3}, {4, 6}, {5, 7}, {4, 6}, {5, 7}}},
      // world 4 = dp 2 x sp 2; ranks 2·dp + sp; edp 1, so expert_data is the sp pair
      {4, 1, 2, 1, 2, {{0, 2}, {1, 3}, {0, 2}, {1, 3}}, {{0, 1}, {0, 1}, {2, 3}, {2, 3}}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("world {} tp {} sp {} pp {} ep {}", k.world, k.tp, k.sp, k.pp, k.ep));
    const MeshShape shape = make_mesh_shape(k.world, k.tp, k.sp, k.pp, k.ep);
    std::vector<std::vector<int>> ep_got(static_cast<std::size_t>(k.world)), ed_got(static_cast<std::size_t>(k.world));
    run_local_ranks(k.world, [&](Communicator& comm) {
      MeshGroups g = make_mesh_groups(comm, shape);
      for (auto [c, out] : {std::pair{g.ep.get(), &ep_got}, std::pair{g.expert_data.get(), &ed_got}}) {
        HostBuf mine(DType::int32, 1), all(DType::int32, c->world_size());
        mine.set(0, comm.rank());
        c->all_gather(mine.tensor(), all.tensor());
        for (int j = 0; j < c->world_size(); ++j) (*out)[static_cast<std::size_t>(comm.rank())].push_back(static_cast<int>(all.get(j)));
      }
    });
    EXPECT_EQ(ep_got, k.ep_groups);
    EXPECT_EQ(ed_got, k.expert_data_groups);
  }
}

// ep = 1: the expert-parallel group is the rank alone and expert_data holds the data group's
// members in the data group's order; the first five groups' collectives come first, so a rank that
// uses only them sees the sequence numbers of a mesh without experts.
TEST(DeviceMesh, WithoutExpertParallelismTheExpertGroupsAreTrivial) {
  const MeshShape shape = make_mesh_shape(8, 2, 2, 1);
  std::vector<int> ep_sizes(8), ed_ranks(8), data_ranks(8), ed_sizes(8);
  run_local_ranks(8, [&](Communicator& comm) {
    MeshGroups g = make_mesh_groups(comm, shape);
    const auto r = static_cast<std::size_t>(comm.rank());
    ep_sizes[r] = g.ep->world_size();
    ed_sizes[r] = g.expert_data->world_size();
    ed_ranks[r] = g.expert_data->rank();
    data_ranks[r] = g.data->rank();
    EXPECT_EQ(g.coord.ep, 0);
    EXPECT_EQ(g.coord.edp, g.coord.dp);
  });
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(ep_sizes[static_cast<std::size_t>(r)], 1);
    EXPECT_EQ(ed_sizes[static_cast<std::size_t>(r)], 4);
    EXPECT_EQ(ed_ranks[static_cast<std::size_t>(r)], data_ranks[static_cast<std::size_t>(r)]);
  }
}

TEST(DeviceMesh, ExpertParallelIsDescribedInTheDataParallelPartAndItsErrorsNameTheKey) {
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 2, 1, 1, 2)),
            "world 8 = data-parallel 4 (expert-parallel 2 x expert-data-parallel 2) x tensor-parallel 2 (tensor-parallel innermost: ranks "
            "0-1 split one layer)");
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 1, 1, 2, 4)),
            "world 8 = pipeline 2 x data-parallel 4 (expert-parallel 4 x expert-data-parallel 1) (pipeline outermost: ranks 0-3 are stage "
            "0)");
  // ep = 1: the text of the mesh without experts.
  EXPECT_EQ(describe_mesh(make_mesh_shape(8, 2, 1, 1, 1)), describe_mesh(make_mesh_shape(8, 2, 1)));
  std::string m = message_of([] { make_mesh_shape(8, 2, 1, 1, 3); });
  EXPECT_THAT(m, HasSubstr("expert_parallel.autoep_size 3 does not divide the data-parallel size 4 (world size 8 / tensor_parallel.autotp_size 2)"));
  EXPECT_THAT(m, HasSubstr("one of 1, 2, 4"));
  m = message_of([] { make_mesh_shape(12, 1, 2, 2, 2); });
  EXPECT_THAT(m, HasSubstr("expert_parallel.autoep_size 2 does not divide the data-parallel size 3 (world size 12 / 2 pipeline stages / "
                           "sequence_parallel_size 2)"));
  EXPECT_THAT(m, HasSubstr("one of 1, 3"));
  m = message_of([] { make_mesh_shape(6, 1, 1, 1, 4); });
  EXPECT_THAT(m, HasSubstr("expert_parallel.autoep_size 4 does not divide the data-parallel size 6 (the world size)"));
  EXPECT_THAT(m, HasSubstr("1, 2, 3, 6"));
  m = message_of([] { make_mesh_shape(8, 1, 1, 1, 0); });
  EXPECT_THAT(m, HasSubstr("expert_parallel.autoep_size is 0"));
  // A shape put together by hand with an ep that does not divide dp is refused where it is used.
  MeshShape bad = make_mesh_shape(8, 1, 1, 1);
  bad.ep = 3;
  EXPECT_THAT(message_of([&] { mesh_coord(bad, 0); }), HasSubstr("expert-parallel size 3 does not divide its data-parallel size 8"));
}
