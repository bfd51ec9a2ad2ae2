// LocalCommunicator failures: a rank that skips a collective (timeout, or its thread finishing),
// mismatched calls, bad arguments on one rank, and the poisoned group afterwards. Each must end in
// an Error that names the cause, on every rank, quickly: never a hang or a silent corruption.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::HostBuf;
using ::testing::HasSubstr;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs fn on W ranks and returns the message of the Error run_local_ranks rethrows ("" if none).
std::string run_expecting_error(int w, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  try {
    run_local_ranks(w, fn, timeout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<HostBuf> bufs_for(int w, DType dt, std::int64_t n) {
  std::vector<HostBuf> v;
  for (int r = 0; r < w; ++r) v.emplace_back(dt, n);
  return v;
}

}  // namespace

// Rank 2 skips all_reduce #2 and stays alive (busy, not finished): the others time out, naming the
// collective, its number, the missing rank and what that rank last called.
TEST(LocalFailures, SkippedCollectiveTimesOutNamingTheMissingRank) {
  auto bufs = bufs_for(3, DType::fp32, 8);
  std::vector<std::string> errors(3);
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      3,
      [&](Communicator& c) {
        auto& group = dynamic_cast<LocalCommunicator&>(c).group();
        const Tensor t = bufs[static_cast<std::size_t>(c.rank())].tensor();
        try {
          c.barrier();  // #1, everyone
          if (c.rank() == 2) {
            while (!group.poisoned()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
            c.all_reduce(t, ReduceOp::sum);  // too late: the group has failed
          } else {
            c.all_reduce(t, ReduceOp::sum);  // #2
          }
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(c.rank())] = e.what();
          throw;
        }
      },
      std::chrono::milliseconds(1000));  // long enough that ranks 0 and 1 both arrive on a loaded machine
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(err, HasSubstr("all_reduce #2"));
  EXPECT_THAT(err, HasSubstr("timed out after 1000 ms"));
  EXPECT_THAT(err, HasSubstr("rank(s) 2 of 3 did not reach it"));
  EXPECT_THAT(err, HasSubstr("rank 2 last called barrier #1"));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[static_cast<std::size_t>(r)], err) << "rank " << r << " got another error";
}

// A rank whose function returns without the collective fails the others at once, not at the timeout.
TEST(LocalFailures, RankThatFinishedFailsTheOthersImmediately) {
  auto bufs = bufs_for(4, DType::bf16, 8);
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      4,
      [&](Communicator& c) {
        if (c.rank() == 1) return;
        c.all_gather(shard_of(bufs[static_cast<std::size_t>(c.rank())].tensor(), c.rank(), 4), bufs[static_cast<std::size_t>(c.rank())].tensor());
      },
      std::chrono::milliseconds(60'000));
  EXPECT_LT(seconds_since(t0), 10.0) << "waited for the 60 s timeout instead";
  EXPECT_THAT(err, HasSubstr("all_gather #1"));
  EXPECT_THAT(err, HasSubstr("rank(s) 1 finished"));
}

TEST(LocalFailures, DifferentCollectivesNameBothCalls) {
  auto a = bufs_for(2, DType::fp32, 8);
  auto b = bufs_for(2, DType::fp32, 16);
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        c.barrier();
        if (c.rank() == 0) {
          c.all_reduce(a[r].tensor(), ReduceOp::sum);
        } else {
          c.all_gather(a[r].tensor(), b[r].tensor());
        }
      },
      std::chrono::milliseconds(5'000));
  EXPECT_THAT(err, HasSubstr("collective mismatch"));
  EXPECT_THAT(err, HasSubstr("rank 0 called all_reduce #2 (fp32, 8 elements, sum)"));
  EXPECT_THAT(err, HasSubstr("rank 1 called all_gather #2 (fp32, 8 -> 2×8 elements)"));
}

TEST(LocalFailures, DifferentSizesDtypesOpsAndRootsAreMismatches) {
  struct Case {
    const char* name;
    std::function<void(Communicator&, HostBuf&, HostBuf&)> call;
    const char* want0;
    const char* want_other;
  };
  const std::vector<Case> cases = {
      {"size",
       [](Communicator& c, HostBuf& a, HostBuf&) { c.all_reduce(Tensor(a.tensor().data, DType::fp32, Shape{c.rank() == 2 ? 6 : 8}), ReduceOp::sum); },
       "rank 0 called all_reduce #1 (fp32, 8 elements, sum)", "rank 2 called all_reduce #1 (fp32, 6 elements, sum)"},
      {"dtype",
       [](Communicator& c, HostBuf& a, HostBuf&) {
         c.all_reduce(Tensor(a.tensor().data, c.rank() == 1 ? DType::fp16 : DType::fp32, Shape{8}), ReduceOp::sum);
       },
       "rank 0 called all_reduce #1 (fp32, 8 elements, sum)", "rank 1 called all_reduce #1 (fp16, 8 elements, sum)"},
      {"op", [](Communicator& c, HostBuf& a, HostBuf&) { c.all_reduce(a.tensor(), c.rank() == 2 ? ReduceOp::max : ReduceOp::sum); },
       "rank 0 called all_reduce #1 (fp32, 8 elements, sum)", "rank 2 called all_reduce #1 (fp32, 8 elements, max)"},
      {"root", [](Communicator& c, HostBuf& a, HostBuf&) { c.broadcast(a.tensor(), c.rank() == 1 ? 1 : 0); },
       "rank 0 called broadcast #1 (fp32, 8 elements, root 0)", "rank 1 called broadcast #1 (fp32, 8 elements, root 1)"},
      {"reduce_scatter size",
       [](Communicator& c, HostBuf& a, HostBuf&) {
         const std::int64_t n = c.rank() == 1 ? 2 : 1;
         const Tensor send(a.tensor().data, DType::fp32, Shape{3 * n});
         c.reduce_scatter(send, shard_of(send, c.rank(), 3), ReduceOp::sum);
       },
       "rank 0 called reduce_scatter #1 (fp32, 3×1 -> 1 elements, sum)", "rank 1 called reduce_scatter #1 (fp32, 3×2 -> 2 elements, sum)"},
  };
  for (const Case& k : cases) {
    auto a = bufs_for(3, DType::fp32, 8);
    auto b = bufs_for(3, DType::fp32, 8);
    const std::string err = run_expecting_error(
        3, [&](Communicator& c) { k.call(c, a[static_cast<std::size_t>(c.rank())], b[static_cast<std::size_t>(c.rank())]); },
        std::chrono::milliseconds(5'000));
    EXPECT_THAT(err, HasSubstr(k.want0)) << k.name;
    EXPECT_THAT(err, HasSubstr(k.want_other)) << k.name;
  }
}

// After a failure every rank gets the error, also from its later collectives.
TEST(LocalFailures, GroupIsPoisonedForEveryRank) {
  auto a = bufs_for(3, DType::fp32, 8);
  std::vector<std::string> first(3), later(3);
  run_local_ranks(
      3,
      [&](Communicator& c) {
        const Tensor t = a[static_cast<std::size_t>(c.rank())].tensor();
        try {
          c.broadcast(t, c.rank() == 0 ? 1 : 0);  // rank 0 disagrees on the root
        } catch (const Error& e) {
          first[static_cast<std::size_t>(c.rank())] = e.what();
        }
        try {
          c.barrier();
        } catch (const Error& e) {
          later[static_cast<std::size_t>(c.rank())] = e.what();
        }
      },
      std::chrono::milliseconds(5'000));
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(first[static_cast<std::size_t>(r)], HasSubstr("collective mismatch")) << "rank " << r;
    EXPECT_EQ(later[static_cast<std::size_t>(r)], first[static_cast<std::size_t>(r)]) << "rank " << r;
  }
}

// One rank's bad arguments (recv of the wrong size) fail that rank at once and, through the
// poisoned group, the others too, without waiting for the timeout.
TEST(LocalFailures, BadArgumentsOnOneRankFailEveryRankFast) {
  auto send = bufs_for(2, DType::fp16, 8);
  auto recv = bufs_for(2, DType::fp16, 4);
  std::vector<std::string> errors(2);
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const Tensor out = c.rank() == 1 ? recv[r].tensor().view(Shape{2, 2}).slice_rows(0, 1) : recv[r].tensor();
        try {
          c.reduce_scatter(send[r].tensor(), out, ReduceOp::avg);
        } catch (const Error& e) {
          errors[r] = e.what();
          throw;
        }
      },
      std::chrono::milliseconds(60'000));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(err, HasSubstr("reduce_scatter #1 on rank 1: send has 8 elements, recv 2"));
  EXPECT_EQ(errors[0], errors[1]);
}

TEST(LocalFailures, RankExceptionOutsideCollectivesPoisonsTheGroup) {
  auto a = bufs_for(2, DType::fp32, 4);
  const auto t0 = Clock::now();
  std::string other;
  try {
    run_local_ranks(
        2,
        [&](Communicator& c) {
          if (c.rank() == 1) throw std::runtime_error("data loader failed");
          try {
            c.all_reduce(a[0].tensor(), ReduceOp::sum);
          } catch (const Error& e) {
            other = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(60'000));
    FAIL() << "expected the rank's exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "data loader failed");  // the first error in time: the root cause
  }
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(other, HasSubstr("rank 1 failed: data loader failed"));
}

TEST(LocalFailures, RanksSharingMemoryAreRejected) {
  HostBuf shared(DType::fp32, 8);
  const std::string err = run_expecting_error(
      2, [&](Communicator& c) { c.all_reduce(shared.tensor(), ReduceOp::sum); }, std::chrono::milliseconds(5'000));
  EXPECT_THAT(err, HasSubstr("rank 0's buffer overlaps rank 1's buffer"));
}

TEST(LocalFailures, OverlappingSendAndRecvThatIsNotTheShardIsRejected) {
  auto a = bufs_for(2, DType::fp32, 8);
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        const Tensor t = a[static_cast<std::size_t>(c.rank())].tensor();
        c.reduce_scatter(t, shard_of(t, 1 - c.rank(), 2), ReduceOp::sum);  // the other rank's shard
      },
      std::chrono::milliseconds(5'000));
  EXPECT_THAT(err, HasSubstr("recv overlaps send but is not this rank's shard"));
}

TEST(LocalFailures, GpuTensorsAreRejectedByTheLocalBackend) {
  auto a = bufs_for(1, DType::fp32, 8);
  const std::string err = run_expecting_error(
      1, [&](Communicator& c) { c.all_reduce(Tensor(a[0].tensor().data, DType::fp32, Shape{8}, Device::cuda(0)), ReduceOp::sum); },
      std::chrono::milliseconds(5'000));
  EXPECT_THAT(err, HasSubstr("is on cuda:0; the local backend communicates host memory"));
}

TEST(LocalFailures, UnsupportedDtypeAndBadRoot) {
  auto a = bufs_for(2, DType::uint16, 8);
  EXPECT_THAT(run_expecting_error(
                  2, [&](Communicator& c) { c.all_reduce(a[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::sum); },
                  std::chrono::milliseconds(5'000)),
              HasSubstr("has dtype uint16"));
  auto b = bufs_for(2, DType::fp32, 8);
  EXPECT_THAT(run_expecting_error(
                  2, [&](Communicator& c) { c.broadcast(b[static_cast<std::size_t>(c.rank())].tensor(), 2); }, std::chrono::milliseconds(5'000)),
              HasSubstr("root 2 is not a rank (world size 2)"));
}

TEST(LocalFailures, TimeoutFromEnvironment) {
  const char* saved = std::getenv("DSTRAIN_COMM_TIMEOUT");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("DSTRAIN_COMM_TIMEOUT");
  EXPECT_EQ(default_comm_timeout(), std::chrono::milliseconds(60'000));
  ::setenv("DSTRAIN_COMM_TIMEOUT", "0.25", 1);
  EXPECT_EQ(default_comm_timeout(), std::chrono::milliseconds(250));
  ::setenv("DSTRAIN_COMM_TIMEOUT", "600", 1);
  EXPECT_EQ(default_comm_timeout(), std::chrono::milliseconds(600'000));
  for (const char* bad : {"abc", "-1", "0", "5s", "nan"}) {
    ::setenv("DSTRAIN_COMM_TIMEOUT", bad, 1);
    try {
      (void)default_comm_timeout();
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string("DSTRAIN_COMM_TIMEOUT='") + bad + "'"));
    }
  }
  if (saved != nullptr) {
    ::setenv("DSTRAIN_COMM_TIMEOUT", saved_value.c_str(), 1);
  } else {
    ::unsetenv("DSTRAIN_COMM_TIMEOUT");
  }
}
