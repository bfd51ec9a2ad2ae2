// Communicator::split on the local backend: on 4 and 8 ranks, for color/key patterns with groups of
// different sizes, keys that reverse the ranks, ties, each child's rank and size and its
// all_reduce, all_gather and all_to_all are compared with values the test computes from the member
// lists it enumerates itself (sort (key, rank) per color). Then: children used at once, in
// different orders; per-group byte counters; children of children that outlive their parent; and
// the failures (a rank that throws or returns, a mismatch inside a child, a poisoned parent, a
// negative color), each an Error within a fraction of the timeout, never a hang.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/comms_logger.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::HostBuf;
using ::testing::HasSubstr;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Pattern {
  const char* name;
  // (color, key) of parent rank r of w.
  std::function<std::pair<int, int>(int r, int w)> color_key;
};

const std::vector<Pattern>& patterns() {
  static const std::vector<Pattern> p = {
      {"pairs",
       [](int r, int) {
         return std::pair{r / 2, r};
       }},
      {"one group, keys reverse the ranks",
       [](int r, int) {
         return std::pair{0, -r};
       }},
      {"sizes 1, 2 and w-3",
       [](int r, int) {
         return std::pair{r == 0 ? 0 : (r < 3 ? 1 : 2), 0};
       }},
      {"mod 3, equal keys (ties keep rank order)",
       [](int r, int) {
         return std::pair{r % 3, 7};
       }},
      {"even/odd, reversed inside",
       [](int r, int w) {
         return std::pair{r % 2, w - r};
       }},
      {"sparse colors, shuffled keys",
       [](int r, int w) {
         return std::pair{r < w / 2 ? 100 : 5, (r * 5) % w};
       }},
      {"every rank alone",
       [](int r, int) {
         return std::pair{r, 0};
       }},
  };
  return p;
}

// The naive reference: the parent ranks of `color`, sorted by (key, rank).
std::vector<int> members_of(const Pattern& p, int w, int color) {
  std::vector<std::pair<int, int>> key_rank;
  for (int r = 0; r < w; ++r) {
    const auto [c, k] = p.color_key(r, w);
    if (c == color) key_rank.emplace_back(k, r);
  }
  std::sort(key_rank.begin(), key_rank.end());
  std::vector<int> m;
  for (const auto& kr : key_rank) m.push_back(kr.second);
  return m;
}

int index_in(const std::vector<int>& v, int x) { return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin()); }

// The ring volume of docs in zero/communicator.h, written out here: W ranks, N bytes.
std::uint64_t ring_all_reduce(std::uint64_t n_bytes, int w) { return w == 1 ? 0 : 2 * static_cast<std::uint64_t>(w - 1) * n_bytes / w; }
std::uint64_t ring_shard(std::uint64_t n_bytes, int w) { return w == 1 ? 0 : static_cast<std::uint64_t>(w - 1) * n_bytes / w; }

// Values with no rounding in fp32: small integers that differ per rank, shard and element.
double ar_value(int parent_rank, std::int64_t i) { return static_cast<double>((parent_rank + 1) * 100 + i); }
double ag_value(int parent_rank, std::int64_t i) { return static_cast<double>(parent_rank * 1000 + i); }
double a2a_value(int parent_rank, int to_child_rank, std::int64_t i) { return static_cast<double>(parent_rank * 10000 + to_child_rank * 100 + i); }

constexpr std::int64_t kN = 5;  // elements per rank (all_gather, all_to_all shard) and of the all_reduce

struct RankOutcome {
  int child_rank = -1;
  int child_world = -1;
  std::string backend;
  HostBuf reduced, gathered, exchanged;
  CommStats child_stats, parent_delta;
};

// One pattern on w ranks: every rank splits, then runs one all_reduce, all_gather and all_to_all in
// its child; the main thread compares everything with the reference.
void check_pattern(const Pattern& p, int w) {
  SCOPED_TRACE(fmt::format("{} on {} ranks", p.name, w));
  std::vector<RankOutcome> out(static_cast<std::size_t>(w));
  run_local_ranks(
      w,
      [&](Communicator& parent) {
        RankOutcome& o = out[static_cast<std::size_t>(parent.rank())];
        const auto [color, key] = p.color_key(parent.rank(), w);
        const CommStats before = parent.stats();
        std::unique_ptr<Communicator> child = parent.split(color, key);
        const CommStats after_split = parent.stats();
        o.child_rank = child->rank();
        o.child_world = child->world_size();
        o.backend = std::string(child->backend());
        const int cw = child->world_size();
        o.reduced = HostBuf(DType::fp32, kN);
        for (std::int64_t i = 0; i < kN; ++i) o.reduced.set(i, ar_value(parent.rank(), i));
        child->all_reduce(o.reduced.tensor(), ReduceOp::sum);
        HostBuf mine(DType::fp32, kN);
        for (std::int64_t i = 0; i < kN; ++i) mine.set(i, ag_value(parent.rank(), i));
        o.gathered = HostBuf(DType::fp32, kN * cw);
        child->all_gather(mine.tensor(), o.gathered.tensor());
        HostBuf send(DType::fp32, kN * cw);
        for (int j = 0; j < cw; ++j)
          for (std::int64_t i = 0; i < kN; ++i) send.set(j * kN + i, a2a_value(parent.rank(), j, i));
        o.exchanged = HostBuf(DType::fp32, kN * cw);
        child->all_to_all(send.tensor(), o.exchanged.tensor());
        o.child_stats = child->stats();
        o.parent_delta = parent.stats() - before;
        // The parent counted the split's exchange, and nothing of the child's traffic.
        EXPECT_EQ((after_split - before).total_calls(), 1u);
      },
      std::chrono::milliseconds(30'000));

  for (int r = 0; r < w; ++r) {
    SCOPED_TRACE(fmt::format("parent rank {}", r));
    const RankOutcome& o = out[static_cast<std::size_t>(r)];
    const std::vector<int> m = members_of(p, w, p.color_key(r, w).first);
    const int cw = static_cast<int>(m.size());
    ASSERT_EQ(o.child_world, cw);
    ASSERT_EQ(o.child_rank, index_in(m, r));
    EXPECT_EQ(o.backend, "local");
    for (std::int64_t i = 0; i < kN; ++i) {
      double sum = 0;
      for (int q : m) sum += ar_value(q, i);
      EXPECT_EQ(o.reduced.get(i), sum) << "all_reduce element " << i;
    }
    for (int j = 0; j < cw; ++j)
      for (std::int64_t i = 0; i < kN; ++i) {
        EXPECT_EQ(o.gathered.get(j * kN + i), ag_value(m[static_cast<std::size_t>(j)], i)) << "all_gather shard " << j << " element " << i;
        EXPECT_EQ(o.exchanged.get(j * kN + i), a2a_value(m[static_cast<std::size_t>(j)], o.child_rank, i))
            << "all_to_all shard " << j << " element " << i;
      }
    // Per-group counters: the child's own three collectives, at its own world size.
    const std::uint64_t bytes = static_cast<std::uint64_t>(kN) * 4;
    EXPECT_EQ(o.child_stats.total_calls(), 3u);
    EXPECT_EQ(o.child_stats.bytes_sent(CollectiveKind::all_reduce), ring_all_reduce(bytes, cw));
    EXPECT_EQ(o.child_stats.bytes_sent(CollectiveKind::all_gather), ring_shard(bytes * cw, cw));
    EXPECT_EQ(o.child_stats.bytes_sent(CollectiveKind::all_to_all), ring_shard(bytes * cw, cw));
    // The parent: one all_gather of 2 int32 per rank (the exchange), at the parent's world size.
    EXPECT_EQ(o.parent_delta.call_count(CollectiveKind::all_gather), 1u);
    EXPECT_EQ(o.parent_delta.total_calls(), 1u);
    EXPECT_EQ(o.parent_delta.total_bytes_sent(), ring_shard(8u * static_cast<std::uint64_t>(w), w));
  }
}

// Runs fn on w ranks; returns each rank's Error message ("" if none) and the rethrown one.
struct FailureRun {
  std::vector<std::string> errors;
  std::string rethrown;
  double seconds = 0;
};
FailureRun run_failing(int w, std::chrono::milliseconds timeout, const std::function<void(Communicator&, std::string&)>& fn) {
  FailureRun run;
  run.errors.assign(static_cast<std::size_t>(w), "");
  const auto t0 = Clock::now();
  try {
    run_local_ranks(
        w, [&](Communicator& c) { fn(c, run.errors[static_cast<std::size_t>(c.rank())]); }, timeout);
  } catch (const Error& e) {
    run.rethrown = e.what();
  }
  run.seconds = seconds_since(t0);
  return run;
}

// Calls f, stores its Error's message in `error` and rethrows.
template <typename F>
void recording(std::string& error, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    error = e.what();
    throw;
  }
}

}  // namespace

TEST(LocalSplit, FourRanksEveryPattern) {
  for (const Pattern& p : patterns()) check_pattern(p, 4);
}

TEST(LocalSplit, EightRanksEveryPattern) {
  for (const Pattern& p : patterns()) check_pattern(p, 8);
}

// Two splits of 8 ranks as a 2 x 4 grid: rows {0..3}, {4..7} and columns {0,4}, {1,5}, ... Row 0
// uses its row then its column, row 1 the other way round, 40 times with different sizes and
// values, and the parent in between: every result matches the reference, so no collective of one
// group was matched with another's.
TEST(LocalSplit, ChildrenUsedConcurrentlyInDifferentOrders) {
  constexpr int w = 8;
  constexpr int rounds = 40;
  std::vector<int> bad(w, 0);
  run_local_ranks(
      w,
      [&](Communicator& world) {
        const int r = world.rank();
        std::unique_ptr<Communicator> row = world.split(r / 4, r);
        std::unique_ptr<Communicator> col = world.split(r % 4, r);
        const auto row_step = [&](int round) {
          const std::int64_t n = 1 + round % 7;
          HostBuf b(DType::fp32, n);
          for (std::int64_t i = 0; i < n; ++i) b.set(i, r * 10 + round + i);
          row->all_reduce(b.tensor(), ReduceOp::sum);
          for (std::int64_t i = 0; i < n; ++i) {
            double want = 0;
            for (int q = (r / 4) * 4; q < (r / 4) * 4 + 4; ++q) want += q * 10 + round + i;
            if (b.get(i) != want) ++bad[static_cast<std::size_t>(r)];
          }
        };
        const auto col_step = [&](int round) {
          const std::int64_t n = 2 + round % 5;
          HostBuf mine(DType::fp32, n), all(DType::fp32, 2 * n);
          for (std::int64_t i = 0; i < n; ++i) mine.set(i, r * 100 + round * 3 + i);
          col->all_gather(mine.tensor(), all.tensor());
          for (int j = 0; j < 2; ++j)
            for (std::int64_t i = 0; i < n; ++i)
              if (all.get(j * n + i) != (r % 4 + 4 * j) * 100 + round * 3 + i) ++bad[static_cast<std::size_t>(r)];
        };
        for (int round = 0; round < rounds; ++round) {
          if (r < 4) {
            row_step(round);
            col_step(round);
          } else {
            col_step(round);
            row_step(round);
          }
          if (round % 10 == 9) {
            HostBuf one(DType::int32, 1);
            one.set(0, 1);
            world.all_reduce(one.tensor(), ReduceOp::sum);
            if (one.get(0) != w) ++bad[static_cast<std::size_t>(r)];
          }
        }
        EXPECT_EQ(row->stats().total_calls(), static_cast<std::uint64_t>(rounds));
        EXPECT_EQ(col->stats().total_calls(), static_cast<std::uint64_t>(rounds));
      },
      std::chrono::milliseconds(30'000));
  for (int r = 0; r < w; ++r) EXPECT_EQ(bad[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

// A split of a split works, and outlives both the split it came from and that one's own child: the
// grandchildren are used after their parent communicators were destroyed.
TEST(LocalSplit, ChildrenOfChildrenOutliveTheirParents) {
  constexpr int w = 8;
  std::vector<double> got(w, 0);
  std::vector<int> ranks(w, -1), sizes(w, -1);
  run_local_ranks(
      w,
      [&](Communicator& world) {
        const int r = world.rank();
        std::unique_ptr<Communicator> pair;
        {
          std::unique_ptr<Communicator> half = world.split(r / 4, -r);  // halves, reversed
          pair = half->split(half->rank() / 2, half->rank());           // pairs of the reversed halves
        }
        HostBuf b(DType::fp32, 1);
        b.set(0, 1 << r);
        pair->all_reduce(b.tensor(), ReduceOp::sum);
        got[static_cast<std::size_t>(r)] = b.get(0);
        ranks[static_cast<std::size_t>(r)] = pair->rank();
        sizes[static_cast<std::size_t>(r)] = pair->world_size();
      },
      std::chrono::milliseconds(30'000));
  // Reference: half h's ranks reversed (4h+3, 4h+2, 4h+1, 4h), then cut in pairs of that order.
  for (int r = 0; r < w; ++r) {
    const int in_half = 3 - r % 4;  // rank in the reversed half
    const int partner = (r / 4) * 4 + (3 - (in_half ^ 1));
    EXPECT_EQ(sizes[static_cast<std::size_t>(r)], 2) << "rank " << r;
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)], in_half % 2) << "rank " << r;
    EXPECT_EQ(got[static_cast<std::size_t>(r)], (1 << r) + (1 << partner)) << "rank " << r;
  }
}

// The comms logger's split is a logger of the inner communicator's child: its table holds the
// child's collectives at the child's world size, the parent's table none of them.
TEST(LocalSplit, CommsLoggerSplitLogsTheChildOnItsOwn) {
  constexpr int w = 4;
  std::vector<std::uint64_t> parent_calls(w), child_calls(w);
  std::vector<int> child_log_world(w), child_world(w);
  std::vector<std::string> child_kind(w);
  std::vector<int> syncs(w, 0);
  run_local_ranks(w, [&](Communicator& local) {
    const auto r = static_cast<std::size_t>(local.rank());
    CommsLogger logger(local, CommsLoggerOptions{.synchronize = [&syncs, r] { ++syncs[r]; }, .print = [](const std::string&) {}});
    std::unique_ptr<Communicator> child = logger.split(local.rank() % 2, 0);
    auto* child_logger = dynamic_cast<CommsLogger*>(child.get());
    child_kind[r] = child_logger != nullptr ? "CommsLogger" : "other";
    if (child_logger == nullptr) return;
    HostBuf b(DType::fp32, 8);
    child->all_reduce(b.tensor(), ReduceOp::sum);
    child->barrier();
    parent_calls[r] = logger.log().total_calls();
    child_calls[r] = child_logger->log().total_calls();
    child_log_world[r] = child_logger->log().world_size();
    child_world[r] = child->world_size();
  });
  for (std::size_t r = 0; r < w; ++r) {
    EXPECT_EQ(child_kind[r], "CommsLogger");
    EXPECT_EQ(parent_calls[r], 0u) << "the split's exchange is the inner communicator's, not a logged op";
    EXPECT_EQ(child_calls[r], 2u);
    EXPECT_EQ(child_world[r], 2);
    EXPECT_EQ(child_log_world[r], 2);
    EXPECT_EQ(syncs[r], 2) << "each profiled child collective is synchronized through the same option";
  }
}

// Rank 1 throws right after the split, before the first collective of its group {0, 1}: rank 0,
// waiting there, fails at once naming rank 1, not at the (long) timeout; the other group {2, 3}
// ends in an Error too (its next world collective, or its own group poisoned from the world).
TEST(LocalSplit, RankThatThrowsFailsItsChildGroupPeersAtOnce) {
  const FailureRun run = run_failing(4, std::chrono::milliseconds(20'000), [](Communicator& world, std::string& error) {
    std::unique_ptr<Communicator> child = world.split(world.rank() / 2, 0);
    if (world.rank() == 1) throw Error("rank 1 gave up");
    recording(error, [&] {
      HostBuf b(DType::fp32, 4);
      child->all_reduce(b.tensor(), ReduceOp::sum);
      world.barrier();
    });
  });
  EXPECT_LT(run.seconds, 10.0) << "waited for the timeout instead of failing at once";
  EXPECT_EQ(run.rethrown, "rank 1 gave up");
  // The root cause everywhere: run_local_ranks poisons the world with rank 1's exception, and the
  // world its groups (rank 1's child communicator, destroyed while the exception unwinds, does not
  // leave first, which would fail rank 0 with "finished" and make that the rethrown Error).
  for (int r : {0, 2, 3}) EXPECT_THAT(run.errors[static_cast<std::size_t>(r)], HasSubstr("rank 1 failed: rank 1 gave up")) << "rank " << r;
}

// Rank 3 returns without its group's collective (a rank-dependent branch): its child
// communicator's end tells rank 2 at once.
TEST(LocalSplit, RankThatReturnsFailsItsChildGroupPeersAtOnce) {
  const FailureRun run = run_failing(4, std::chrono::milliseconds(20'000), [](Communicator& world, std::string& error) {
    std::unique_ptr<Communicator> child = world.split(world.rank() / 2, 0);
    HostBuf b(DType::fp32, 4);
    child->all_reduce(b.tensor(), ReduceOp::sum);                             // #1: every rank
    if (world.rank() != 2) return;                                            // (group {0, 1} ends here too: nothing left to poison)
    recording(error, [&] { child->all_reduce(b.tensor(), ReduceOp::sum); });  // #2: rank 3 never comes
  });
  EXPECT_LT(run.seconds, 10.0) << "waited for the timeout instead of failing at once";
  EXPECT_THAT(run.errors[2], HasSubstr("all_reduce #2"));
  EXPECT_THAT(run.errors[2], HasSubstr("rank(s) 1 finished"));  // rank 1 of the child {2, 3}
  EXPECT_EQ(run.errors[0], "");
  EXPECT_EQ(run.errors[1], "");
  EXPECT_EQ(run.rethrown, run.errors[2]);
}

// A mismatch inside group {0, 1} poisons that group only: both its ranks fail naming both calls,
// later calls there fail at once with the same message, and group {2, 3} and the world go on.
TEST(LocalSplit, PoisonedChildFailsAtOnceAndLeavesTheOthersAlone) {
  std::vector<std::string> first(4), later(4);
  std::vector<double> other_group(4, 0), world_sum(4, 0);
  const auto t0 = Clock::now();
  run_local_ranks(
      4,
      [&](Communicator& world) {
        const auto r = static_cast<std::size_t>(world.rank());
        std::unique_ptr<Communicator> child = world.split(world.rank() / 2, 0);
        if (world.rank() < 2) {
          HostBuf b(DType::fp32, world.rank() == 0 ? 5 : 6);
          try {
            child->all_reduce(b.tensor(), ReduceOp::sum);
          } catch (const Error& e) {
            first[r] = e.what();
          }
          try {
            child->barrier();
          } catch (const Error& e) {
            later[r] = e.what();
          }
        } else {
          HostBuf b(DType::fp32, 1);
          b.set(0, world.rank());
          child->all_reduce(b.tensor(), ReduceOp::sum);
          other_group[r] = b.get(0);
        }
        HostBuf one(DType::fp32, 1);
        one.set(0, 1);
        world.all_reduce(one.tensor(), ReduceOp::sum);
        world_sum[r] = one.get(0);
      },
      std::chrono::milliseconds(20'000));
  EXPECT_LT(seconds_since(t0), 10.0);
  for (std::size_t r : {0u, 1u}) {
    EXPECT_THAT(first[r], HasSubstr("collective mismatch")) << "rank " << r;
    EXPECT_THAT(first[r], HasSubstr("5 elements"));
    EXPECT_THAT(first[r], HasSubstr("6 elements"));
    EXPECT_EQ(later[r], first[r]) << "rank " << r;
  }
  EXPECT_EQ(other_group[2], 5.0);
  EXPECT_EQ(other_group[3], 5.0);
  for (std::size_t r = 0; r < 4; ++r) EXPECT_EQ(world_sum[r], 4.0) << "rank " << r;
}

// A failure in the world (rank 0's bad argument) poisons the groups split from it: each rank's
// next collective in its own group fails at once with the world's message, whether or not rank 0
// is in that group.
TEST(LocalSplit, PoisonedParentPoisonsItsChildren) {
  const FailureRun run = run_failing(4, std::chrono::milliseconds(20'000), [](Communicator& world, std::string& error) {
    std::unique_ptr<Communicator> child = world.split(world.rank() / 2, 0);
    HostBuf counts(DType::int32, 2);
    try {
      world.all_reduce(counts.tensor(), world.rank() == 0 ? ReduceOp::avg : ReduceOp::sum);  // avg of int32 is refused on rank 0
    } catch (const Error&) {
    }
    recording(error, [&] { child->barrier(); });
  });
  EXPECT_LT(run.seconds, 10.0);
  for (std::size_t r = 0; r < 4; ++r) EXPECT_THAT(run.errors[r], HasSubstr("avg of int32 is not defined")) << "rank " << r;
}

// A negative color is refused on the rank that passes it, and the others, waiting in the exchange,
// fail at once with that message.
TEST(LocalSplit, NegativeColorIsAnErrorOnEveryRank) {
  const FailureRun run = run_failing(4, std::chrono::milliseconds(20'000), [](Communicator& world, std::string& error) {
    recording(error, [&] { (void)world.split(world.rank() == 2 ? -1 : 0, 0); });
  });
  EXPECT_LT(run.seconds, 10.0);
  EXPECT_THAT(run.rethrown, HasSubstr("color -1 is negative"));
  for (std::size_t r = 0; r < 4; ++r) EXPECT_THAT(run.errors[r], HasSubstr("color -1 is negative")) << "rank " << r;
}

// One rank splits while another issues a different collective: the exchange names both calls.
TEST(LocalSplit, SplitAgainstAnotherCollectiveIsAMismatch) {
  const FailureRun run = run_failing(2, std::chrono::milliseconds(20'000), [](Communicator& world, std::string& error) {
    recording(error, [&] {
      if (world.rank() == 0) {
        (void)world.split(0, 0);
      } else {
        world.barrier();
      }
    });
  });
  EXPECT_LT(run.seconds, 10.0);
  EXPECT_THAT(run.errors[0], HasSubstr("collective mismatch"));
  EXPECT_THAT(run.errors[0], HasSubstr("all_gather #1"));
  EXPECT_THAT(run.errors[0], HasSubstr("barrier #1"));
}
