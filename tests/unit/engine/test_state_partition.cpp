// The optimizer partition visited in sub-groups (docs/training_state.md §3-4): cutting a rank's
// partition into sub_group_size pieces — through parameter tensors, chunks and layers — changes no
// bit of training, at every ZeRO stage, on 1 and 2 ranks, in fp32 and bf16; and every element of
// every owned parameter sits in exactly one piece of one rank (the map checkpoints save by).
#include <map>
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "zero/model_states.h"
#include "zero_test_util.h"

namespace dstrain {
namespace {

using namespace zero_testing;

RunSpec partition_run(int stage, int world, Precision p, std::int64_t sub_group_size) {
  RunSpec s;
  s.stage = stage;
  s.world = world;
  s.gas = 2;
  s.precision = p;
  s.steps = 3;
  s.knobs.reduce_bucket_size = 3000;  // several chunks per block, so sub-groups and chunks interleave
  s.knobs.sub_group_size = sub_group_size;
  return s;
}

class SubGroups : public ::testing::TestWithParam<std::tuple<int, int, Precision>> {};

// 777 elements (cut to 768, a multiple of 16) splits every block's tensors and chunks; the
// update is element-wise, so the result must be bit for bit the one-group run's.
TEST_P(SubGroups, BitIdenticalToOneSubGroup) {
  const auto [stage, world, prec] = GetParam();
  const RunResult whole = run_zero(partition_run(stage, world, prec, 1'000'000'000));
  const RunResult cut = run_zero(partition_run(stage, world, prec, 777));
  for (std::size_t r = 0; r < whole.ranks.size(); ++r) {
    SCOPED_TRACE(testing::Message() << "rank " << r);
    ASSERT_EQ(whole.ranks[r].losses.size(), cut.ranks[r].losses.size());
    for (std::size_t k = 0; k < whole.ranks[r].losses.size(); ++k) EXPECT_EQ(whole.ranks[r].losses[k], cut.ranks[r].losses[k]) << "step " << k + 1;
    ASSERT_EQ(whole.ranks[r].params.size(), cut.ranks[r].params.size());
    for (const auto& [name, v] : whole.ranks[r].params) {
      const std::vector<float>& w = cut.ranks[r].params.at(name);
      ASSERT_EQ(v.size(), w.size()) << name;
      for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], w[i]) << name << "[" << i << "]";
    }
    // The run did train: the parameters moved away from their init (loss changed between steps).
    EXPECT_NE(whole.ranks[r].losses.front(), whole.ranks[r].losses.back());
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, SubGroups,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2),
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         [](const auto& pinfo) {
                           return fmt::format("Stage{}_W{}_{}", std::get<0>(pinfo.param), std::get<1>(pinfo.param),
                                              precision_name(std::get<2>(pinfo.param)));
                         });

// ModelStates::owned_pieces over the W ranks of a group tile every owned parameter exactly once,
// and each rank's pieces sit inside its shard space without overlap; for_each_subgroup visits every
// segment of the partition once, inside its sub-group, with pieces that agree with owned_pieces.
TEST(OwnedPieces, TileEveryParameterOnceAcrossRanks) {
  const auto specs = model_specs();
  std::vector<std::string> names;
  for (std::size_t i = 0; i < specs.size(); ++i) names.push_back("layer" + std::to_string(i));
  for (const int stage : {0, 1, 2, 3}) {
    for (const int world : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << "stage " << stage << " world " << world);
      std::map<std::string, std::vector<int>> covered;  // parameter -> per element: how many ranks hold it
      std::mutex mu;
      run_local_ranks(world, [&](Communicator& comm) {
        ZeroSettings zs;
        zs.stage = stage;
        zs.storage = DType::bf16;
        zs.optimizer_states = {"exp_avg", "exp_avg_sq"};
        zs.reduce_bucket_size = 3000;
        zs.allgather_bucket_size = 3000;
        zs.sub_group_size = 1000;
        CpuAllocator alloc;
        ModelStates ms(specs, names, zs, &comm, alloc);
        // Each piece inside the shard space, pieces in shard order without overlap.
        std::int64_t last_end = 0;
        for (const OwnedPiece& p : ms.owned_pieces()) {
          EXPECT_GE(p.shard_offset, last_end);
          last_end = p.shard_offset + p.numel;
          EXPECT_LE(last_end, ms.store().layout().numel);
        }
        // Segments through for_each_subgroup: inside their sub-group, each piece of a segment one of owned_pieces.
        std::set<std::tuple<std::int32_t, std::int64_t>> piece_starts;
        for (const OwnedPiece& p : ms.owned_pieces())
          for (std::int64_t e = 0; e < p.numel; ++e) piece_starts.insert({p.tensor, p.tensor_offset + e});
        std::int64_t seen = 0;
        ms.for_each_subgroup([&](std::span<const OptimizerSegment> segs) {
          for (const OptimizerSegment& s : segs) {
            EXPECT_EQ(s.states.size(), 2u);
            EXPECT_EQ(s.params.numel(), s.grads.numel());
            for (const TensorPiece& tp : s.pieces)
              for (std::int64_t e = 0; e < tp.numel; ++e) EXPECT_TRUE(piece_starts.count({tp.tensor, tp.tensor_offset + e})) << tp.tensor;
            seen += s.params.numel();
          }
        });
        std::int64_t parts = 0;
        for (const PartitionSegment& p : ms.partitions()) parts += p.numel;
        EXPECT_EQ(seen, parts);
        std::lock_guard<std::mutex> lock(mu);
        for (const OwnedPiece& p : ms.owned_pieces()) {
          const ParamSpec& ps = ms.spec(p.layer, *p.slot);
          std::vector<int>& c = covered[ps.name];
          c.resize(static_cast<std::size_t>(ps.shape.numel()), 0);
          for (std::int64_t e = 0; e < p.numel; ++e) c[static_cast<std::size_t>(p.tensor_offset + e)] += 1;
        }
      });
      // Stage 0 does not split the partition: each of the W ranks holds everything once.
      const int expect = stage == 0 ? world : 1;
      for (const auto& layer : specs) {
        for (const ParamSpec& ps : layer) {
          if (ps.tied()) continue;
          const std::vector<int>& c = covered.at(ps.name);
          ASSERT_EQ(static_cast<std::int64_t>(c.size()), ps.shape.numel()) << ps.name;
          for (std::size_t e = 0; e < c.size(); ++e) ASSERT_EQ(c[e], expect) << ps.name << "[" << e << "]";
        }
      }
    }
  }
}

}  // namespace
}  // namespace dstrain
