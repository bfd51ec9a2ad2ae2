// The MPI backend against the local backend, run by ctest under mpiexec with 2, 3 and 4 processes:
// every collective, every dtype and op, odd sizes (chunks of uneven length, empty ones), in place
// and out of place, gives on every process exactly the bits that the local backend (W threads in
// this same process, fed the same per-rank inputs) gives the same rank, and the same byte counters.
// Then split (MPI_Comm_split): children's members, collectives and counters against the test's
// own enumeration, children that outlive their parent, the device mesh's groups (pipeline stages
// and expert groups included). The variable all-to-all and exchange_counts against the formula's blocks. Point-to-point send/recv: a ring in every dtype against the local backend, a pair's
// order, the pipeline group; the batched send_recv (a ring, both neighbours, the pair's order
// across batched and standalone calls). Then the failures: mismatched calls fail on every rank
// naming both (collectives) or on both ranks of the pair (send/recv, send_recv, all_to_all_v's
// counts), a rank that never
// arrives (or splits with a negative color, or never sends) is named by the others within the
// timeout.
//
// Every process runs every test in the same order (the collectives must match); main() combines
// the processes' results, so ctest fails when any process failed.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm_test_util.h"
#include "ops/error.h"
#include "zero/device_mesh.h"
#include "zero/local_communicator.h"
#if DSTRAIN_TEST_GLOO
#include <thread>

#include "zero/gloo_communicator.h"
#include "zero/launch_env.h"
#define COLLECTIVES_SUITE GlooCollectives
#else
#include <mpi.h>

#include "zero/mpi_communicator.h"
#include "zero/mpi_process.h"
#define COLLECTIVES_SUITE MpiCollectives
#endif

namespace dstrain {
namespace {

using testing_comm::HostBuf;

#if DSTRAIN_TEST_GLOO
// The processes tests/unit/zero/run_ranks.sh started (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
// Each test's group meets on a port of its own (MASTER_PORT + the groups made so far, the same
// count on every process): a group's store lives as long as its rank 0's group.
const LaunchEnv& launch() {
  static const LaunchEnv env = detect_launch_env();
  return env;
}
int world() { return launch().world_size; }
int me() { return launch().rank; }
std::unique_ptr<Communicator> make_world(std::chrono::milliseconds timeout = default_comm_timeout()) {
  static int groups = 0;
  LaunchEnv env = launch();
  env.master_port += groups++;
  // Joining may take longer than a failure test's short collective timeout on a loaded machine.
  return std::make_unique<GlooCommunicator>(env, timeout, std::max(timeout, std::chrono::milliseconds(30'000)));
}
// A rank that leaves a failing test early keeps its group a while: a Gloo peer whose connections
// close is named at once, and the test is about the timeout (1.5 s; more than 3x that, for a
// loaded machine where the waiting rank starts its wait late).
void linger() { std::this_thread::sleep_for(std::chrono::milliseconds(5000)); }
constexpr const char* kBackend = "gloo";
#else
int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}
int me() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
std::unique_ptr<Communicator> make_world(std::chrono::milliseconds timeout = default_comm_timeout()) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
}
void linger() {}
constexpr const char* kBackend = "mpi";
#endif
// Every process meets here after a test that left its group unusable.
void process_barrier() {
#if DSTRAIN_TEST_GLOO
  make_world()->barrier();
#else
  MPI_Barrier(MPI_COMM_WORLD);
#endif
}

// Rank r's element i: values with many significant bits (so the order and the width of the
// accumulation show in the rounded result), of both signs; int32 values large enough to wrap.
double value(DType dtype, int rank, std::int64_t i) {
  const std::uint64_t h = (static_cast<std::uint64_t>(i) * 2654435761u + static_cast<std::uint64_t>(rank) * 40503u + 17u) % 1000003u;
  if (dtype == DType::int32) return static_cast<double>(static_cast<std::int32_t>(static_cast<std::uint32_t>(h * 2147u)));
  return (static_cast<double>(h) / 1000003.0 - 0.5) * (1.0 + static_cast<double>(rank) * 0.37) * 3.1;
}

HostBuf filled(DType dtype, int rank, std::int64_t n) {
  HostBuf b(dtype, n);
  for (std::int64_t i = 0; i < n; ++i) b.set(i, value(dtype, rank, i));
  return b;
}

void expect_same_bits(const HostBuf& got, const HostBuf& want, const std::string& what) {
  ASSERT_EQ(got.n, want.n) << what;
  std::int64_t differ = 0, first = -1;
  for (std::int64_t i = 0; i < got.n; ++i) {
    if (got.bits(i) != want.bits(i)) {
      if (first < 0) first = i;
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << got.n << " elements differ, first at " << first << " (mpi " << got.get(first)
                       << ", local " << want.get(first) << ")";
}

// Runs `fn(comm, rank)` on the local backend with world() threads and returns what rank me()'s
// thread produced (its buffer) and its counters.
template <typename Fn>
std::pair<HostBuf, CommStats> local_result(Fn fn) {
  HostBuf mine;
  CommStats stats;
  const int r0 = me();
  run_local_ranks(world(), [&](Communicator& comm) {
    HostBuf out = fn(comm, comm.rank());
    if (comm.rank() == r0) {
      mine = out;
      stats = comm.stats();
    }
  });
  return {mine, stats};
}

const DType kDtypes[] = {DType::fp32, DType::fp16, DType::bf16, DType::fp64, DType::int32};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};
const std::int64_t kSizes[] = {0, 1, 3, 7, 1000, 4099};  // 3, 7, 4099: chunks of unequal length; 1: empty chunks

bool valid(DType d, ReduceOp op) { return !(d == DType::int32 && op == ReduceOp::avg); }

std::string name(const char* what, DType d, ReduceOp op, std::int64_t n) {
  return fmt::format("{} {} {} n={} W={}", what, dtype_name(d), reduce_op_name(op), n, world());
}

TEST(COLLECTIVES_SUITE, AllReduceMatchesLocalBitForBit) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  for (DType d : kDtypes)
    for (ReduceOp op : kOps)
      for (std::int64_t n : kSizes) {
        if (!valid(d, op)) continue;
        const auto [want, want_stats] = local_result([&](Communicator& c, int r) {
          HostBuf b = filled(d, r, n);
          c.all_reduce(b.tensor(), op);
          return b;
        });
        HostBuf got = filled(d, me(), n);
        mpi.reset_stats();
        mpi.all_reduce(got.tensor(), op);
        expect_same_bits(got, want, name("all_reduce", d, op, n));
        EXPECT_EQ(mpi.stats().bytes, want_stats.bytes) << name("all_reduce", d, op, n);
        EXPECT_EQ(mpi.stats().calls, want_stats.calls);
      }
}

TEST(COLLECTIVES_SUITE, ReduceScatterOutOfPlaceAndInPlaceMatchLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  const int w = world();
  for (DType d : kDtypes)
    for (ReduceOp op : kOps)
      for (std::int64_t n : {0, 1, 5, 257}) {
        if (!valid(d, op)) continue;
        for (bool in_place : {false, true}) {
          const auto run = [&](Communicator& c, int r) {
            HostBuf send = filled(d, r, n * w);
            if (in_place) {
              c.reduce_scatter(send.tensor(), shard_of(send.tensor(), r, w), op);
              HostBuf out(d, n);
              if (n > 0) std::memcpy(out.at(0), send.at(n * r), static_cast<std::size_t>(n) * dtype_size(d));
              return out;
            }
            HostBuf recv(d, n);
            c.reduce_scatter(send.tensor(), recv.tensor(), op);
            return recv;
          };
          const auto [want, want_stats] = local_result(run);
          mpi.reset_stats();
          const HostBuf got = run(mpi, me());
          expect_same_bits(got, want, name(in_place ? "reduce_scatter in place" : "reduce_scatter", d, op, n));
          EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
        }
      }
}

TEST(COLLECTIVES_SUITE, AllGatherOutOfPlaceAndInPlaceMatchLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  const int w = world();
  for (DType d : kDtypes)
    for (std::int64_t n : {0, 1, 5, 1001}) {
      for (bool in_place : {false, true}) {
        const auto run = [&](Communicator& c, int r) {
          HostBuf recv(d, n * w);
          HostBuf own = filled(d, r, n);
          if (in_place) {
            if (n > 0) std::memcpy(recv.at(n * r), own.at(0), static_cast<std::size_t>(n) * dtype_size(d));
            c.all_gather(shard_of(recv.tensor(), r, w), recv.tensor());
          } else {
            c.all_gather(own.tensor(), recv.tensor());
          }
          return recv;
        };
        const auto [want, want_stats] = local_result(run);
        mpi.reset_stats();
        const HostBuf got = run(mpi, me());
        expect_same_bits(got, want, name(in_place ? "all_gather in place" : "all_gather", d, ReduceOp::sum, n));
        EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
      }
    }
}

TEST(COLLECTIVES_SUITE, BroadcastFromEveryRootAndBarrierMatchLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  for (DType d : kDtypes)
    for (std::int64_t n : {0, 3, 999})
      for (int root = 0; root < world(); ++root) {
        const auto run = [&](Communicator& c, int r) {
          HostBuf b = filled(d, r, n);
          c.broadcast(b.tensor(), root);
          c.barrier();
          return b;
        };
        const auto [want, want_stats] = local_result(run);
        mpi.reset_stats();
        const HostBuf got = run(mpi, me());
        expect_same_bits(got, want, fmt::format("broadcast {} n={} root {}", dtype_name(d), n, root));
        EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
        EXPECT_EQ(mpi.stats().calls, want_stats.calls);
      }
}

// 16-bit sums round once, after fp32 accumulation in rank order: 1 + W·2^-9 in bf16 (8 bits of
// mantissa) keeps the small terms only when they are accumulated in fp32 first.
TEST(COLLECTIVES_SUITE, AllToAllMatchesLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  for (DType d : {DType::int32, DType::fp32, DType::bf16})
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}}) {
      const auto [want, want_stats] = local_result([&](Communicator& c, int r) {
        HostBuf send = filled(d, r, n * world()), recv(d, n * world());
        c.all_to_all(send.tensor(), recv.tensor());
        return recv;
      });
      HostBuf send = filled(d, me(), n * world()), got(d, n * world());
      mpi.reset_stats();
      mpi.all_to_all(send.tensor(), got.tensor());
      expect_same_bits(got, want, fmt::format("all_to_all {} n={} W={}", dtype_name(d), n, world()));
      EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
    }
}

// The variable all-to-all: how many elements rank s sends rank d (zeros included: in "silent" the
// last rank sends nothing and rank 0 receives nothing), and element k of that block.
std::int64_t a2av_count(int pattern, int s, int d, int w) {
  switch (pattern) {
    case 0:
      return ((s * 3 + d * 5 + 1) % 4) * (1 + s) + (s == d ? 2 : 0) * (d % 2);
    case 1:
      return (s == w - 1 || d == 0) ? 0 : 1 + s + 2 * d;
    case 2:
      return 0;
    default:
      return 1000 + s + d;  // blocks of a few KB
  }
}
double a2av_element(int s, int d, std::int64_t k) { return s * 1000 + d * 100 + static_cast<double>(k % 97); }

// Every process checks its recv against the blocks the formula gives (block i = rank i's block
// `me`), the untouched tail past them, the counters, and exchange_counts' answer.
TEST(COLLECTIVES_SUITE, AllToAllVMatchesTheFormula) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  const int w = world(), r = me();
  for (const DType d : {DType::fp32, DType::bf16, DType::int32}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      const std::string what = fmt::format("all_to_all_v {} pattern {} W={} rank {}", dtype_name(d), pattern, w, r);
      std::vector<std::int64_t> sc, rc;
      for (int q = 0; q < w; ++q) {
        sc.push_back(a2av_count(pattern, r, q, w));
        rc.push_back(a2av_count(pattern, q, r, w));
      }
      EXPECT_EQ(mpi.exchange_counts(sc), rc) << what;
      std::int64_t ns = 0, nr = 0;
      for (int q = 0; q < w; ++q) ns += sc[static_cast<std::size_t>(q)], nr += rc[static_cast<std::size_t>(q)];
      HostBuf send(d, ns + 2), recv(d, nr + 2), want(d, nr + 2);
      std::int64_t at = 0;
      for (int q = 0; q < w; ++q)
        for (std::int64_t k = 0; k < sc[static_cast<std::size_t>(q)]; ++k) send.set(at++, a2av_element(r, q, k));
      send.set(at++, 5), send.set(at, 5);
      for (std::int64_t i = 0; i < recv.n; ++i) recv.set(i, -7);
      at = 0;
      for (int q = 0; q < w; ++q)
        for (std::int64_t k = 0; k < rc[static_cast<std::size_t>(q)]; ++k) want.set(at++, a2av_element(q, r, k));
      want.set(at++, -7), want.set(at, -7);
      const CommStats before = mpi.stats();
      mpi.all_to_all_v(send.tensor(), sc, recv.tensor(), rc);
      expect_same_bits(recv, want, what);
      const CommStats delta = mpi.stats() - before;
      EXPECT_EQ(delta.call_count(CollectiveKind::all_to_all_v), 1u) << what;
      EXPECT_EQ(delta.bytes_sent(CollectiveKind::all_to_all_v),
                static_cast<std::uint64_t>(ns - sc[static_cast<std::size_t>(r)]) * dtype_size(d) * (w > 1 ? 1u : 0u))
          << what;
    }
  }
}

// The 1-bit optimizers' compressed all-reduce (built on all_to_all and all_gather, so every backend
// has it): three calls in a row, the error-feedback state carried between them, the same bits as
// the local backend.
TEST(COLLECTIVES_SUITE, CompressedAllReduceMatchesLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  const std::int64_t n = 8 * 24 * world();
  auto run = [&](Communicator& c, int r) {
    HostBuf we(DType::fp32, n), se(DType::fp32, n / world()), out(DType::fp32, 3 * n + n + n / world());
    for (std::int64_t i = 0; i < n; ++i) we.set(i, 0.0);
    for (std::int64_t i = 0; i < n / world(); ++i) se.set(i, 0.0);
    for (int k = 0; k < 3; ++k) {
      HostBuf x(DType::fp32, n);
      for (std::int64_t i = 0; i < n; ++i) x.set(i, value(DType::fp32, r + 7 * k, i));
      c.compressed_all_reduce(x.tensor(), we.tensor(), se.tensor());
      for (std::int64_t i = 0; i < n; ++i) out.set(k * n + i, x.get(i));
    }
    for (std::int64_t i = 0; i < n; ++i) out.set(3 * n + i, we.get(i));
    for (std::int64_t i = 0; i < n / world(); ++i) out.set(4 * n + i, se.get(i));
    return out;
  };
  const auto [want, want_stats] = local_result(run);
  mpi.reset_stats();
  const HostBuf got = run(mpi, me());
  expect_same_bits(got, want, fmt::format("compressed_all_reduce W={}", world()));
  EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
}

TEST(COLLECTIVES_SUITE, SixteenBitSumsRoundOnce) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  HostBuf b(DType::bf16, 1);
  b.set(0, me() == 0 ? 1.0 : 1.0 / 512);
  mpi.all_reduce(b.tensor(), ReduceOp::sum);
  HostBuf want(DType::bf16, 1);
  want.set(0, static_cast<double>(1.0f + static_cast<float>(world() - 1) / 512.0f));
  EXPECT_EQ(b.bits(0), want.bits(0)) << b.get(0);
}

// ---- split: MPI_Comm_split children against the members the test enumerates ----

struct SplitPattern {
  const char* name;
  std::function<std::pair<int, int>(int r, int w)> color_key;  // (color, key) of rank r of w
};

const SplitPattern kSplitPatterns[] = {
    {"pairs",
     [](int r, int) {
       return std::pair{r / 2, r};
     }},
    {"one group, keys reverse the ranks",
     [](int r, int) {
       return std::pair{0, -r};
     }},
    {"sizes 1 and w-1",
     [](int r, int) {
       return std::pair{r == 0 ? 3 : 9, 0};
     }},
    {"even/odd, reversed inside",
     [](int r, int w) {
       return std::pair{r % 2, w - r};
     }},
    {"every rank alone",
     [](int r, int) {
       return std::pair{r, 0};
     }},
};

// The world ranks of `color`, sorted by (key, rank).
std::vector<int> split_members(const SplitPattern& p, int w, int color) {
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

std::uint64_t ring_shard_bytes(std::uint64_t n_bytes, int w) { return w == 1 ? 0 : static_cast<std::uint64_t>(w - 1) * n_bytes / w; }

// Each child's rank and size, and an all_reduce, all_gather and all_to_all in it, against values
// the test computes from the member list; the child's counters count its own three collectives,
// the parent's the split's exchange only.
TEST(COLLECTIVES_SUITE, SplitGroupsHoldTheEnumeratedMembers) {
  const int w = world();
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  constexpr std::int64_t n = 3;
  for (const SplitPattern& p : kSplitPatterns) {
    SCOPED_TRACE(fmt::format("{} W={}", p.name, w));
    const auto [color, key] = p.color_key(me(), w);
    const std::vector<int> m = split_members(p, w, color);
    const int cw = static_cast<int>(m.size());
    const CommStats before = mpi.stats();
    std::unique_ptr<Communicator> child = mpi.split(color, key);
    const CommStats exchange = mpi.stats() - before;
    EXPECT_EQ(exchange.call_count(CollectiveKind::all_gather), 1u);
    EXPECT_EQ(exchange.total_calls(), 1u);
    EXPECT_EQ(exchange.total_bytes_sent(), ring_shard_bytes(8u * static_cast<std::uint64_t>(w), w));
    EXPECT_EQ(child->backend(), kBackend);
    ASSERT_EQ(child->world_size(), cw);
    ASSERT_EQ(child->rank(), std::find(m.begin(), m.end(), me()) - m.begin());
    const int cr = child->rank();

    HostBuf sum(DType::fp32, n);
    for (std::int64_t i = 0; i < n; ++i) sum.set(i, (me() + 1) * 10 + i);
    child->all_reduce(sum.tensor(), ReduceOp::sum);
    for (std::int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q : m) want += (q + 1) * 10 + i;
      EXPECT_EQ(sum.get(i), want) << "all_reduce element " << i;
    }
    HostBuf mine(DType::fp32, n), all(DType::fp32, n * cw);
    for (std::int64_t i = 0; i < n; ++i) mine.set(i, me() * 100 + i);
    child->all_gather(mine.tensor(), all.tensor());
    HostBuf send(DType::fp32, n * cw), recv(DType::fp32, n * cw);
    for (int j = 0; j < cw; ++j)
      for (std::int64_t i = 0; i < n; ++i) send.set(j * n + i, me() * 1000 + j * 10 + i);
    child->all_to_all(send.tensor(), recv.tensor());
    for (int j = 0; j < cw; ++j)
      for (std::int64_t i = 0; i < n; ++i) {
        const int q = m[static_cast<std::size_t>(j)];
        EXPECT_EQ(all.get(j * n + i), q * 100 + i) << "all_gather shard " << j;
        EXPECT_EQ(recv.get(j * n + i), q * 1000 + cr * 10 + i) << "all_to_all shard " << j;
      }
    const std::uint64_t bytes = static_cast<std::uint64_t>(n) * 4;
    EXPECT_EQ(child->stats().total_calls(), 3u);
    EXPECT_EQ(child->stats().bytes_sent(CollectiveKind::all_reduce), cw == 1 ? 0 : 2 * static_cast<std::uint64_t>(cw - 1) * bytes / cw);
    EXPECT_EQ(child->stats().bytes_sent(CollectiveKind::all_gather), ring_shard_bytes(bytes * cw, cw));
    EXPECT_EQ(child->stats().bytes_sent(CollectiveKind::all_to_all), ring_shard_bytes(bytes * cw, cw));
  }
}

// The child works on its own duplicates: it outlives the communicator it was split from, and
// two children of one parent used in different orders by different ranks do not mix.
TEST(COLLECTIVES_SUITE, SplitChildrenOutliveTheirParentAndDoNotMix) {
  const int w = world();
  std::unique_ptr<Communicator> parity, everyone;
  {
    const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
    parity = mpi.split(me() % 2, me());
    everyone = mpi.split(0, -me());
  }
  for (int round = 0; round < 10; ++round) {
    HostBuf a(DType::fp32, 1), b(DType::fp32, 1);
    a.set(0, me() + round);
    b.set(0, 2 * me() + round);
    // Even ranks: everyone, then their parity group; odd ranks the other way round (their parity
    // group completes without the even ranks, then they join everyone).
    if (me() % 2 == 0) {
      everyone->all_reduce(b.tensor(), ReduceOp::sum);
      parity->all_reduce(a.tensor(), ReduceOp::sum);
    } else {
      parity->all_reduce(a.tensor(), ReduceOp::max);  // a different op in the other group
      everyone->all_reduce(b.tensor(), ReduceOp::sum);
    }
    double want_a = me() % 2 == 0 ? 0 : -1e30, want_b = 0;
    for (int q = 0; q < w; ++q) {
      want_b += 2 * q + round;
      if (q % 2 != me() % 2) continue;
      want_a = me() % 2 == 0 ? want_a + q + round : std::max(want_a, static_cast<double>(q + round));
    }
    EXPECT_EQ(a.get(0), want_a) << "round " << round;
    EXPECT_EQ(b.get(0), want_b) << "round " << round;
  }
  EXPECT_EQ(everyone->rank(), w - 1 - me());
}

// The device mesh over MPI: for every pp x tp x sp x ep that divides the world (ep dividing the
// data-parallel size), each group gathers its members' world ranks, which must be the ranks the
// test enumerates (same coordinates but one; the data group: same pp and tp; the expert-parallel
// group: same pp, sp, tp and dp / ep; the expert-data group: same pp, tp and dp % ep).
TEST(COLLECTIVES_SUITE, MeshGroupsHoldTheEnumeratedMembers) {
  const int w = world();
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  std::vector<std::array<int, 4>> shapes;  // {pp, tp, sp, ep}, each dividing what is left of the world
  for (int pp = 1; pp <= w; ++pp)
    for (int tp = 1; w % pp == 0 && tp <= w / pp; ++tp)
      for (int sp = 1; (w / pp) % tp == 0 && sp <= w / pp / tp; ++sp)
        if ((w / pp / tp) % sp == 0)
          for (int ep = 1; ep <= w / pp / tp / sp; ++ep)
            if ((w / pp / tp / sp) % ep == 0) shapes.push_back({pp, tp, sp, ep});
  for (const auto& [pp, tp, sp, ep] : shapes) {
    SCOPED_TRACE(fmt::format("pp {} tp {} sp {} ep {} W={}", pp, tp, sp, ep, w));
    const MeshShape shape = make_mesh_shape(w, tp, sp, pp, ep);
    MeshGroups g = make_mesh_groups(mpi, shape);
    // Coordinates by counting, tp innermost, pp outermost; the data-parallel one as (edp, ep).
    std::vector<std::array<int, 5>> coords;  // {tp, sp, ep, edp, pp}
    for (int p = 0; p < pp; ++p)
      for (int e2 = 0; e2 < w / (pp * tp * sp * ep); ++e2)
        for (int e = 0; e < ep; ++e)
          for (int s = 0; s < sp; ++s)
            for (int t = 0; t < tp; ++t) coords.push_back({t, s, e, e2, p});
    const auto& mine = coords[static_cast<std::size_t>(me())];
    Communicator* groups[] = {g.tp.get(), g.sp.get(), g.dp.get(), g.data.get(), g.pp.get(), g.ep.get(), g.expert_data.get()};
    for (int k = 0; k < 7; ++k) {
      std::vector<int> want;
      for (int q = 0; q < w; ++q) {
        const auto& c = coords[static_cast<std::size_t>(q)];
        const bool tp_same = c[0] == mine[0], sp_same = c[1] == mine[1], ep_same = c[2] == mine[2], edp_same = c[3] == mine[3],
                   pp_same = c[4] == mine[4];
        const bool dp_same = ep_same && edp_same;
        const bool member = k == 0   ? pp_same && dp_same && sp_same
                            : k == 1 ? pp_same && dp_same && tp_same
                            : k == 2 ? pp_same && sp_same && tp_same
                            : k == 3 ? pp_same && tp_same
                            : k == 4 ? dp_same && sp_same && tp_same
                            : k == 5 ? pp_same && sp_same && tp_same && edp_same
                                     : pp_same && tp_same && ep_same;
        if (member) want.push_back(q);
      }
      Communicator& c = *groups[k];
      HostBuf one(DType::int32, 1), all(DType::int32, c.world_size());
      one.set(0, me());
      c.all_gather(one.tensor(), all.tensor());
      std::vector<int> got;
      for (int j = 0; j < c.world_size(); ++j) got.push_back(static_cast<int>(all.get(j)));
      EXPECT_EQ(got, want) << "group " << k;
    }
    EXPECT_EQ(g.ep->rank(), mine[2]);
    EXPECT_EQ(g.expert_data->rank(), mine[3] * sp + mine[1]);
  }
}

// ---- point-to-point: only the two ranks of a pair take part ----

// A ring (rank r sends to r+1, receives from r−1; even ranks send first, so blocking sends cannot
// wait on each other) in every dtype: the bits rank r−1 wrote, and the byte counters and numbers
// of the local backend running the same ring.
TEST(COLLECTIVES_SUITE, PointToPointRingMatchesLocal) {
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  const int w = world();
  if (w < 2) GTEST_SKIP() << "needs 2 processes";
  for (DType d : kDtypes)
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001}}) {
      const auto run = [&](Communicator& c, int r) {
        const int next = (r + 1) % w, prev = (r + w - 1) % w;
        HostBuf out = filled(d, r, n), in(d, n);
        if (r % 2 == 0) {
          c.send(out.tensor(), next);
          c.recv(in.tensor(), prev);
        } else {
          c.recv(in.tensor(), prev);
          c.send(out.tensor(), next);
        }
        return in;
      };
      const auto [want, want_stats] = local_result(run);
      const std::uint64_t seq = mpi.sequence();
      mpi.reset_stats();
      const HostBuf got = run(mpi, me());
      const std::string what = fmt::format("ring {} n={} W={}", dtype_name(d), n, w);
      expect_same_bits(got, filled(d, (me() + w - 1) % w, n), what);
      expect_same_bits(got, want, what);
      EXPECT_EQ(mpi.stats().bytes, want_stats.bytes) << what;
      EXPECT_EQ(mpi.stats().calls, want_stats.calls) << what;
      EXPECT_EQ(mpi.stats().bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * dtype_size(d)) << what;
      EXPECT_EQ(mpi.stats().bytes_sent(CollectiveKind::recv), 0u) << what;
      EXPECT_EQ(mpi.sequence(), seq) << "point-to-point calls are not collectives";
    }
  // The pair's order: rank 1 takes two messages from rank 0, then (W > 2) two from rank 2, while
  // a collective of everyone follows and still matches.
  HostBuf a(DType::fp32, 3), b(DType::fp32, 3);
  if (me() == 0 || me() == 2) {
    HostBuf first = filled(DType::fp32, me() + 10, 3), second = filled(DType::fp32, me() + 20, 3);
    mpi.send(first.tensor(), 1);
    mpi.send(second.tensor(), 1);
  } else if (me() == 1) {
    const std::uint64_t before = mpi.recvs_from(0);
    for (int from : {0, 2}) {
      if (from >= w) continue;
      mpi.recv(a.tensor(), from);
      mpi.recv(b.tensor(), from);
      expect_same_bits(a, filled(DType::fp32, from + 10, 3), fmt::format("first from {}", from));
      expect_same_bits(b, filled(DType::fp32, from + 20, 3), fmt::format("second from {}", from));
    }
    EXPECT_EQ(mpi.recvs_from(0) - before, 2u);
  }
  mpi.barrier();
}

// The pipeline group of a mesh of two stages: stage 0 sends an activation forward, stage 1 a
// gradient back, over the split child's own ranks.
TEST(COLLECTIVES_SUITE, PointToPointOnThePipelineGroup) {
  const int w = world();
  if (w % 2 != 0) GTEST_SKIP() << "needs an even number of processes";
  const auto world_comm = make_world();
  Communicator& mpi = *world_comm;
  MeshGroups g = make_mesh_groups(mpi, make_mesh_shape(w, 1, 1, 2));
  Communicator& pipe = *g.pp;
  ASSERT_EQ(pipe.world_size(), 2);
  ASSERT_EQ(pipe.rank(), me() / (w / 2));
  const int partner = (me() + w / 2) % w;  // the same data-parallel rank in the other stage
  HostBuf act = filled(DType::bf16, me(), 17), grad(DType::bf16, 17);
  if (pipe.rank() == 0) {
    pipe.send(act.tensor(), 1);
    pipe.recv(grad.tensor(), 1);
  } else {
    pipe.recv(grad.tensor(), 0);
    pipe.send(act.tensor(), 0);
  }
  expect_same_bits(grad, filled(DType::bf16, partner, 17), "from the other stage");
  EXPECT_EQ(pipe.stats().bytes_sent(CollectiveKind::send), 17u * 2);
}

// send_recv: every rank's batch is {send to next, recv from previous}, the exchange that blocking
// send/recv cannot do without ordering the ranks; every dtype and size gives the bits rank r−1
// wrote and the local backend's counters. Then a batch of 4 (both neighbours; with W = 2 one peer,
// two ops each way in batch order), recvs listed first on odd ranks.
TEST(COLLECTIVES_SUITE, SendRecvRingAndBothNeighboursMatchLocal) {
  const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
  const int w = world();
  if (w < 2) GTEST_SKIP() << "needs 2 processes";
  for (DType d : kDtypes)
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1001}}) {
      const auto run = [&](Communicator& c, int r) {
        HostBuf out = filled(d, r, n), in(d, n);
        c.send_recv(std::vector<PointToPointOp>{{true, out.tensor(), (r + 1) % w}, {false, in.tensor(), (r + w - 1) % w}});
        return in;
      };
      const auto [want, want_stats] = local_result(run);
      mpi.reset_stats();
      const HostBuf got = run(mpi, me());
      const std::string what = fmt::format("send_recv ring {} n={} W={}", dtype_name(d), n, w);
      expect_same_bits(got, filled(d, (me() + w - 1) % w, n), what);
      expect_same_bits(got, want, what);
      EXPECT_EQ(mpi.stats().bytes, want_stats.bytes) << what;
      EXPECT_EQ(mpi.stats().calls, want_stats.calls) << what;
      EXPECT_EQ(mpi.stats().bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * dtype_size(d)) << what;
      EXPECT_EQ(mpi.sequence(), 0u) << "point-to-point calls are not collectives";
    }
  constexpr std::int64_t n = 257;
  const auto four = [&](Communicator& c, int r, HostBuf& from_next) {
    const int next = (r + 1) % w, prev = (r + w - 1) % w;
    HostBuf to_next = filled(DType::fp32, r + 100, n), to_prev = filled(DType::bf16, r + 200, n), from_prev(DType::fp32, n);
    from_next = HostBuf(DType::bf16, n);
    const PointToPointOp s1{true, to_next.tensor(), next}, s2{true, to_prev.tensor(), prev};
    const PointToPointOp r1{false, from_prev.tensor(), prev}, r2{false, from_next.tensor(), next};
    c.send_recv(r % 2 == 0 ? std::vector<PointToPointOp>{s1, s2, r1, r2} : std::vector<PointToPointOp>{r1, r2, s1, s2});
    return from_prev;
  };
  const auto [want, want_stats] = local_result([&](Communicator& c, int r) {
    HostBuf unused;
    return four(c, r, unused);
  });
  mpi.reset_stats();
  HostBuf from_next;
  const HostBuf from_prev = four(mpi, me(), from_next);
  expect_same_bits(from_prev, filled(DType::fp32, (me() + w - 1) % w + 100, n), "4 ops: from the previous rank");
  expect_same_bits(from_prev, want, "4 ops: the local backend's");
  expect_same_bits(from_next, filled(DType::bf16, (me() + 1) % w + 200, n), "4 ops: from the next rank");
  EXPECT_EQ(mpi.stats().bytes, want_stats.bytes);
  EXPECT_EQ(mpi.stats().calls, want_stats.calls);
  EXPECT_EQ(mpi.stats().call_count(CollectiveKind::send), 2u);
  EXPECT_EQ(mpi.stats().call_count(CollectiveKind::recv), 2u);
  EXPECT_EQ(mpi.stats().bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * (4 + 2));
  mpi.barrier();
}

// Ranks 0 and 1 (the others wait): rank 0's batch sends two messages to rank 1 and receives one,
// then it sends a third standalone; rank 1 receives the first standalone, then the second and the
// third and sends its own in one batch: the pair's order counts batched and standalone calls
// alike. Then rank 0's batch {send, recv} against rank 1's standalone recv, then send: the batch's
// send must not wait for its recv (whose match rank 1 posts only after receiving).
TEST(COLLECTIVES_SUITE, SendRecvKeepsThePairsOrderAndNeverHoldsAnOpBack) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
  constexpr std::int64_t n = 9;
  if (me() == 0) {
    HostBuf a = filled(DType::fp32, 1, n), b = filled(DType::fp32, 2, n), third = filled(DType::fp32, 3, n), x(DType::fp32, n);
    mpi.send_recv(std::vector<PointToPointOp>{{true, a.tensor(), 1}, {false, x.tensor(), 1}, {true, b.tensor(), 1}});
    mpi.send(third.tensor(), 1);
    expect_same_bits(x, filled(DType::fp32, 9, n), "rank 1's send into rank 0's batch");
    EXPECT_EQ(mpi.sends_to(1), 3u);
    HostBuf out = filled(DType::int32, 4, n), in(DType::int32, n);
    mpi.send_recv(std::vector<PointToPointOp>{{true, out.tensor(), 1}, {false, in.tensor(), 1}});
    expect_same_bits(in, filled(DType::int32, 4, n), "rank 0's message, back from rank 1");
  } else if (me() == 1) {
    std::vector<HostBuf> got(3, HostBuf(DType::fp32, n));
    HostBuf mine = filled(DType::fp32, 9, n);
    mpi.recv(got[0].tensor(), 0);
    mpi.send_recv(std::vector<PointToPointOp>{{false, got[1].tensor(), 0}, {true, mine.tensor(), 0}, {false, got[2].tensor(), 0}});
    for (int k = 0; k < 3; ++k) expect_same_bits(got[static_cast<std::size_t>(k)], filled(DType::fp32, k + 1, n), fmt::format("message {}", k + 1));
    EXPECT_EQ(mpi.recvs_from(0), 3u);
    HostBuf echo(DType::int32, n);
    mpi.recv(echo.tensor(), 0);
    mpi.send(echo.tensor(), 0);
  }
  mpi.barrier();
}

// start_send_recv returns before the peer has posted: rank 0 starts its batch with rank 1 and then
// meets rank 1 in a barrier, which rank 1 reaches before posting anything; a start that waited for
// its peer would leave both waiting (a timeout). Then requests waited for out of order keep the
// pair's order.
TEST(COLLECTIVES_SUITE, StartSendRecvReturnsBeforeThePeerPostsAndKeepsThePairsOrder) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
  constexpr std::int64_t n = 6;
  if (me() == 0) {
    HostBuf out = filled(DType::fp32, 1, n), in(DType::fp32, n);
    PointToPointRequest request = mpi.start_send_recv(std::vector<PointToPointOp>{{true, out.tensor(), 1}, {false, in.tensor(), 1}});
    EXPECT_TRUE(request.pending());
    mpi.barrier();
    request.wait();
    expect_same_bits(in, filled(DType::fp32, 2, n), "rank 1's message");
    std::vector<HostBuf> msgs;
    for (int k = 0; k < 3; ++k) msgs.push_back(filled(DType::int32, 10 + k, n));
    std::vector<PointToPointRequest> sends;
    for (int k = 0; k < 3; ++k) sends.push_back(mpi.start_send_recv(std::vector<PointToPointOp>{{true, msgs[static_cast<std::size_t>(k)].tensor(), 1}}));
    for (int k = 2; k >= 0; --k) sends[static_cast<std::size_t>(k)].wait();
    EXPECT_EQ(mpi.stats().call_count(CollectiveKind::send), 4u);
  } else if (me() == 1) {
    mpi.barrier();
    HostBuf out = filled(DType::fp32, 2, n), in(DType::fp32, n);
    mpi.send_recv(std::vector<PointToPointOp>{{false, in.tensor(), 0}, {true, out.tensor(), 0}});
    expect_same_bits(in, filled(DType::fp32, 1, n), "rank 0's message");
    std::vector<HostBuf> got(3, HostBuf(DType::int32, n));
    std::vector<PointToPointRequest> recvs;
    for (int k = 0; k < 3; ++k) recvs.push_back(mpi.start_send_recv(std::vector<PointToPointOp>{{false, got[static_cast<std::size_t>(k)].tensor(), 0}}));
    for (int k : {1, 2, 0}) recvs[static_cast<std::size_t>(k)].wait();
    for (int k = 0; k < 3; ++k) expect_same_bits(got[static_cast<std::size_t>(k)], filled(DType::int32, 10 + k, n), fmt::format("message {}", k + 1));
  } else {
    mpi.barrier();
  }
  mpi.barrier();
}

// A started request whose peer never posts fails in wait() within the timeout, naming the op and
// both ranks.
TEST(COLLECTIVES_SUITE, StartedRequestTimesOutInWaitNamingBothRanks) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  std::string err;
  {
    const auto world_comm = make_world(std::chrono::milliseconds(1500));
  Communicator& mpi = *world_comm;
    if (me() == 0) {
      HostBuf buf(DType::fp32, 5);
      PointToPointRequest request = mpi.start_send_recv(std::vector<PointToPointOp>{{false, buf.tensor(), 1}});
      try {
        request.wait();
      } catch (const Error& e) {
        err = e.what();
      }
    } else {
      linger();
    }
  }
  if (me() == 0) {
    EXPECT_NE(err.find("recv #1 from rank 1 on rank 0 (fp32, 5 elements) timed out after 1500 ms"), std::string::npos) << err;
    EXPECT_NE(err.find("rank 1 did not post the matching send #1 from rank 1 to rank 0"), std::string::npos) << err;
  }
  process_barrier();
}

// A recv in a batch of another size or dtype than its send fails on both ranks of the pair naming
// both calls, while the batches' other ops agree. A rank without a partner (W = 3) takes no part.
TEST(COLLECTIVES_SUITE, SendRecvMismatchFailsOnBothRanksNamingBothCalls) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  {
    const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
    const int pair = me() / 2, sender = 2 * pair, receiver = sender + 1;
    if (receiver < world()) {
      const DType recv_dtype = pair == 0 ? DType::fp32 : DType::bf16;
      const std::int64_t recv_n = pair == 0 ? 6 : 5;
      HostBuf back(DType::int32, 3);
      try {
        if (me() == sender) {
          HostBuf b(DType::fp32, 5);
          mpi.send_recv(std::vector<PointToPointOp>{{true, b.tensor(), receiver}, {false, back.tensor(), receiver}});
        } else {
          HostBuf b(recv_dtype, recv_n);
          mpi.send_recv(std::vector<PointToPointOp>{{true, back.tensor(), sender}, {false, b.tensor(), sender}});
        }
        ADD_FAILURE() << "a mismatched send_recv succeeded";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("point-to-point mismatch"), std::string::npos) << m;
        EXPECT_NE(m.find(fmt::format("rank {} called send #1 from rank {} to rank {} (fp32, 5 elements)", sender, sender, receiver)),
                  std::string::npos)
            << m;
        EXPECT_NE(m.find(fmt::format("rank {} called recv #1 from rank {} on rank {} ({}, {} elements)", receiver, sender, receiver,
                                     dtype_name(recv_dtype), recv_n)),
                  std::string::npos)
            << m;
      }
      EXPECT_THROW(mpi.barrier(), Error) << "the communicator is unusable after the failure";
    }
  }
  process_barrier();
}

// Rank 1 expects one element more from rank 0 than rank 0 sends: both fail naming both ranks and
// both counts, having exchanged no data with each other; the other ranks' blocks still arrive.
TEST(COLLECTIVES_SUITE, AllToAllVMismatchFailsOnBothRanksNamingBothCounts) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  {
    const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
    const int w = world(), r = me();
    std::vector<std::int64_t> sc(static_cast<std::size_t>(w), 2), rc(static_cast<std::size_t>(w), 2);
    if (r == 1) rc[0] = 3;
    HostBuf send(DType::int32, 2 * w), recv(DType::int32, 2 * w + 1);
    for (int q = 0; q < w; ++q) send.set(2 * q, r * 10 + q), send.set(2 * q + 1, r * 10 + q);
    try {
      mpi.all_to_all_v(send.tensor(), sc, recv.tensor(), rc);
      EXPECT_GE(r, 2) << "a mismatched all_to_all_v succeeded on rank " << r;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_LT(r, 2) << m;
      EXPECT_NE(m.find("all_to_all_v #1: rank 0 sends 2 elements to rank 1 (its send_counts[1]) but rank 1 expects 3 from rank 0 (its "
                       "recv_counts[0])"),
                std::string::npos)
          << m;
      EXPECT_THROW(mpi.barrier(), Error) << "the communicator is unusable after the failure";
    }
    // Every rank's blocks from the ranks it agrees with (all but the failed pair) arrived.
    for (int q = 0; q < w; ++q) {
      if ((r == 0 && q == 1) || (r == 1 && q == 0)) continue;
      const std::int64_t at = (r == 1 && q > 0) ? 2 * q + 1 : 2 * q;
      EXPECT_EQ(recv.get(at), q * 10 + r) << "rank " << r << " block from " << q;
    }
  }
  process_barrier();
}

TEST(COLLECTIVES_SUITE, MismatchFailsOnEveryRankNamingBothCalls) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
  HostBuf b(DType::fp32, me() == 0 ? 5 : 6);
  try {
    mpi.all_reduce(b.tensor(), ReduceOp::sum);
    ADD_FAILURE() << "a mismatched all_reduce succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("collective mismatch"), std::string::npos) << m;
    EXPECT_NE(m.find("5 elements"), std::string::npos) << m;
    EXPECT_NE(m.find("6 elements"), std::string::npos) << m;
  }
  // The group is unusable afterwards: every call fails with the first message.
  EXPECT_THROW(mpi.barrier(), Error);
}

// A recv of another size than its send fails on both ranks of the pair, naming both calls, before
// any data moves; with 4 processes the second pair disagrees on the dtype. A rank without a
// partner (W = 3) takes no part.
TEST(COLLECTIVES_SUITE, PointToPointMismatchFailsOnBothRanksNamingBothCalls) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  {
    const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
    const int pair = me() / 2, sender = 2 * pair, receiver = sender + 1;
    if (receiver < world()) {
      const DType recv_dtype = pair == 0 ? DType::fp32 : DType::bf16;
      const std::int64_t recv_n = pair == 0 ? 6 : 5;
      try {
        if (me() == sender) {
          HostBuf b(DType::fp32, 5);
          mpi.send(b.tensor(), receiver);
        } else {
          HostBuf b(recv_dtype, recv_n);
          mpi.recv(b.tensor(), sender);
        }
        ADD_FAILURE() << "a mismatched send/recv succeeded";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("point-to-point mismatch"), std::string::npos) << m;
        EXPECT_NE(m.find(fmt::format("rank {} called send #1 from rank {} to rank {} (fp32, 5 elements)", sender, sender, receiver)),
                  std::string::npos)
            << m;
        EXPECT_NE(m.find(fmt::format("rank {} called recv #1 from rank {} on rank {} ({}, {} elements)", receiver, sender, receiver,
                                     dtype_name(recv_dtype), recv_n)),
                  std::string::npos)
            << m;
        EXPECT_NE(m.find("Fix:"), std::string::npos) << m;
      }
      EXPECT_THROW(mpi.barrier(), Error) << "the communicator is unusable after the failure";
    }
  }
  process_barrier();
}

// Rank 1 never sends what rank 0 receives: rank 0 fails within the timeout naming rank 1, the
// call it owes and the last collective it reached.
TEST(COLLECTIVES_SUITE, PointToPointPeerThatNeverPostsIsNamedWithinTheTimeout) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  {
    const auto world_comm = make_world(std::chrono::milliseconds(1500));
  Communicator& mpi = *world_comm;
    mpi.barrier();  // #1
    if (me() == 0) {
      HostBuf b(DType::int32, 4);
      try {
        mpi.recv(b.tensor(), 1);
        ADD_FAILURE() << "a recv without its send succeeded";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("recv #1 from rank 1 on rank 0 (int32, 4 elements) timed out after 1500 ms"), std::string::npos) << m;
        EXPECT_NE(m.find("rank 1 did not post the matching send #1 from rank 1 to rank 0"), std::string::npos) << m;
        EXPECT_NE(m.find("rank 1 last reached barrier #1"), std::string::npos) << m;
      }
    } else {
      linger();
    }
  }
  process_barrier();
}

// Rank 0's batch sends to rank 1 and receives from it; rank 1 only receives. The send completes,
// and rank 0 fails within the timeout naming rank 1, the send it owes and the last collective it
// reached.
TEST(COLLECTIVES_SUITE, SendRecvPeerThatNeverPostsIsNamedWithinTheTimeout) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  {
    const auto world_comm = make_world(std::chrono::milliseconds(1500));
  Communicator& mpi = *world_comm;
    mpi.barrier();  // #1
    HostBuf out = filled(DType::int32, 0, 4), in(DType::int32, 4);
    if (me() == 0) {
      try {
        mpi.send_recv(std::vector<PointToPointOp>{{true, out.tensor(), 1}, {false, in.tensor(), 1}});
        ADD_FAILURE() << "a batch whose recv has no send succeeded";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("recv #1 from rank 1 on rank 0 (int32, 4 elements) timed out after 1500 ms"), std::string::npos) << m;
        EXPECT_NE(m.find("rank 1 did not post the matching send #1 from rank 1 to rank 0"), std::string::npos) << m;
        EXPECT_NE(m.find("rank 1 last reached barrier #1"), std::string::npos) << m;
      }
    } else if (me() == 1) {
      mpi.recv(in.tensor(), 0);
      expect_same_bits(in, out, "the batch's send");
    }
    if (me() != 0) linger();
  }
  process_barrier();
}

// Rank W−1 never reaches the barrier: the others fail within the timeout, naming it and the last
// collective it reached. (Last: the group is left unusable, and the processes meet again on
// MPI_COMM_WORLD.)
TEST(COLLECTIVES_SUITE, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const int late = world() - 1;
  {
    const auto world_comm = make_world(std::chrono::milliseconds(1500));
  Communicator& mpi = *world_comm;
    mpi.barrier();  // #1: every rank
    if (me() != late) {
      try {
        mpi.barrier();  // #2: rank `late` never comes
        ADD_FAILURE() << "a barrier without rank " << late << " succeeded";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(fmt::format("rank(s) {} of {} did not reach it", late, world())), std::string::npos) << m;
        EXPECT_NE(m.find(fmt::format("rank {} last reached barrier #1", late)), std::string::npos) << m;
        EXPECT_NE(m.find("timed out after 1500 ms"), std::string::npos) << m;
      }
    } else {
      linger();
    }
  }
  process_barrier();
}

// A negative color is refused where it is passed; the other ranks, waiting in the split's exchange,
// name that rank within the timeout. (Last but one: the group is left unusable.)
TEST(COLLECTIVES_SUITE, SplitWithANegativeColorFailsEverywhere) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const int bad = world() - 1;
  {
    const auto world_comm = make_world(std::chrono::milliseconds(1500));
  Communicator& mpi = *world_comm;
    try {
      (void)mpi.split(me() == bad ? -1 : 0, 0);
      ADD_FAILURE() << "a split with a negative color succeeded";
    } catch (const Error& e) {
      const std::string m = e.what();
      if (me() == bad) {
        EXPECT_NE(m.find("color -1 is negative"), std::string::npos) << m;
      } else {
        EXPECT_NE(m.find(fmt::format("rank(s) {} of {} did not reach it", bad, world())), std::string::npos) << m;
        EXPECT_NE(m.find("all_gather #1"), std::string::npos) << m;
      }
    }
    if (me() == bad) linger();
  }
  process_barrier();
}

// Nodes: mpiexec on one machine puts every process on one shared-memory node, which the world
// communicator finds (MPI_Comm_split_type), so nothing crosses nodes. Then a layout set by hand
// (rank parity as the node) is inherited by a split child through its exchange, and the child's
// all-reduce counts 2·o·N/W cross-node bytes, o = the ranks of the other parity.
TEST(COLLECTIVES_SUITE, NodesFromSharedMemoryAndInheritedBySplit) {
  const int w = world(), r = me();
  const auto world_comm = make_world(std::chrono::milliseconds(20'000));
  Communicator& mpi = *world_comm;
  EXPECT_EQ(mpi.node_count(), 1);
  for (int q = 0; q < w; ++q) EXPECT_EQ(mpi.node_of(q), 0);
  EXPECT_EQ(mpi.sequence(), 0u);  // finding the nodes is not a counted collective
  EXPECT_EQ(mpi.stats().total_calls(), 0u);

  std::vector<int> parity(static_cast<std::size_t>(w));
  for (int q = 0; q < w; ++q) parity[static_cast<std::size_t>(q)] = q % 2;
  mpi.set_nodes(parity);
  std::unique_ptr<Communicator> child = mpi.split(0, r);
  ASSERT_EQ(child->world_size(), w);
  EXPECT_EQ(child->node_count(), 2);
  for (int q = 0; q < w; ++q) EXPECT_EQ(child->node_of(q), q % 2);
  EXPECT_EQ(child->sequence(), 1u);  // the inherit exchange
  HostBuf buf(DType::fp32, 8);
  for (std::int64_t i = 0; i < 8; ++i) buf.set(i, 1.0);
  child->all_reduce(buf.tensor(), ReduceOp::sum);
  // Ranks of the other parity: W = 2: 1; W = 3: rank 0 and 2 see 1, rank 1 sees 2; W = 4: 2.
  const int other = r % 2 == 0 ? w / 2 : (w + 1) / 2;
  EXPECT_EQ(child->stats().cross_node_bytes_sent(CollectiveKind::all_reduce), 2u * static_cast<std::uint64_t>(other) * 32u / static_cast<std::uint64_t>(w));
  process_barrier();
}

}  // namespace
}  // namespace dstrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#if DSTRAIN_TEST_GLOO
  const int rank = dstrain::me();
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  std::int32_t any = failed;
  dstrain::make_world()->all_reduce(dstrain::Tensor(&any, dstrain::DType::int32, dstrain::Shape{1}), dstrain::ReduceOp::max);
#else
  const dstrain::MpiWorld w = dstrain::init_mpi();
  const int rank = w.rank;
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = failed;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#endif
  if (any && !failed) std::fprintf(stderr, "rank %d: passed, but another process failed\n", rank);
#if !DSTRAIN_TEST_GLOO
  dstrain::finalize_mpi();
#endif
  return any;
}
