// LocalCommunicator collectives for W = 1..4 (3 catches even-split assumptions) and fp32/fp16/bf16,
// against expected values the test computes from the known per-rank inputs, element by element.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "ops/error.h"
#include "ops/log.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::expected_bits;
using dstrain::testing_comm::expected_reduce;
using dstrain::testing_comm::HostBuf;
using dstrain::testing_comm::input_value;

namespace {

class LocalCollectives : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

std::string param_name(const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
  return fmt::format("W{}_{}", std::get<0>(info.param), dtype_name(std::get<1>(info.param)));
}

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

TEST_P(LocalCollectives, AllReduceEveryOpAndSize) {
  const int w = world();
  // 0 (empty), 2 (fewer elements than ranks for W = 3, 4: some ranks own nothing), 1003 (no W divides it),
  // 2500 (several 1024-element blocks).
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{2}, std::int64_t{1003}, std::int64_t{2500}}) {
    for (const ReduceOp op : kOps) {
      std::vector<HostBuf> bufs;
      for (int r = 0; r < w; ++r) {
        bufs.emplace_back(dtype(), n);
        for (std::int64_t i = 0; i < n; ++i) bufs.back().set(i, input_value(r, i));
      }
      run_local_ranks(w, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), op); });
      for (int r = 0; r < w; ++r)
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(bufs[static_cast<std::size_t>(r)].bits(i), expected_bits(op, dtype(), w, i))
              << "rank " << r << " element " << i << " of " << n << " op " << reduce_op_name(op) << ": got "
              << bufs[static_cast<std::size_t>(r)].get(i) << ", want " << expected_reduce(op, dtype(), w, i);
    }
  }
}

TEST_P(LocalCollectives, ReduceScatterOutOfPlaceAndInPlace) {
  const int w = world();
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{37}, std::int64_t{1100}}) {
    for (const ReduceOp op : kOps) {
      for (const bool in_place : {false, true}) {
        std::vector<HostBuf> send, recv;
        for (int r = 0; r < w; ++r) {
          send.emplace_back(dtype(), n * w);
          recv.emplace_back(dtype(), n);
          for (std::int64_t i = 0; i < n * w; ++i) send.back().set(i, input_value(r, i));
        }
        run_local_ranks(w, [&](Communicator& c) {
          const auto r = static_cast<std::size_t>(c.rank());
          const Tensor s = send[r].tensor();
          c.reduce_scatter(s, in_place ? shard_of(s, c.rank(), w) : recv[r].tensor(), op);
        });
        for (int r = 0; r < w; ++r) {
          for (std::int64_t i = 0; i < n; ++i) {
            const std::int64_t global = n * r + i;  // rank r owns shard r of the W·n elements
            const HostBuf& out = in_place ? send[static_cast<std::size_t>(r)] : recv[static_cast<std::size_t>(r)];
            ASSERT_EQ(out.bits(in_place ? global : i), expected_bits(op, dtype(), w, global))
                << "rank " << r << " element " << i << " n " << n << " op " << reduce_op_name(op) << " in_place " << in_place;
          }
          if (!in_place) {  // out of place: send is untouched
            for (std::int64_t i = 0; i < n * w; ++i)
              ASSERT_EQ(send[static_cast<std::size_t>(r)].get(i), input_value(r, i)) << "rank " << r << " send " << i;
          }
        }
      }
    }
  }
}

TEST_P(LocalCollectives, AllGatherOutOfPlaceAndInPlace) {
  const int w = world();
  for (const std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{37}, std::int64_t{1100}}) {
    for (const bool in_place : {false, true}) {
      std::vector<HostBuf> send, recv;
      for (int r = 0; r < w; ++r) {
        send.emplace_back(dtype(), n);
        recv.emplace_back(dtype(), n * w);
        for (std::int64_t i = 0; i < n; ++i) send.back().set(i, input_value(r, i));
        for (std::int64_t i = 0; i < n * w; ++i) recv.back().set(i, 99.0);  // must all be overwritten
        if (in_place)                                                       // the rank's own shard already sits in recv
          for (std::int64_t i = 0; i < n; ++i) recv.back().set(n * r + i, input_value(r, i));
      }
      run_local_ranks(w, [&](Communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const Tensor out = recv[r].tensor();
        c.all_gather(in_place ? shard_of(out, c.rank(), w) : send[r].tensor(), out);
      });
      for (int r = 0; r < w; ++r)
        for (int src = 0; src < w; ++src)
          for (std::int64_t i = 0; i < n; ++i)
            ASSERT_EQ(recv[static_cast<std::size_t>(r)].get(n * src + i), input_value(src, i))
                << "rank " << r << " shard " << src << " element " << i << " in_place " << in_place;
    }
  }
}

TEST_P(LocalCollectives, BroadcastFromEveryRoot) {
  const int w = world();
  const std::int64_t n = 1500;
  for (int root = 0; root < w; ++root) {
    std::vector<HostBuf> bufs;
    for (int r = 0; r < w; ++r) {
      bufs.emplace_back(dtype(), n);
      for (std::int64_t i = 0; i < n; ++i) bufs.back().set(i, input_value(r, i));
    }
    run_local_ranks(w, [&](Communicator& c) { c.broadcast(bufs[static_cast<std::size_t>(c.rank())].tensor(), root); });
    for (int r = 0; r < w; ++r)
      for (std::int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bufs[static_cast<std::size_t>(r)].get(i), input_value(root, i)) << "root " << root << " rank " << r;
  }
}

TEST_P(LocalCollectives, StatsCountRingBytesPerRank) {
  const int w = world();
  const auto W = static_cast<std::uint64_t>(w);
  const std::uint64_t es = dtype_size(dtype());
  const std::int64_t n = 12 * 5;  // divisible by every W in 1..4
  std::vector<CommStats> stats(static_cast<std::size_t>(w));
  std::vector<HostBuf> a, b;
  for (int r = 0; r < w; ++r) {
    a.emplace_back(dtype(), n * w);
    b.emplace_back(dtype(), n);
  }
  run_local_ranks(w, [&](Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    c.all_reduce(a[r].tensor(), ReduceOp::sum);  // N = W·n elements
    c.all_reduce(b[r].tensor(), ReduceOp::avg);  // N = n elements
    c.reduce_scatter(a[r].tensor(), b[r].tensor(), ReduceOp::sum);
    c.all_gather(b[r].tensor(), a[r].tensor());
    c.broadcast(b[r].tensor(), w - 1);
    c.barrier();
    stats[r] = c.stats();
  });
  for (int r = 0; r < w; ++r) {
    const CommStats& s = stats[static_cast<std::size_t>(r)];
    const std::uint64_t big = static_cast<std::uint64_t>(n) * W * es, small = static_cast<std::uint64_t>(n) * es;
    // Written out from the definition: all-reduce 2(W−1)/W·N, RS/AG (W−1)·n·bytes, broadcast N at root.
    EXPECT_EQ(s.bytes_sent(CollectiveKind::all_reduce), 2 * (W - 1) * big / W + 2 * (W - 1) * small / W);
    EXPECT_EQ(s.bytes_sent(CollectiveKind::reduce_scatter), (W - 1) * small);
    EXPECT_EQ(s.bytes_sent(CollectiveKind::all_gather), (W - 1) * small);
    EXPECT_EQ(s.bytes_sent(CollectiveKind::broadcast), w > 1 && r == w - 1 ? small : 0u);  // W = 1 sends nothing
    EXPECT_EQ(s.bytes_sent(CollectiveKind::barrier), 0u);
    EXPECT_EQ(s.call_count(CollectiveKind::all_reduce), 2u);
    EXPECT_EQ(s.call_count(CollectiveKind::reduce_scatter), 1u);
    EXPECT_EQ(s.call_count(CollectiveKind::all_gather), 1u);
    EXPECT_EQ(s.call_count(CollectiveKind::broadcast), 1u);
    EXPECT_EQ(s.call_count(CollectiveKind::barrier), 1u);
    EXPECT_EQ(s.total_calls(), 6u);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, LocalCollectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(DType::fp32, DType::fp16, DType::bf16, DType::fp64)),
                         param_name);

}  // namespace

// 16-bit reductions accumulate in fp32 and round once: fp16 2048 + 1 + 1 is 2050 (exact in fp16),
// whereas rounding after each addition would give 2048 (2049 is a tie that rounds to even 2048).
TEST(LocalCommunicator, SixteenBitSumsAccumulateInFp32AndRoundOnce) {
  for (const DType dt : {DType::fp16, DType::bf16}) {
    // bf16 spacing at 256 is 2: 256 + 1 + 1 must be 258, not 256.
    const double big = dt == DType::fp16 ? 2048.0 : 256.0;
    std::vector<HostBuf> bufs;
    for (int r = 0; r < 3; ++r) {
      bufs.emplace_back(dt, 1);
      bufs.back().set(0, r == 0 ? big : 1.0);
    }
    run_local_ranks(3, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::sum); });
    for (int r = 0; r < 3; ++r) EXPECT_EQ(bufs[static_cast<std::size_t>(r)].get(0), big + 2.0) << dtype_name(dt);
  }
}

TEST(LocalCommunicator, Int32SumAndMaxForCountsAvgRejected) {
  std::vector<HostBuf> bufs;
  for (int r = 0; r < 3; ++r) {
    bufs.emplace_back(DType::int32, 4);
    for (int i = 0; i < 4; ++i) bufs.back().set(i, (r + 1) * (i - 1) * 1000);
  }
  run_local_ranks(3, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::sum); });
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(bufs[static_cast<std::size_t>(r)].get(i), 6 * (i - 1) * 1000);
  run_local_ranks(3, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::max); });
  for (int r = 0; r < 3; ++r)  // max of 6·(i−1)·1000 (identical now) is itself
    for (int i = 0; i < 4; ++i) EXPECT_EQ(bufs[static_cast<std::size_t>(r)].get(i), 6 * (i - 1) * 1000);
  try {
    run_local_ranks(2, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::avg); });
    FAIL() << "int32 avg must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("avg of int32"), std::string::npos) << e.what();
  }
}

TEST(LocalCommunicator, MaxPropagatesNaN) {
  std::vector<HostBuf> bufs;
  for (int r = 0; r < 2; ++r) {
    bufs.emplace_back(DType::fp32, 2);
    bufs.back().set(0, r == 1 ? std::nan("") : 5.0);
    bufs.back().set(1, r == 0 ? std::nan("") : 5.0);
  }
  run_local_ranks(2, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::max); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(std::isnan(bufs[static_cast<std::size_t>(r)].get(0)));
    EXPECT_TRUE(std::isnan(bufs[static_cast<std::size_t>(r)].get(1)));
  }
}

// Arbitrary fp32 values (sums inexact): every rank gets identical bits, every run the same bits,
// and they are the fp32 sum in rank order 0, 1, ..., W−1 (the documented order).
TEST(LocalCommunicator, DeterministicAcrossRanksAndRuns) {
  const int w = 4;
  const std::int64_t n = 3001;
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::vector<float>> inputs(w, std::vector<float>(static_cast<std::size_t>(n)));
  for (auto& v : inputs)
    for (auto& x : v) x = dist(gen) * std::pow(10.0f, static_cast<float>(gen() % 7) - 3.0f);
  std::vector<std::uint32_t> first_run;
  for (int run = 0; run < 3; ++run) {
    std::vector<HostBuf> bufs;
    for (int r = 0; r < w; ++r) {
      bufs.emplace_back(DType::fp32, n);
      for (std::int64_t i = 0; i < n; ++i) bufs.back().set(i, inputs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)]);
    }
    run_local_ranks(w, [&](Communicator& c) { c.all_reduce(bufs[static_cast<std::size_t>(c.rank())].tensor(), ReduceOp::sum); });
    for (std::int64_t i = 0; i < n; ++i) {
      float want = inputs[0][static_cast<std::size_t>(i)];
      for (int r = 1; r < w; ++r) want += inputs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
      for (int r = 0; r < w; ++r) ASSERT_EQ(bufs[static_cast<std::size_t>(r)].get(i), static_cast<double>(want)) << i;
      if (run == 0) {
        first_run.push_back(bufs[0].bits(i));
      } else {
        ASSERT_EQ(bufs[0].bits(i), first_run[static_cast<std::size_t>(i)]) << "run " << run << " element " << i;
      }
    }
  }
}

TEST(LocalCommunicator, BarrierOrdersWritesBeforeReads) {
  const int w = 4;
  std::vector<std::atomic<int>> flags(w);
  std::vector<int> seen(w, 0);
  run_local_ranks(w, [&](Communicator& c) {
    for (int round = 1; round <= 20; ++round) {
      flags[static_cast<std::size_t>(c.rank())].store(round, std::memory_order_relaxed);
      c.barrier();
      int ok = 0;
      for (auto& f : flags) ok += f.load(std::memory_order_relaxed) >= round ? 1 : 0;
      if (ok == w) ++seen[static_cast<std::size_t>(c.rank())];
      c.barrier();
    }
  });
  for (int r = 0; r < w; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], 20) << "rank " << r;
}

TEST(LocalCommunicator, ManyCollectivesInSequence) {
  // Generation bookkeeping over many back-to-back calls of mixed kinds: in round k only rank k % W
  // holds k, so sum, max and a broadcast from that rank must each leave k everywhere.
  const int w = 3;
  std::vector<HostBuf> bufs;
  for (int r = 0; r < w; ++r) bufs.emplace_back(DType::fp32, 6);
  std::vector<int> wrong(w, 0);
  run_local_ranks(w, [&](Communicator& c) {
    HostBuf& b = bufs[static_cast<std::size_t>(c.rank())];
    for (int k = 0; k < 200; ++k) {
      for (int i = 0; i < 6; ++i) b.set(i, c.rank() == k % w ? k : 0);
      c.all_reduce(b.tensor(), ReduceOp::sum);
      for (int i = 0; i < 6; ++i) wrong[static_cast<std::size_t>(c.rank())] += b.get(i) != k;
      c.all_reduce(b.tensor(), ReduceOp::max);
      for (int i = 0; i < 6; ++i) b.set(i, c.rank() == k % w ? k + 1 : -1);
      c.broadcast(b.tensor(), k % w);
      for (int i = 0; i < 6; ++i) wrong[static_cast<std::size_t>(c.rank())] += b.get(i) != k + 1;
    }
    EXPECT_EQ(c.sequence(), 600u);
  });
  for (int r = 0; r < w; ++r) EXPECT_EQ(wrong[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

TEST(LocalCommunicator, RankThreadsLogWithTheirOwnRank) {
  std::vector<int> ranks(3, -1), worlds(3, -1);
  run_local_ranks(3, [&](Communicator& c) {
    ranks[static_cast<std::size_t>(c.rank())] = log_rank();
    worlds[static_cast<std::size_t>(c.rank())] = log_world_size();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[static_cast<std::size_t>(r)], r);
    EXPECT_EQ(worlds[static_cast<std::size_t>(r)], 3);
  }
  EXPECT_EQ(log_rank(), 0);  // the main thread keeps the process-wide rank
}

// Warnings from rank threads carry their own rank, although ranks share one process.
TEST(LocalCommunicator, RankThreadsTagWarningsWithTheirRank) {
  std::fflush(stderr);
  char path[] = "/tmp/dstrain_comm_log_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  run_local_ranks(3, [](Communicator& c) {
    log_warning("hello from {}", c.rank());
    c.barrier();
  });
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  if (FILE* f = std::fopen(path, "rb")) {
    char buf[4096];
    std::size_t got = 0;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    std::fclose(f);
  }
  ::close(fd);
  ::unlink(path);
  for (int r = 0; r < 3; ++r) EXPECT_NE(text.find(fmt::format("[dstrain rank {}] warning: hello from {}", r, r)), std::string::npos) << text;
}

TEST(LocalCommunicator, ShardOf) {
  HostBuf b(DType::bf16, 12);
  const Tensor t = b.tensor();
  const Tensor s = shard_of(t, 2, 3);
  EXPECT_EQ(s.numel(), 4);
  EXPECT_EQ(static_cast<char*>(s.data) - static_cast<char*>(t.data), 16);
  EXPECT_THROW(shard_of(t, 0, 5), Error);
  EXPECT_THROW(shard_of(t, 3, 3), Error);
}

TEST(LocalCommunicator, RingBytesFormula) {
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_reduce, 4000, 3), 5333u);  // 2·2·4000/3 rounded down
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_reduce, 4000, 4), 6000u);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::reduce_scatter, 3000, 3), 2000u);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_gather, 3000, 3), 2000u);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::broadcast, 3000, 3, true), 3000u);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::broadcast, 3000, 3, false), 0u);
  EXPECT_EQ(ring_bytes_sent(CollectiveKind::all_reduce, 4000, 1), 0u);
}
