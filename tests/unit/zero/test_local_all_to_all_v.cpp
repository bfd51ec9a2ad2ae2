// The variable all-to-all (Communicator::all_to_all_v) and exchange_counts on the local backend,
// for W = 1..4 and fp32 / bf16 / int32, against each rank's expected recv built by the test from
// the formula (block i of rank r's recv = rank i's block r, elements i·1000 + r·100 + k): counts
// with zeros (a rank that sends nothing, a rank that receives nothing, everything empty), the
// elements past the blocks left untouched, the byte counters; the comms logger's record; every
// argument check of the front; a pair whose counts disagree fails every rank naming both ranks and
// both counts; a rank that never comes is named within the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/comms_logger.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::HostBuf;

namespace {

// How many elements rank s sends rank d in each pattern (every rank computes every count itself).
enum class Pattern { mixed, silent_sender, all_empty, uniform };

std::int64_t count_of(Pattern p, int s, int d, int w) {
  switch (p) {
    case Pattern::mixed:  // zeros scattered over the pairs, the rank's own block included sometimes
      return ((s * 3 + d * 5 + 1) % 4) * (1 + s) + (s == d ? 2 : 0) * (d % 2);
    case Pattern::silent_sender:  // the last rank sends nothing; rank 0 receives nothing
      return (s == w - 1 || d == 0) ? 0 : 1 + s + 2 * d;
    case Pattern::all_empty:
      return 0;
    case Pattern::uniform:
      return 3;
  }
  return 0;
}

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::mixed:
      return "mixed";
    case Pattern::silent_sender:
      return "silent_sender";
    case Pattern::all_empty:
      return "all_empty";
    case Pattern::uniform:
      return "uniform";
  }
  return "?";
}

// Element k of the block rank s sends rank d (exact in bf16 for the sizes used: few distinct bits
// lost, and the expected side rounds through the same HostBuf::set).
double element(int s, int d, std::int64_t k) { return s * 1000 + d * 100 + static_cast<double>(k); }

constexpr int kTail = 3;          // extra elements past the blocks in send and recv
constexpr double kSentinel = -7;  // what recv's tail holds before and after

std::vector<std::int64_t> send_counts_of(Pattern p, int r, int w) {
  std::vector<std::int64_t> c;
  for (int d = 0; d < w; ++d) c.push_back(count_of(p, r, d, w));
  return c;
}
std::vector<std::int64_t> recv_counts_of(Pattern p, int r, int w) {
  std::vector<std::int64_t> c;
  for (int s = 0; s < w; ++s) c.push_back(count_of(p, s, r, w));
  return c;
}
std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t t = 0;
  for (std::int64_t x : v) t += x;
  return t;
}

class LocalAllToAllV : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

std::string param_name(const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
  return fmt::format("W{}_{}", std::get<0>(info.param), dtype_name(std::get<1>(info.param)));
}

TEST_P(LocalAllToAllV, EveryPatternAgainstTheFormula) {
  const int w = world();
  const DType dt = dtype();
  for (const Pattern p : {Pattern::mixed, Pattern::silent_sender, Pattern::all_empty, Pattern::uniform}) {
    std::vector<HostBuf> send, recv;
    for (int r = 0; r < w; ++r) {
      const auto sc = send_counts_of(p, r, w);
      const auto rc = recv_counts_of(p, r, w);
      send.emplace_back(dt, sum(sc) + kTail);
      std::int64_t at = 0;
      for (int d = 0; d < w; ++d)
        for (std::int64_t k = 0; k < sc[static_cast<std::size_t>(d)]; ++k) send.back().set(at++, element(r, d, k));
      for (int t = 0; t < kTail; ++t) send.back().set(at++, 55);  // never sent
      recv.emplace_back(dt, sum(rc) + kTail);
      for (std::int64_t i = 0; i < recv.back().n; ++i) recv.back().set(i, kSentinel);
    }
    std::vector<CommStats> stats(static_cast<std::size_t>(w));
    std::vector<std::uint64_t> seq(static_cast<std::size_t>(w));
    run_local_ranks(w, [&](Communicator& c) {
      const int r = c.rank();
      const auto sc = send_counts_of(p, r, w);
      const auto rc = recv_counts_of(p, r, w);
      c.all_to_all_v(send[static_cast<std::size_t>(r)].tensor(), sc, recv[static_cast<std::size_t>(r)].tensor(), rc);
      stats[static_cast<std::size_t>(r)] = c.stats();
      seq[static_cast<std::size_t>(r)] = c.sequence();
    });
    for (int r = 0; r < w; ++r) {
      const std::string what = fmt::format("pattern {} W={} {} rank {}", pattern_name(p), w, dtype_name(dt), r);
      // The reference: block s of rank r's recv is rank s's block r, from the formula.
      HostBuf want(dt, recv[static_cast<std::size_t>(r)].n);
      std::int64_t at = 0;
      for (int s = 0; s < w; ++s)
        for (std::int64_t k = 0; k < count_of(p, s, r, w); ++k) want.set(at++, element(s, r, k));
      for (int t = 0; t < kTail; ++t) want.set(at++, kSentinel);
      for (std::int64_t i = 0; i < want.n; ++i)
        ASSERT_EQ(recv[static_cast<std::size_t>(r)].bits(i), want.bits(i))
            << what << " element " << i << ": got " << recv[static_cast<std::size_t>(r)].get(i) << ", want " << want.get(i);
      // Counted once, as the bytes of the blocks to the other ranks.
      std::uint64_t bytes = 0;
      for (int d = 0; d < w; ++d)
        if (d != r) bytes += static_cast<std::uint64_t>(count_of(p, r, d, w)) * dtype_size(dt);
      const CommStats& s = stats[static_cast<std::size_t>(r)];
      EXPECT_EQ(s.call_count(CollectiveKind::all_to_all_v), 1u) << what;
      EXPECT_EQ(s.bytes_sent(CollectiveKind::all_to_all_v), bytes) << what;
      EXPECT_EQ(s.total_calls(), 1u) << what;
      EXPECT_EQ(seq[static_cast<std::size_t>(r)], 1u) << what;
    }
  }
}

// exchange_counts gives each rank what the others will send it; an all_to_all_v with those counts
// then moves the data (the MoE routing order: only the sender knows its sizes).
TEST_P(LocalAllToAllV, ExchangeCountsThenAllToAllV) {
  const int w = world();
  const DType dt = dtype();
  std::vector<std::vector<std::int64_t>> got(static_cast<std::size_t>(w));
  std::vector<HostBuf> recv(static_cast<std::size_t>(w));
  std::vector<CommStats> stats(static_cast<std::size_t>(w));
  run_local_ranks(w, [&](Communicator& c) {
    const int r = c.rank();
    const auto sc = send_counts_of(Pattern::mixed, r, w);
    std::vector<std::int64_t> rc = c.exchange_counts(sc);
    got[static_cast<std::size_t>(r)] = rc;
    HostBuf send(dt, sum(sc));
    std::int64_t at = 0;
    for (int d = 0; d < w; ++d)
      for (std::int64_t k = 0; k < sc[static_cast<std::size_t>(d)]; ++k) send.set(at++, element(r, d, k));
    HostBuf out(dt, sum(rc));
    c.all_to_all_v(send.tensor(), sc, out.tensor(), rc);
    recv[static_cast<std::size_t>(r)] = out;
    stats[static_cast<std::size_t>(r)] = c.stats();
  });
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(got[static_cast<std::size_t>(r)], recv_counts_of(Pattern::mixed, r, w)) << "rank " << r;
    HostBuf want(dt, recv[static_cast<std::size_t>(r)].n);
    std::int64_t at = 0;
    for (int s = 0; s < w; ++s)
      for (std::int64_t k = 0; k < count_of(Pattern::mixed, s, r, w); ++k) want.set(at++, element(s, r, k));
    for (std::int64_t i = 0; i < want.n; ++i) ASSERT_EQ(recv[static_cast<std::size_t>(r)].bits(i), want.bits(i)) << "rank " << r << " element " << i;
    // exchange_counts is one all_to_all of W int64 values.
    EXPECT_EQ(stats[static_cast<std::size_t>(r)].call_count(CollectiveKind::all_to_all), 1u);
    EXPECT_EQ(stats[static_cast<std::size_t>(r)].bytes_sent(CollectiveKind::all_to_all), static_cast<std::uint64_t>(w - 1) * 8u);
    EXPECT_EQ(stats[static_cast<std::size_t>(r)].call_count(CollectiveKind::all_to_all_v), 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, LocalAllToAllV,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(DType::fp32, DType::bf16, DType::int32)), param_name);

// Counts above INT_MAX travel as int64 (the exchange moves the bits unchanged).
TEST(LocalAllToAllVChecks, ExchangeCountsKeepsLargeCounts) {
  const std::int64_t big = (std::int64_t{1} << 40) + 12345;
  run_local_ranks(2, [&](Communicator& c) {
    const std::vector<std::int64_t> mine = {big + c.rank() * 10, big + 1 + c.rank() * 10};
    const std::vector<std::int64_t> got = c.exchange_counts(mine);
    EXPECT_EQ(got[0], big + c.rank());
    EXPECT_EQ(got[1], big + c.rank() + 10);
  });
}

// Rank 1 expects one element more from rank 0 than rank 0 sends: every rank fails, naming both
// ranks and both counts, and no data moves.
TEST(LocalAllToAllVChecks, MismatchedCountsFailEveryRankNamingBothRanksAndCounts) {
  for (const int w : {2, 3}) {
    std::vector<std::string> messages(static_cast<std::size_t>(w));
    EXPECT_THROW(run_local_ranks(w,
                                 [&](Communicator& c) {
                                   const int r = c.rank();
                                   auto sc = send_counts_of(Pattern::uniform, r, w);
                                   auto rc = recv_counts_of(Pattern::uniform, r, w);
                                   if (r == 1) rc[0] += 1;
                                   HostBuf send(DType::fp32, sum(sc)), recv(DType::fp32, sum(rc));
                                   try {
                                     c.all_to_all_v(send.tensor(), sc, recv.tensor(), rc);
                                   } catch (const Error& e) {
                                     messages[static_cast<std::size_t>(r)] = e.what();
                                     throw;
                                   }
                                 }),
                 Error);
    for (int r = 0; r < w; ++r) {
      const std::string& m = messages[static_cast<std::size_t>(r)];
      EXPECT_NE(m.find("all_to_all_v #1: rank 0 sends 3 elements to rank 1 (its send_counts[1]) but rank 1 expects 4 from rank 0 (its "
                       "recv_counts[0])"),
                std::string::npos)
          << "W=" << w << " rank " << r << ": " << m;
    }
  }
}

// One rank's bad arguments: an Error naming the value and the fix (and the group poisoned, so the
// other ranks fail too rather than wait).
void expect_front_error(const std::function<void(Communicator&)>& call, const std::string& expected) {
  std::string message;
  try {
    run_local_ranks(2, [&](Communicator& c) {
      if (c.rank() == 1) {
        call(c);
      } else {
        HostBuf s(DType::fp32, 4), r(DType::fp32, 4);
        const std::vector<std::int64_t> counts = {1, 1};
        c.all_to_all_v(s.tensor(), counts, r.tensor(), counts);
      }
    }, std::chrono::milliseconds(5000));
    ADD_FAILURE() << "no error; expected " << expected;
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

TEST(LocalAllToAllVChecks, FrontRejectsBadArguments) {
  HostBuf s(DType::fp32, 4), r(DType::fp32, 4), b(DType::bf16, 4), big(DType::fp32, 8);
  const std::vector<std::int64_t> ok = {1, 1};
  expect_front_error(
      [&](Communicator& c) {
        const std::vector<std::int64_t> neg = {-1, 1};
        c.all_to_all_v(s.tensor(), neg, r.tensor(), ok);
      },
      "send_counts[0] is -1");
  expect_front_error(
      [&](Communicator& c) {
        const std::vector<std::int64_t> three = {1, 1, 1};
        c.all_to_all_v(s.tensor(), ok, r.tensor(), three);
      },
      "recv_counts has 3 entries but the world size is 2");
  expect_front_error(
      [&](Communicator& c) {
        const std::vector<std::int64_t> many = {3, 2};
        c.all_to_all_v(s.tensor(), many, r.tensor(), ok);
      },
      "send_counts sum to more than send's 4 elements");
  expect_front_error([&](Communicator& c) { c.all_to_all_v(s.tensor(), ok, b.tensor(), ok); }, "both must have the same dtype");
  expect_front_error(
      [&](Communicator& c) {
        const Tensor whole = big.tensor();
        c.all_to_all_v(Tensor(whole.data, DType::fp32, Shape{4}), ok, Tensor(static_cast<float*>(whole.data) + 2, DType::fp32, Shape{4}), ok);
      },
      "overlap; all_to_all_v has no in-place form");
  expect_front_error(
      [&](Communicator& c) {
        const std::vector<std::int64_t> neg = {0, -2};
        (void)c.exchange_counts(neg);
      },
      "send_counts[1] is -2");
}

// A rank that never calls it is named within the timeout (DSTRAIN_COMM_TIMEOUT's role).
TEST(LocalAllToAllVChecks, RankThatNeverComesIsNamedWithinTheTimeout) {
  std::string message;
  try {
    run_local_ranks(3, [&](Communicator& c) {
      if (c.rank() == 2) {  // late, not gone: the others must give up at the timeout
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return;
      }
      HostBuf s(DType::fp32, 3), r(DType::fp32, 3);
      const std::vector<std::int64_t> counts = {1, 1, 1};
      c.all_to_all_v(s.tensor(), counts, r.tensor(), counts);
    }, std::chrono::milliseconds(300));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("all_to_all_v #1"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out after 300 ms: rank(s) 2 of 3 did not reach it"), std::string::npos) << message;
}

// The comms logger forwards it and records it as DeepSpeed's all_to_all_single, one entry with the
// fixed all_to_all, its message size the send blocks' bytes; its own stats() count all_to_all_v.
TEST(LocalAllToAllVChecks, CommsLoggerRecordsItAsAllToAllSingle) {
  const int w = 3;
  std::vector<std::vector<CommsLogRow>> rows(static_cast<std::size_t>(w));
  std::vector<CommStats> stats(static_cast<std::size_t>(w));
  run_local_ranks(w, [&](Communicator& inner) {
    CommsLoggerOptions options;
    double now = 0;
    options.clock_ms = [&now] { return now += 1.0; };
    CommsLogger logger(inner, options);
    const int r = logger.rank();
    const auto sc = send_counts_of(Pattern::uniform, r, w);
    const auto rc = logger.exchange_counts(sc);
    HostBuf send(DType::fp32, sum(sc)), recv(DType::fp32, sum(rc));
    logger.all_to_all_v(send.tensor(), sc, recv.tensor(), rc);
    logger.all_to_all_v(send.tensor(), sc, recv.tensor(), rc);
    HostBuf a(DType::fp32, 3 * w), b(DType::fp32, 3 * w);
    logger.all_to_all(a.tensor(), b.tensor());
    rows[static_cast<std::size_t>(r)] = logger.log().rows();
    stats[static_cast<std::size_t>(r)] = logger.stats();
  });
  for (int r = 0; r < w; ++r) {
    const auto& rr = rows[static_cast<std::size_t>(r)];
    ASSERT_EQ(rr.size(), 2u) << "rank " << r;  // 24 bytes (the counts), 36 bytes (3 × 3 fp32, both forms)
    EXPECT_EQ(rr[0].op, "all_to_all_single");
    EXPECT_EQ(rr[0].msg_bytes, 24u);
    EXPECT_EQ(rr[0].count, 1u);
    EXPECT_EQ(rr[1].op, "all_to_all_single");
    EXPECT_EQ(rr[1].msg_bytes, 36u);
    EXPECT_EQ(rr[1].count, 3u);
    const CommStats& s = stats[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.call_count(CollectiveKind::all_to_all_v), 2u);
    EXPECT_EQ(s.bytes_sent(CollectiveKind::all_to_all_v), 2u * 2u * 3u * 4u);
    EXPECT_EQ(s.call_count(CollectiveKind::all_to_all), 2u);  // exchange_counts and the fixed one
  }
  CollectiveKind k{};
  ASSERT_TRUE(comms_op_from_name("all_to_all_v", &k));
  EXPECT_EQ(k, CollectiveKind::all_to_all_v);
  EXPECT_EQ(comms_log_name(CollectiveKind::all_to_all_v), "all_to_all_single");
}

}  // namespace
