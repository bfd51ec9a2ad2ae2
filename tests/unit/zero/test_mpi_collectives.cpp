// The MPI backend against the local backend, run by ctest under mpiexec with 2, 3 and 4 processes:
// every collective, every dtype and op, odd sizes (chunks of uneven length, empty ones), in place
// and out of place, gives on every process exactly the bits that the local backend (W threads in
// this same process, fed the same per-rank inputs) gives the same rank, and the same byte counters.
// Then the failures: mismatched calls fail on every rank naming both, and a rank that never
// arrives is named by the others within the timeout.
//
// Every process runs every test in the same order (the collectives must match); main() combines
// the processes' results, so ctest fails when any process failed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm_test_util.h"
#include "ops/error.h"
#include "zero/local_communicator.h"
#include "zero/mpi_communicator.h"
#include "zero/mpi_process.h"

namespace dstrain {
namespace {

using testing_comm::HostBuf;

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

TEST(MpiCollectives, AllReduceMatchesLocalBitForBit) {
  MpiCommunicator mpi;
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

TEST(MpiCollectives, ReduceScatterOutOfPlaceAndInPlaceMatchLocal) {
  MpiCommunicator mpi;
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

TEST(MpiCollectives, AllGatherOutOfPlaceAndInPlaceMatchLocal) {
  MpiCommunicator mpi;
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

TEST(MpiCollectives, BroadcastFromEveryRootAndBarrierMatchLocal) {
  MpiCommunicator mpi;
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
TEST(MpiCollectives, SixteenBitSumsRoundOnce) {
  MpiCommunicator mpi;
  HostBuf b(DType::bf16, 1);
  b.set(0, me() == 0 ? 1.0 : 1.0 / 512);
  mpi.all_reduce(b.tensor(), ReduceOp::sum);
  HostBuf want(DType::bf16, 1);
  want.set(0, static_cast<double>(1.0f + static_cast<float>(world() - 1) / 512.0f));
  EXPECT_EQ(b.bits(0), want.bits(0)) << b.get(0);
}

TEST(MpiCollectives, MismatchFailsOnEveryRankNamingBothCalls) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  MpiCommunicator mpi(MPI_COMM_WORLD, std::chrono::milliseconds(20'000));
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

// Rank W−1 never reaches the barrier: the others fail within the timeout, naming it and the last
// collective it reached. (Last: the group is left unusable, and the processes meet again on
// MPI_COMM_WORLD.)
TEST(MpiCollectives, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  if (world() < 2) GTEST_SKIP() << "needs 2 processes";
  const int late = world() - 1;
  {
    MpiCommunicator mpi(MPI_COMM_WORLD, std::chrono::milliseconds(1500));
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
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace dstrain

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const dstrain::MpiWorld w = dstrain::init_mpi();
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = failed;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !failed) std::fprintf(stderr, "rank %d: passed, but another process failed\n", w.rank);
  dstrain::finalize_mpi();
  return any;
}
