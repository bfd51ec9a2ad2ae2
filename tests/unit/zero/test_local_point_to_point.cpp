// Point-to-point send / recv on the local backend: a ring over 2, 3 and 4 ranks in every dtype,
// values checked bit for bit against what the test wrote on the sending rank; the pair's FIFO
// order with two senders to one receiver; the byte counters (send: the buffer, recv: 0) and the
// numbering (per pair, not in sequence(), so collectives still match); and the failures, which
// must be Errors on both ranks, never a hang: a size or dtype mismatch names both calls, a peer
// that never posts (or whose thread finished) is named, a ring whose ranks all send first times
// out naming what the peer waits in, and a bad peer names the peer and the world size. Then the
// batched send_recv: neighbours that each send first, a ring of 4, a pair's order across batched
// and standalone calls, a batch of 4 ops and its counters, and the same failures.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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
using dstrain::testing_comm::input_value;
using ::testing::HasSubstr;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Rank r's message `tag`, element i: distinct on every rank, tag and element, exact in every dtype
// (quarter-integers for the 16-bit types, large integers for int32).
HostBuf message(DType dtype, int rank, int tag, std::int64_t n) {
  HostBuf b(dtype, n);
  for (std::int64_t i = 0; i < n; ++i) {
    b.set(i, dtype == DType::int32 ? rank * 1'000'000 + tag * 10'000 + i - 500 : input_value(rank + 5 * tag, i));
  }
  return b;
}

void expect_same_bits(const HostBuf& got, const HostBuf& want, const std::string& what) {
  ASSERT_EQ(got.n, want.n) << what;
  for (std::int64_t i = 0; i < got.n; ++i)
    ASSERT_EQ(got.bits(i), want.bits(i)) << what << " element " << i << ": " << got.get(i) << " vs " << want.get(i);
}

std::string run_expecting_error(int w, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  try {
    run_local_ranks(w, fn, timeout);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Rank r sends to r+1 and receives from r−1 (mod W); even ranks send first and odd ranks receive
// first, so with blocking sends the ring completes for odd W too (rank W−1 and rank 0, both even
// for odd W, are joined by a send that waits only until rank 0's own send has been received).
TEST(LocalPointToPoint, RingExchangeEveryWorldSizeAndDtype) {
  for (int w : {2, 3, 4}) {
    for (DType dt : {DType::fp32, DType::bf16, DType::int32, DType::fp16, DType::fp64}) {
      SCOPED_TRACE(fmt::format("W={} {}", w, dtype_name(dt)));
      constexpr std::int64_t n = 37;
      std::vector<HostBuf> got(static_cast<std::size_t>(w));
      std::vector<CommStats> stats(static_cast<std::size_t>(w));
      std::vector<std::uint64_t> sequence(static_cast<std::size_t>(w)), sent(static_cast<std::size_t>(w)), received(static_cast<std::size_t>(w));
      run_local_ranks(w, [&](Communicator& c) {
        const int r = c.rank();
        const int next = (r + 1) % w, prev = (r + w - 1) % w;
        HostBuf out = message(dt, r, 0, n), in(dt, n);
        if (r % 2 == 0) {
          c.send(out.tensor(), next);
          c.recv(in.tensor(), prev);
        } else {
          c.recv(in.tensor(), prev);
          c.send(out.tensor(), next);
        }
        got[static_cast<std::size_t>(r)] = in;
        stats[static_cast<std::size_t>(r)] = c.stats();
        sequence[static_cast<std::size_t>(r)] = c.sequence();
        sent[static_cast<std::size_t>(r)] = c.sends_to(next);
        received[static_cast<std::size_t>(r)] = c.recvs_from(prev);
      });
      for (int r = 0; r < w; ++r) {
        const auto k = static_cast<std::size_t>(r);
        expect_same_bits(got[k], message(dt, (r + w - 1) % w, 0, n), fmt::format("rank {} from rank {}", r, (r + w - 1) % w));
        // send: the buffer's bytes, once; recv: none (the sender counts them).
        EXPECT_EQ(stats[k].bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * dtype_size(dt)) << "rank " << r;
        EXPECT_EQ(stats[k].bytes_sent(CollectiveKind::recv), 0u) << "rank " << r;
        EXPECT_EQ(stats[k].call_count(CollectiveKind::send), 1u);
        EXPECT_EQ(stats[k].call_count(CollectiveKind::recv), 1u);
        EXPECT_EQ(stats[k].total_bytes_sent(), static_cast<std::uint64_t>(n) * dtype_size(dt));
        EXPECT_EQ(sequence[k], 0u) << "point-to-point calls are not collectives";
        EXPECT_EQ(sent[k], 1u);
        EXPECT_EQ(received[k], 1u);
      }
    }
  }
}

// Two senders, two messages each, to one receiver that takes rank 2's first: each pair's messages
// arrive in the order they were sent, and the pairs do not mix.
TEST(LocalPointToPoint, MessagesOfAPairArriveInOrder) {
  constexpr std::int64_t n = 5;
  std::vector<HostBuf> got(4);
  std::vector<std::uint64_t> numbers;
  run_local_ranks(3, [&](Communicator& c) {
    if (c.rank() == 1) {
      for (int k = 0; k < 4; ++k) got[static_cast<std::size_t>(k)] = HostBuf(DType::fp32, n);
      c.recv(got[0].tensor(), 2);
      c.recv(got[1].tensor(), 2);
      c.recv(got[2].tensor(), 0);
      c.recv(got[3].tensor(), 0);
      numbers = {c.recvs_from(0), c.recvs_from(2), c.sends_to(0)};
      return;
    }
    HostBuf first = message(DType::fp32, c.rank(), 1, n), second = message(DType::fp32, c.rank(), 2, n);
    c.send(first.tensor(), 1);
    c.send(second.tensor(), 1);
  });
  expect_same_bits(got[0], message(DType::fp32, 2, 1, n), "rank 2's first");
  expect_same_bits(got[1], message(DType::fp32, 2, 2, n), "rank 2's second");
  expect_same_bits(got[2], message(DType::fp32, 0, 1, n), "rank 0's first");
  expect_same_bits(got[3], message(DType::fp32, 0, 2, n), "rank 0's second");
  EXPECT_EQ(numbers, (std::vector<std::uint64_t>{2, 2, 0}));
}

// Only the pair takes part: ranks 0 and 1 exchange while rank 2 does not, then all three meet in an
// all-reduce, whose sequence numbers still agree. An empty message is a rendezvous too.
TEST(LocalPointToPoint, CollectivesStillMatchAroundIt) {
  std::vector<float> sums(3);
  run_local_ranks(3, [&](Communicator& c) {
    HostBuf b = message(DType::fp32, c.rank(), 0, 4), empty(DType::fp32, 0);
    if (c.rank() == 0) {
      c.send(b.tensor(), 1);
      c.send(empty.tensor(), 1);
      c.recv(b.tensor(), 1);
    } else if (c.rank() == 1) {
      HostBuf tmp(DType::fp32, 4);
      c.recv(tmp.tensor(), 0);
      c.recv(empty.tensor(), 0);
      c.send(tmp.tensor(), 0);  // rank 0's own values, back
    }
    HostBuf one(DType::fp32, 1);
    one.set(0, b.get(0));
    c.all_reduce(one.tensor(), ReduceOp::sum);
    EXPECT_EQ(c.sequence(), 1u);
    sums[static_cast<std::size_t>(c.rank())] = static_cast<float>(one.get(0));
  });
  // Rank 0's element 0 came back unchanged; rank 1 kept its own; rank 2 its own.
  const double want = message(DType::fp32, 0, 0, 1).get(0) + message(DType::fp32, 1, 0, 1).get(0) + message(DType::fp32, 2, 0, 1).get(0);
  for (float s : sums) EXPECT_EQ(s, static_cast<float>(want));
}

// A recv of another size or dtype than its send fails on both ranks with one message naming both
// calls (both ranks, both sizes and dtypes) and the fix.
TEST(LocalPointToPoint, SizeOrDtypeMismatchFailsOnBothRanks) {
  struct Case {
    DType recv_dtype;
    std::int64_t recv_n;
    const char* recv_text;
  };
  for (const Case& k : {Case{DType::fp32, 6, "recv #1 from rank 0 on rank 1 (fp32, 6 elements)"},
                        Case{DType::bf16, 8, "recv #1 from rank 0 on rank 1 (bf16, 8 elements)"}}) {
    std::vector<std::string> errors(2);
    const std::string err = run_expecting_error(
        2,
        [&](Communicator& c) {
          try {
            if (c.rank() == 0) {
              HostBuf b(DType::fp32, 8);
              c.send(b.tensor(), 1);
            } else {
              HostBuf b(k.recv_dtype, k.recv_n);
              c.recv(b.tensor(), 0);
            }
          } catch (const Error& e) {
            errors[static_cast<std::size_t>(c.rank())] = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(20'000));
    EXPECT_THAT(err, HasSubstr("point-to-point mismatch"));
    EXPECT_THAT(err, HasSubstr("rank 0 called send #1 from rank 0 to rank 1 (fp32, 8 elements)"));
    EXPECT_THAT(err, HasSubstr(std::string("rank 1 called ") + k.recv_text));
    EXPECT_THAT(err, HasSubstr("Fix:"));
    EXPECT_EQ(errors[0], err) << "rank 0";
    EXPECT_EQ(errors[1], err) << "rank 1";
  }
}

// Rank 1 never sends what rank 0 receives (it is busy, not finished): rank 0 fails at the
// timeout naming rank 1, the call it owes and what it last did.
TEST(LocalPointToPoint, PeerThatNeverPostsTimesOutNamingIt) {
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      3,
      [&](Communicator& c) {
        auto& group = dynamic_cast<LocalCommunicator&>(c).group();
        c.barrier();  // #1
        if (c.rank() == 0) {
          HostBuf b(DType::fp32, 4);
          c.recv(b.tensor(), 1);
        } else {
          while (!group.poisoned()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      },
      std::chrono::milliseconds(400));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(err, HasSubstr("recv #1 from rank 1 on rank 0 (fp32, 4 elements) timed out after 400 ms"));
  EXPECT_THAT(err, HasSubstr("rank 1 did not post the matching send #1 from rank 1 to rank 0"));
  EXPECT_THAT(err, HasSubstr("rank 1 last called barrier #1"));
  EXPECT_THAT(err, HasSubstr("Fix:"));
}

// Every rank of a ring sends first: with blocking sends none is ever received. The ranks fail at
// the timeout (not a hang), and the message says that the peer is itself waiting in a send.
TEST(LocalPointToPoint, RingOfSendsFirstTimesOutNamingWhatThePeerWaitsIn) {
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      3,
      [&](Communicator& c) {
        const int w = c.world_size();
        HostBuf out = message(DType::fp32, c.rank(), 0, 3), in(DType::fp32, 3);
        c.send(out.tensor(), (c.rank() + 1) % w);
        c.recv(in.tensor(), (c.rank() + w - 1) % w);
      },
      std::chrono::milliseconds(300));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(err, HasSubstr("timed out after 300 ms"));
  EXPECT_THAT(err, HasSubstr("did not post the matching recv #1"));
  EXPECT_THAT(err, HasSubstr("is waiting in send #1"));
}

// A peer whose function returns without the matching call fails the waiting rank at once.
TEST(LocalPointToPoint, PeerThatFinishedFailsTheWaitingRankAtOnce) {
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        if (c.rank() == 1) return;
        HostBuf b(DType::int32, 2);
        c.send(b.tensor(), 1);
      },
      std::chrono::milliseconds(60'000));
  EXPECT_LT(seconds_since(t0), 30.0);
  EXPECT_THAT(err, HasSubstr("send #1 from rank 0 to rank 1 (int32, 2 elements) cannot complete: rank 1 finished"));
}

// A peer that is this rank, or no rank of the group, is refused where it is passed, naming the
// peer and the world size; the group is poisoned, so a rank waiting for the caller fails too.
TEST(LocalPointToPoint, BadPeersAreErrorsNamingThePeerAndTheWorldSize) {
  struct Case {
    bool send;
    int peer;
    const char* text;
  };
  for (const Case& k : {Case{true, 0, "send on rank 0: peer 0 is this rank itself (world size 3)"},
                        Case{false, 0, "recv on rank 0: peer 0 is this rank itself (world size 3)"},
                        Case{true, 3, "send on rank 0: peer 3 is not a rank of this communicator (world size 3: ranks 0..2)"},
                        Case{false, -1, "recv on rank 0: peer -1 is not a rank of this communicator (world size 3: ranks 0..2)"}}) {
    std::vector<std::string> errors(3);
    const std::string err = run_expecting_error(
        3,
        [&](Communicator& c) {
          try {
            HostBuf b(DType::fp32, 2);
            if (c.rank() == 0) {
              if (k.send) {
                c.send(b.tensor(), k.peer);
              } else {
                c.recv(b.tensor(), k.peer);
              }
            } else if (c.rank() == 1) {
              c.recv(b.tensor(), 0);  // waits for rank 0, which failed instead
            }
          } catch (const Error& e) {
            errors[static_cast<std::size_t>(c.rank())] = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(60'000));
    EXPECT_THAT(err, HasSubstr(k.text));
    EXPECT_THAT(err, HasSubstr("Fix:"));
    EXPECT_EQ(errors[0], err);
    EXPECT_EQ(errors[1], err) << "the waiting rank fails with the cause";
  }
}

// A split child of pairs {0, 1} and {2, 3}: point-to-point in each child uses the child's ranks,
// and its counters, not the parent's, count it.
TEST(LocalPointToPoint, SplitChildrenCommunicateInTheirOwnRanks) {
  constexpr std::int64_t n = 6;
  std::vector<HostBuf> got(4);
  std::vector<CommStats> child_stats(4), parent_stats(4);
  run_local_ranks(4, [&](Communicator& c) {
    std::unique_ptr<Communicator> pair = c.split(c.rank() / 2, c.rank());
    ASSERT_EQ(pair->world_size(), 2);
    const auto r = static_cast<std::size_t>(c.rank());
    const CommStats before = c.stats();
    HostBuf out = message(DType::bf16, c.rank(), 0, n), in(DType::bf16, n);
    if (pair->rank() == 0) {
      pair->send(out.tensor(), 1);
      pair->recv(in.tensor(), 1);
    } else {
      pair->recv(in.tensor(), 0);
      pair->send(out.tensor(), 0);
    }
    got[r] = in;
    child_stats[r] = pair->stats();
    parent_stats[r] = c.stats() - before;
  });
  for (int r = 0; r < 4; ++r) {
    const auto k = static_cast<std::size_t>(r);
    expect_same_bits(got[k], message(DType::bf16, r ^ 1, 0, n), fmt::format("world rank {}", r));
    EXPECT_EQ(child_stats[k].bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * 2);
    EXPECT_EQ(child_stats[k].call_count(CollectiveKind::recv), 1u);
    EXPECT_EQ(parent_stats[k].total_calls(), 0u);
  }
}

// ---- send_recv: a batch of sends and recvs posted at once ----

// Two neighbours each send to the other first, in one batch: with blocking send() this is the
// ring that times out above; batched, neither op waits for the other and the values arrive. Then
// rank 1 lists its recv first: the batch's order does not matter either. A short timeout makes a
// broken batch fail here rather than hang.
TEST(LocalPointToPoint, SendRecvNeighboursThatEachSendFirstDoNotDeadlock) {
  for (bool rank1_recv_first : {false, true}) {
    SCOPED_TRACE(rank1_recv_first ? "rank 1 lists its recv first" : "both list their send first");
    constexpr std::int64_t n = 11;
    std::vector<HostBuf> got(2);
    std::vector<std::uint64_t> sequence(2);
    run_local_ranks(
        2,
        [&](Communicator& c) {
          const int r = c.rank(), other = 1 - r;
          HostBuf out = message(DType::bf16, r, 0, n), in(DType::bf16, n);
          const PointToPointOp send{true, out.tensor(), other}, recv{false, in.tensor(), other};
          if (r == 1 && rank1_recv_first) {
            c.send_recv(std::vector<PointToPointOp>{recv, send});
          } else {
            c.send_recv(std::vector<PointToPointOp>{send, recv});
          }
          got[static_cast<std::size_t>(r)] = in;
          sequence[static_cast<std::size_t>(r)] = c.sequence();
        },
        std::chrono::milliseconds(5'000));
    expect_same_bits(got[0], message(DType::bf16, 1, 0, n), "rank 0 from rank 1");
    expect_same_bits(got[1], message(DType::bf16, 0, 0, n), "rank 1 from rank 0");
    EXPECT_EQ(sequence, (std::vector<std::uint64_t>{0, 0})) << "point-to-point calls are not collectives";
  }
}

// A ring of 4 where every rank's batch is {send to next, recv from previous}: the pipeline's
// steady-state exchange, every dtype, then an all-reduce whose sequence numbers still match.
TEST(LocalPointToPoint, SendRecvRingOfFourEachRankSendsNextAndReceivesPrevious) {
  constexpr int w = 4;
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16, DType::int32, DType::fp64}) {
    SCOPED_TRACE(dtype_name(dt));
    constexpr std::int64_t n = 29;
    std::vector<HostBuf> got(w);
    run_local_ranks(
        w,
        [&](Communicator& c) {
          const int r = c.rank(), next = (r + 1) % w, prev = (r + w - 1) % w;
          HostBuf out = message(dt, r, 0, n), in(dt, n);
          c.send_recv(std::vector<PointToPointOp>{{true, out.tensor(), next}, {false, in.tensor(), prev}});
          got[static_cast<std::size_t>(r)] = in;
          c.barrier();
          EXPECT_EQ(c.sequence(), 1u);
        },
        std::chrono::milliseconds(5'000));
    for (int r = 0; r < w; ++r) expect_same_bits(got[static_cast<std::size_t>(r)], message(dt, (r + w - 1) % w, 0, n), fmt::format("rank {}", r));
  }
}

// Rank 0's batch sends two messages to rank 1 and receives one from it, then rank 0 sends a third
// standalone; rank 1 receives the first standalone, then in one batch receives the second and
// the third and sends its own. The pair's order counts standalone and batched calls alike: each
// message lands in the recv of its number.
TEST(LocalPointToPoint, SendRecvWithOnePeerKeepsThePairsOrderAcrossBatchedAndStandaloneCalls) {
  constexpr std::int64_t n = 7;
  std::vector<HostBuf> got(4);
  std::vector<std::uint64_t> numbers;
  run_local_ranks(
      2,
      [&](Communicator& c) {
        if (c.rank() == 0) {
          HostBuf a = message(DType::fp32, 0, 1, n), b = message(DType::fp32, 0, 2, n), x(DType::fp32, n), third = message(DType::fp32, 0, 3, n);
          c.send_recv(std::vector<PointToPointOp>{{true, a.tensor(), 1}, {false, x.tensor(), 1}, {true, b.tensor(), 1}});
          c.send(third.tensor(), 1);
          got[3] = x;
          numbers.push_back(c.sends_to(1));
          numbers.push_back(c.recvs_from(1));
          return;
        }
        for (int k = 0; k < 3; ++k) got[static_cast<std::size_t>(k)] = HostBuf(DType::fp32, n);
        HostBuf mine = message(DType::fp32, 1, 9, n);
        c.recv(got[0].tensor(), 0);
        c.send_recv(std::vector<PointToPointOp>{{false, got[1].tensor(), 0}, {true, mine.tensor(), 0}, {false, got[2].tensor(), 0}});
      },
      std::chrono::milliseconds(5'000));
  expect_same_bits(got[0], message(DType::fp32, 0, 1, n), "send #1 (batched) into the standalone recv #1");
  expect_same_bits(got[1], message(DType::fp32, 0, 2, n), "send #2 (batched) into recv #2 (batched)");
  expect_same_bits(got[2], message(DType::fp32, 0, 3, n), "send #3 (standalone) into recv #3 (batched)");
  expect_same_bits(got[3], message(DType::fp32, 1, 9, n), "rank 1's send into rank 0's batch");
  EXPECT_EQ(numbers, (std::vector<std::uint64_t>{3, 1}));
}

// A batch of 4: every rank sends to both neighbours and receives from both, the recvs listed first
// on odd ranks. With W = 2 both neighbours are one peer, so two sends and two recvs of one pair
// share a batch and match in their batch order. stats() counts each op as its own send or recv.
TEST(LocalPointToPoint, SendRecvFourOpsToBothNeighboursAndTheirCounts) {
  for (int w : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("W={}", w));
    constexpr std::int64_t n = 13;
    std::vector<HostBuf> from_prev(static_cast<std::size_t>(w)), from_next(static_cast<std::size_t>(w));
    std::vector<CommStats> stats(static_cast<std::size_t>(w));
    std::vector<std::uint64_t> sequence(static_cast<std::size_t>(w));
    run_local_ranks(
        w,
        [&](Communicator& c) {
          const int r = c.rank(), next = (r + 1) % w, prev = (r + w - 1) % w;
          HostBuf to_next = message(DType::fp32, r, 1, n), to_prev = message(DType::bf16, r, 2, n);
          HostBuf in_prev(DType::fp32, n), in_next(DType::bf16, n);
          const PointToPointOp s1{true, to_next.tensor(), next}, s2{true, to_prev.tensor(), prev};
          const PointToPointOp r1{false, in_prev.tensor(), prev}, r2{false, in_next.tensor(), next};
          if (r % 2 == 0) {
            c.send_recv(std::vector<PointToPointOp>{s1, s2, r1, r2});
          } else {
            c.send_recv(std::vector<PointToPointOp>{r1, r2, s1, s2});
          }
          from_prev[static_cast<std::size_t>(r)] = in_prev;
          from_next[static_cast<std::size_t>(r)] = in_next;
          stats[static_cast<std::size_t>(r)] = c.stats();
          sequence[static_cast<std::size_t>(r)] = c.sequence();
        },
        std::chrono::milliseconds(5'000));
    for (int r = 0; r < w; ++r) {
      const auto k = static_cast<std::size_t>(r);
      expect_same_bits(from_prev[k], message(DType::fp32, (r + w - 1) % w, 1, n), fmt::format("rank {} from its previous", r));
      expect_same_bits(from_next[k], message(DType::bf16, (r + 1) % w, 2, n), fmt::format("rank {} from its next", r));
      EXPECT_EQ(stats[k].bytes_sent(CollectiveKind::send), static_cast<std::uint64_t>(n) * (4 + 2)) << "rank " << r;
      EXPECT_EQ(stats[k].call_count(CollectiveKind::send), 2u);
      EXPECT_EQ(stats[k].bytes_sent(CollectiveKind::recv), 0u);
      EXPECT_EQ(stats[k].call_count(CollectiveKind::recv), 2u);
      EXPECT_EQ(stats[k].total_calls(), 4u);
      EXPECT_EQ(sequence[k], 0u);
    }
  }
}

// No op of a batch waits for another, the recvs included: rank 0 receives from rank 1 and from
// rank 2 in one batch, listing rank 1 first, but rank 1 sends only after it received from rank 2,
// which sends to rank 1 only after rank 0 took its message. Completing the recvs in batch order
// would deadlock.
TEST(LocalPointToPoint, SendRecvRecvsCompleteAsTheirPeersPostNotInBatchOrder) {
  constexpr std::int64_t n = 3;
  std::vector<HostBuf> got(3);
  run_local_ranks(
      3,
      [&](Communicator& c) {
        HostBuf mine = message(DType::fp32, c.rank(), 0, n);
        if (c.rank() == 0) {
          got[0] = HostBuf(DType::fp32, n);
          got[1] = HostBuf(DType::fp32, n);
          c.send_recv(std::vector<PointToPointOp>{{false, got[0].tensor(), 1}, {false, got[1].tensor(), 2}});
        } else if (c.rank() == 1) {
          HostBuf in(DType::fp32, n);
          c.recv(in.tensor(), 2);
          c.send(in.tensor(), 0);  // rank 2's message, forwarded
        } else {
          c.send(mine.tensor(), 0);
          c.send(mine.tensor(), 1);
        }
      },
      std::chrono::milliseconds(5'000));
  expect_same_bits(got[0], message(DType::fp32, 2, 0, n), "rank 2's message through rank 1");
  expect_same_bits(got[1], message(DType::fp32, 2, 0, n), "rank 2's message");
}

// An empty batch returns at once, on one rank alone, counting nothing.
TEST(LocalPointToPoint, SendRecvEmptyBatchReturnsAtOnce) {
  CommStats stats;
  run_local_ranks(
      2,
      [&](Communicator& c) {
        if (c.rank() != 0) return;
        c.send_recv({});
        stats = c.stats();
      },
      std::chrono::milliseconds(5'000));
  EXPECT_EQ(stats.total_calls(), 0u);
}

// A recv in a batch of another size or dtype than its send fails on both ranks with one message
// naming both calls, while the other op of each batch is fine.
TEST(LocalPointToPoint, SendRecvSizeOrDtypeMismatchInABatchFailsOnBothRanks) {
  struct Case {
    DType recv_dtype;
    std::int64_t recv_n;
    const char* recv_text;
  };
  for (const Case& k : {Case{DType::fp32, 6, "recv #1 from rank 0 on rank 1 (fp32, 6 elements)"},
                        Case{DType::bf16, 8, "recv #1 from rank 0 on rank 1 (bf16, 8 elements)"}}) {
    std::vector<std::string> errors(2);
    const std::string err = run_expecting_error(
        2,
        [&](Communicator& c) {
          try {
            HostBuf back(DType::int32, 3);
            if (c.rank() == 0) {
              HostBuf b(DType::fp32, 8);
              c.send_recv(std::vector<PointToPointOp>{{true, b.tensor(), 1}, {false, back.tensor(), 1}});
            } else {
              HostBuf b(k.recv_dtype, k.recv_n);
              c.send_recv(std::vector<PointToPointOp>{{true, back.tensor(), 0}, {false, b.tensor(), 0}});
            }
          } catch (const Error& e) {
            errors[static_cast<std::size_t>(c.rank())] = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(20'000));
    EXPECT_THAT(err, HasSubstr("point-to-point mismatch"));
    EXPECT_THAT(err, HasSubstr("rank 0 called send #1 from rank 0 to rank 1 (fp32, 8 elements)"));
    EXPECT_THAT(err, HasSubstr(std::string("rank 1 called ") + k.recv_text));
    EXPECT_THAT(err, HasSubstr("Fix:"));
    EXPECT_EQ(errors[0], err) << "rank 0";
    EXPECT_EQ(errors[1], err) << "rank 1";
  }
}

// Rank 0's batch sends to rank 1 (which receives it) and receives from rank 2, which never sends
// (it is busy, not finished): rank 0 fails at the timeout naming rank 2, the call it owes and what
// it last did. A batch whose send is never received fails naming the missing recv.
TEST(LocalPointToPoint, SendRecvPeerThatNeverPostsTimesOutNamingIt) {
  const auto t0 = Clock::now();
  const std::string err = run_expecting_error(
      3,
      [&](Communicator& c) {
        auto& group = dynamic_cast<LocalCommunicator&>(c).group();
        c.barrier();  // #1
        HostBuf b(DType::fp32, 4), in(DType::fp32, 4);
        if (c.rank() == 0) {
          c.send_recv(std::vector<PointToPointOp>{{true, b.tensor(), 1}, {false, in.tensor(), 2}});
        } else if (c.rank() == 1) {
          c.recv(in.tensor(), 0);
        }
        while (!group.poisoned()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      std::chrono::milliseconds(400));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_THAT(err, HasSubstr("recv #1 from rank 2 on rank 0 (fp32, 4 elements) timed out after 400 ms"));
  EXPECT_THAT(err, HasSubstr("rank 2 did not post the matching send #1 from rank 2 to rank 0"));
  EXPECT_THAT(err, HasSubstr("rank 2 last called barrier #1"));
  EXPECT_THAT(err, HasSubstr("Fix:"));

  const std::string send_err = run_expecting_error(
      2,
      [&](Communicator& c) {
        auto& group = dynamic_cast<LocalCommunicator&>(c).group();
        HostBuf b(DType::fp16, 6);
        if (c.rank() == 0) c.send_recv(std::vector<PointToPointOp>{{true, b.tensor(), 1}});
        while (!group.poisoned()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      std::chrono::milliseconds(300));
  EXPECT_THAT(send_err, HasSubstr("send #1 from rank 0 to rank 1 (fp16, 6 elements) timed out after 300 ms"));
  EXPECT_THAT(send_err, HasSubstr("rank 1 did not post the matching recv #1 from rank 0 on rank 1"));
}

// A bad op is refused before anything of the batch is posted, naming the op; a recv whose buffer
// overlaps another op's is refused too (the ops run at the same time). The waiting peer fails with
// the cause.
TEST(LocalPointToPoint, SendRecvBadOpsAreErrorsNamingTheOp) {
  struct Case {
    int which;
    const char* text;
  };
  for (const Case& k : {Case{0, "send (op 2 of 2 of a send_recv batch) on rank 0: peer 0 is this rank itself (world size 2)"},
                        Case{1, "recv (op 2 of 2 of a send_recv batch) on rank 0: peer 5 is not a rank of this communicator"},
                        Case{2, "send_recv on rank 0: the buffer of op 2 (recv from rank 1) overlaps the buffer of op 1 (send to rank 1)"}}) {
    std::vector<std::string> errors(2);
    const std::string err = run_expecting_error(
        2,
        [&](Communicator& c) {
          try {
            HostBuf b(DType::fp32, 8), other(DType::fp32, 8);
            if (c.rank() == 0) {
              const Tensor half(static_cast<char*>(b.tensor().data) + 16, DType::fp32, Shape{4});
              const PointToPointOp second = k.which == 0   ? PointToPointOp{true, other.tensor(), 0}
                                            : k.which == 1 ? PointToPointOp{false, other.tensor(), 5}
                                                           : PointToPointOp{false, half, 1};
              c.send_recv(std::vector<PointToPointOp>{{true, b.tensor(), 1}, second});
            } else {
              c.recv(b.tensor(), 0);  // waits for rank 0, which failed instead
            }
          } catch (const Error& e) {
            errors[static_cast<std::size_t>(c.rank())] = e.what();
            throw;
          }
        },
        std::chrono::milliseconds(60'000));
    EXPECT_THAT(err, HasSubstr(k.text));
    EXPECT_THAT(err, HasSubstr("Fix:"));
    EXPECT_EQ(errors[0], err);
    EXPECT_EQ(errors[1], err) << "the waiting rank fails with the cause";
  }
}

// ---- start_send_recv / wait: the non-blocking batch the pipeline overlaps compute with ----

// start_send_recv returns before the peer has posted anything: rank 0 starts a send and a recv,
// then tells rank 1 (through shared memory, not the communicator) that it got past the start; only
// then does rank 1 post its matching calls. With a start that waited for its peer, rank 0 could
// never say so (rank 1 gives up after 20 s and posts anyway, so a regression fails, not hangs).
TEST(LocalPointToPoint, StartSendRecvReturnsBeforeThePeerPosts) {
  constexpr std::int64_t n = 13;
  std::atomic<bool> started{false};
  bool seen_before_posting = false;
  HostBuf got0(DType::fp32, n), got1(DType::fp32, n);
  run_local_ranks(
      2,
      [&](Communicator& c) {
        const int r = c.rank(), other = 1 - r;
        HostBuf out = message(DType::fp32, r, 0, n);
        HostBuf& in = r == 0 ? got0 : got1;
        const std::vector<PointToPointOp> ops{{true, out.tensor(), other}, {false, in.tensor(), other}};
        if (r == 0) {
          PointToPointRequest request = c.start_send_recv(ops);
          EXPECT_TRUE(request.pending());
          started = true;  // rank 1 has posted nothing yet
          request.wait();
          EXPECT_FALSE(request.pending());
        } else {
          const Clock::time_point t0 = Clock::now();
          while (!started && seconds_since(t0) < 20.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          seen_before_posting = started;
          c.send_recv(ops);
        }
      },
      std::chrono::milliseconds(60'000));
  EXPECT_TRUE(seen_before_posting) << "start_send_recv waited for its peer";
  expect_same_bits(got0, message(DType::fp32, 1, 0, n), "rank 0 from rank 1");
  expect_same_bits(got1, message(DType::fp32, 0, 0, n), "rank 1 from rank 0");
}

// Started requests keep the pair's FIFO numbering whatever order they are waited in, mixed with
// blocking calls, and are counted in stats() once waited for.
TEST(LocalPointToPoint, StartedRequestsKeepThePairsOrderWaitedInAnyOrder) {
  constexpr std::int64_t n = 7;
  std::vector<HostBuf> got(4, HostBuf(DType::int32, n));
  std::vector<std::uint64_t> sends(2), recvs(2), send_calls(2), recv_calls(2);
  run_local_ranks(
      2,
      [&](Communicator& c) {
        std::vector<HostBuf> out;
        for (int k = 0; k < 4; ++k) out.push_back(message(DType::int32, c.rank(), k, n));
        if (c.rank() == 0) {
          std::vector<PointToPointRequest> requests;
          for (int k = 0; k < 3; ++k) requests.push_back(c.start_send_recv(std::vector<PointToPointOp>{{true, out[static_cast<std::size_t>(k)].tensor(), 1}}));
          c.send(out[3].tensor(), 1);  // send #4, blocking, while #1..#3 are pending
          for (int k = 2; k >= 0; --k) c.wait(requests[static_cast<std::size_t>(k)]);
        } else {
          std::vector<PointToPointRequest> requests;
          for (int k = 0; k < 4; ++k) requests.push_back(c.start_send_recv(std::vector<PointToPointOp>{{false, got[static_cast<std::size_t>(k)].tensor(), 0}}));
          for (int k : {3, 1, 0, 2}) requests[static_cast<std::size_t>(k)].wait();
        }
        const auto r = static_cast<std::size_t>(c.rank());
        sends[r] = c.sends_to(1 - c.rank());
        recvs[r] = c.recvs_from(1 - c.rank());
        send_calls[r] = c.stats().call_count(CollectiveKind::send);
        recv_calls[r] = c.stats().call_count(CollectiveKind::recv);
      },
      std::chrono::milliseconds(5'000));
  for (int k = 0; k < 4; ++k) expect_same_bits(got[static_cast<std::size_t>(k)], message(DType::int32, 0, k, n), fmt::format("message {}", k + 1));
  EXPECT_EQ(sends, (std::vector<std::uint64_t>{4, 0}));
  EXPECT_EQ(recvs, (std::vector<std::uint64_t>{0, 4}));
  EXPECT_EQ(send_calls, (std::vector<std::uint64_t>{4, 0}));
  EXPECT_EQ(recv_calls, (std::vector<std::uint64_t>{0, 4}));
}

// A started request whose peer never posts fails in wait() at the timeout, naming the op, both
// ranks and what the peer is doing.
TEST(LocalPointToPoint, StartedRequestTimesOutInWaitNamingBothRanks) {
  std::atomic<bool> done{false};
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        HostBuf buf(DType::fp32, 5);
        if (c.rank() == 0) {
          PointToPointRequest request = c.start_send_recv(std::vector<PointToPointOp>{{true, buf.tensor(), 1}});
          try {
            request.wait();
          } catch (...) {
            done = true;
            throw;
          }
        } else {
          while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // busy elsewhere, never posting
        }
      },
      std::chrono::milliseconds(300));
  EXPECT_THAT(err, HasSubstr("send #1 from rank 0 to rank 1 (fp32, 5 elements) timed out after 300 ms"));
  EXPECT_THAT(err, HasSubstr("rank 1 did not post the matching recv #1 from rank 0 on rank 1"));
  EXPECT_THAT(err, HasSubstr("Fix:"));
}

// A request destroyed without wait() withdraws its unmatched ops and fails the peer at once, naming
// the abandoned op (at the timeout the peer's error would be its own timeout instead).
TEST(LocalPointToPoint, AbandonedRequestFailsThePeerNamingTheOp) {
  std::atomic<bool> abandoned{false};
  const std::string err = run_expecting_error(
      2,
      [&](Communicator& c) {
        HostBuf buf(DType::fp32, 3);
        if (c.rank() == 0) {
          { PointToPointRequest request = c.start_send_recv(std::vector<PointToPointOp>{{true, buf.tensor(), 1}}); }
          abandoned = true;
          c.barrier();  // fails with the poison
        } else {
          while (!abandoned) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          c.recv(buf.tensor(), 0);
        }
      },
      std::chrono::milliseconds(30'000));
  EXPECT_THAT(err, HasSubstr("rank 0 destroyed a point-to-point request without waiting for it"));
  EXPECT_THAT(err, HasSubstr("send #1 from rank 0 to rank 1 (fp32, 3 elements)"));
}
