// The node layout of a communicator (Communicator::set_nodes, node_of, node_count, ranks_on_node)
// and the cross-node bytes stats() counts with it, on the local backend: 4 ranks as 2 nodes of 2
// (blocks) and 8 ranks as 2 nodes of 4 (round robin), each collective kind once, every rank's
// CommStats::cross_node_bytes per kind compared with values computed by hand from the pairwise
// model (zero/communicator.h, cross_node_bytes_sent); one node gives zeros; split children inherit
// the nodes (per-node groups: one node, no cross bytes; same-local-index groups: two nodes), with
// the inherit exchange counted only when the parent spans nodes; a CommsLogger wrapper takes its
// inner communicator's nodes without a second exchange; bad set_nodes vectors are Errors.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
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

constexpr std::size_t idx(CollectiveKind k) { return static_cast<std::size_t>(k); }

// Elements rank r sends rank j in the all_to_all_v (uneven: every pair differs).
std::int64_t a2av_count(int r, int j) { return r + 2 * j + 1; }

// Every collective kind once on `c`, with fp32 buffers: all_reduce of 2W elements (N = 8W bytes),
// reduce_scatter of a 2W send buffer, all_gather into a 2W recv buffer, broadcast of 2W from root
// W/2 + 1, all_to_all of 2W, exchange_counts (W int64), all_to_all_v with a2av_count, a
// send_recv ring (8 elements to rank + 1, from rank − 1), and a barrier.
void run_every_kind(Communicator& c) {
  const int w = c.world_size();
  const int r = c.rank();
  const std::int64_t n = 2 * w;
  HostBuf ar(DType::fp32, n);
  for (std::int64_t i = 0; i < n; ++i) ar.set(i, static_cast<double>(r + i));
  c.all_reduce(ar.tensor(), ReduceOp::sum);
  HostBuf rs_send(DType::fp32, n), rs_recv(DType::fp32, 2);
  for (std::int64_t i = 0; i < n; ++i) rs_send.set(i, 1.0);
  c.reduce_scatter(rs_send.tensor(), rs_recv.tensor(), ReduceOp::sum);
  HostBuf ag_send(DType::fp32, 2), ag_recv(DType::fp32, n);
  c.all_gather(ag_send.tensor(), ag_recv.tensor());
  HostBuf bc(DType::fp32, n);
  c.broadcast(bc.tensor(), w / 2 + 1);
  HostBuf a2a_send(DType::fp32, n), a2a_recv(DType::fp32, n);
  c.all_to_all(a2a_send.tensor(), a2a_recv.tensor());
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(w)), recv_counts(static_cast<std::size_t>(w));
  std::int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < w; ++j) {
    send_counts[static_cast<std::size_t>(j)] = a2av_count(r, j);
    recv_counts[static_cast<std::size_t>(j)] = a2av_count(j, r);
    send_total += a2av_count(r, j);
    recv_total += a2av_count(j, r);
  }
  const std::vector<std::int64_t> got = c.exchange_counts(send_counts);
  EXPECT_EQ(got, recv_counts);
  HostBuf v_send(DType::fp32, send_total), v_recv(DType::fp32, recv_total);
  c.all_to_all_v(v_send.tensor(), send_counts, v_recv.tensor(), recv_counts);
  HostBuf p_send(DType::fp32, 8), p_recv(DType::fp32, 8);
  const PointToPointOp ops[] = {{true, p_send.tensor(), (r + 1) % w}, {false, p_recv.tensor(), (r + w - 1) % w}};
  c.send_recv(ops);
  c.barrier();
}

// Expected cross-node bytes of one rank, per kind (exchange_counts is an all_to_all).
struct Expected {
  std::uint64_t all_reduce, reduce_scatter, all_gather, broadcast, all_to_all /* of 2W fp32 */, exchange, all_to_all_v, send;
};

void check_rank(const CommStats& s, const Expected& e, int rank) {
  SCOPED_TRACE(fmt::format("rank {}", rank));
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::all_reduce), e.all_reduce);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::reduce_scatter), e.reduce_scatter);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::all_gather), e.all_gather);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::broadcast), e.broadcast);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::all_to_all), e.all_to_all + e.exchange);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::all_to_all_v), e.all_to_all_v);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::send), e.send);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::recv), 0u);
  EXPECT_EQ(s.cross_node_bytes_sent(CollectiveKind::barrier), 0u);
  EXPECT_EQ(s.total_cross_node_bytes(),
            e.all_reduce + e.reduce_scatter + e.all_gather + e.broadcast + e.all_to_all + e.exchange + e.all_to_all_v + e.send);
}

void check_layout(const std::vector<int>& nodes, const std::vector<Expected>& expected) {
  const int w = static_cast<int>(nodes.size());
  std::vector<CommStats> stats(static_cast<std::size_t>(w));
  run_local_ranks(w, [&](Communicator& c) {
    c.set_nodes(nodes);
    EXPECT_EQ(c.node_count(), 2);
    EXPECT_EQ(c.ranks_on_node(0), w / 2);
    EXPECT_EQ(c.ranks_on_node(1), w / 2);
    EXPECT_EQ(c.ranks_on_node(2), 0);
    for (int r = 0; r < w; ++r) EXPECT_EQ(c.node_of(r), nodes[static_cast<std::size_t>(r)]);
    run_every_kind(c);
    stats[static_cast<std::size_t>(c.rank())] = c.stats();
  });
  for (int r = 0; r < w; ++r) check_rank(stats[static_cast<std::size_t>(r)], expected[static_cast<std::size_t>(r)], r);
}

}  // namespace

// 4 ranks, nodes {0, 0, 1, 1}: o = 2 for every rank, W = 4, N = 32 bytes (8 fp32).
//   all_reduce 2·2·32/4 = 32; reduce_scatter, all_gather, all_to_all 2·32/4 = 16; exchange_counts
//   (N = 8·4 = 32) 16; broadcast from root 3: 32·(2 − 1) = 32 on rank 3; all_to_all_v: the blocks
//   to the other node, 4 bytes × (r + 2j + 1) — rank 0: j = 2, 3: 5 + 7 = 12 → 48; rank 1: 6 + 8 →
//   56; rank 2: j = 0, 1: 3 + 5 → 32; rank 3: 4 + 6 → 40; the ring's sends (32 bytes): 1 → 2 and
//   3 → 0 cross, 0 → 1 and 2 → 3 do not.
TEST(CommunicatorNodes, FourRanksOnTwoNodesCountEachKindsCrossNodeBytes) {
  check_layout({0, 0, 1, 1}, {{32, 16, 16, 0, 16, 16, 48, 0},
                              {32, 16, 16, 0, 16, 16, 56, 32},
                              {32, 16, 16, 0, 16, 16, 32, 0},
                              {32, 16, 16, 32, 16, 16, 40, 32}});
}

// 8 ranks, nodes round robin {0, 1, 0, 1, ...}: o = 4, W = 8, N = 64 bytes (16 fp32).
//   all_reduce 2·4·64/8 = 64; reduce_scatter, all_gather, all_to_all 4·64/8 = 32; exchange_counts
//   (N = 64) 32; broadcast from root 5: 64 on rank 5; all_to_all_v: rank r even sends to j = 1, 3,
//   5, 7: Σ(r + 2j + 1) = 4r + 36 elements → 16r + 144 bytes; r odd to j = 0, 2, 4, 6: 4r + 28 →
//   16r + 112; every ring neighbour is on the other node: 32 bytes sent across by every rank.
TEST(CommunicatorNodes, EightRanksRoundRobinOnTwoNodesCountEachKindsCrossNodeBytes) {
  std::vector<Expected> e;
  const std::uint64_t a2av[] = {144, 128, 176, 160, 208, 192, 240, 224};
  for (int r = 0; r < 8; ++r) e.push_back({64, 32, 32, r == 5 ? 64u : 0u, 32, 32, a2av[r], 32});
  check_layout({0, 1, 0, 1, 0, 1, 0, 1}, e);
}

TEST(CommunicatorNodes, OneNodeCountsNoCrossNodeBytes) {
  for (const bool given : {false, true}) {
    SCOPED_TRACE(given ? "every rank on node 3" : "the default");
    run_local_ranks(4, [&](Communicator& c) {
      if (given) c.set_nodes({3, 3, 3, 3});
      EXPECT_EQ(c.node_count(), 1);
      EXPECT_EQ(c.ranks_on_node(given ? 3 : 0), 4);
      run_every_kind(c);
      EXPECT_EQ(c.stats().total_cross_node_bytes(), 0u);
      EXPECT_GT(c.stats().total_bytes_sent(), 0u);  // the traffic itself is counted as ever
    });
  }
}

TEST(CommunicatorNodes, BlockingSendCountsCrossNodeBytesOnTheSender) {
  // 4 ranks on nodes {0, 0, 1, 1}: ranks 0 and 1 send 40 bytes to rank + 2 (the other node), then
  // 20 bytes to each other (same node).
  run_local_ranks(4, [&](Communicator& c) {
    c.set_nodes({0, 0, 1, 1});
    HostBuf big(DType::fp32, 10), small(DType::fp32, 5);
    const int r = c.rank();
    if (r < 2) {
      c.send(big.tensor(), r + 2);
      if (r == 0) {
        c.send(small.tensor(), 1);
      } else {
        c.recv(small.tensor(), 0);
      }
    } else {
      c.recv(big.tensor(), r - 2);
    }
    EXPECT_EQ(c.stats().cross_node_bytes_sent(CollectiveKind::send), r < 2 ? 40u : 0u);
    EXPECT_EQ(c.stats().cross_node_bytes_sent(CollectiveKind::recv), 0u);
    EXPECT_EQ(c.stats().bytes_sent(CollectiveKind::send), r == 0 ? 60u : (r == 1 ? 40u : 0u));
  });
}

TEST(CommunicatorNodes, CrossNodeBytesFormula) {
  // W = 8, o = 4, two nodes, N = 1000 bytes.
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_reduce, 1000, 8, 4, 2), 1000u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::reduce_scatter, 1000, 8, 4, 2), 500u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_gather, 1000, 8, 4, 2), 500u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_to_all, 1000, 8, 4, 2), 500u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::broadcast, 1000, 8, 6, 4, true), 3000u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::broadcast, 1000, 8, 6, 4, false), 0u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::barrier, 1000, 8, 4, 2), 0u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::send, 1000, 8, 1, 2), 1000u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::send, 1000, 8, 0, 2), 0u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::recv, 1000, 8, 1, 2), 0u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_to_all_v, 123, 8, 4, 2), 123u);
  // One node: nothing crosses.
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_reduce, 1000, 8, 0, 1), 0u);
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::broadcast, 1000, 8, 0, 1, true), 0u);
  // 3 nodes of sizes 3, 3, 2 (W = 8), a rank of the 2-rank node: o = 6; all_reduce 2·6·80/8 = 120.
  EXPECT_EQ(cross_node_bytes_sent(CollectiveKind::all_reduce, 80, 8, 6, 3), 120u);
}

TEST(CommunicatorNodes, StatsDifferenceSubtractsCrossNodeBytes) {
  CommStats a, b;
  a.cross_node_bytes[idx(CollectiveKind::all_gather)] = 100;
  b.cross_node_bytes[idx(CollectiveKind::all_gather)] = 30;
  a.cross_node_bytes[idx(CollectiveKind::send)] = 7;
  const CommStats d = a - b;
  EXPECT_EQ(d.cross_node_bytes_sent(CollectiveKind::all_gather), 70u);
  EXPECT_EQ(d.cross_node_bytes_sent(CollectiveKind::send), 7u);
  EXPECT_EQ(d.total_cross_node_bytes(), 77u);
}

// 8 ranks on nodes {0,0,0,0,1,1,1,1}: the per-node groups (color = node) have one node; the groups
// of one local index across nodes (color = r % 4) have two. The inherit exchange (one all_to_all
// of 8·W bytes on the child) happens because the parent spans nodes.
TEST(CommunicatorNodes, SplitChildrenInheritTheNodes) {
  run_local_ranks(8, [&](Communicator& c) {
    c.set_nodes({0, 0, 0, 0, 1, 1, 1, 1});
    const int r = c.rank();
    std::unique_ptr<Communicator> per_node = c.split(r / 4, r);
    EXPECT_EQ(per_node->world_size(), 4);
    EXPECT_EQ(per_node->node_count(), 1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(per_node->node_of(i), r / 4);  // the parent's ids, kept
    EXPECT_EQ(per_node->ranks_on_node(r / 4), 4);
    EXPECT_EQ(per_node->sequence(), 1u);  // the inherit exchange
    EXPECT_EQ(per_node->stats().call_count(CollectiveKind::all_to_all), 1u);
    EXPECT_EQ(per_node->stats().bytes_sent(CollectiveKind::all_to_all), 3u * 32u / 4u);  // (W−1)·8W/W, W = 4
    HostBuf buf(DType::fp32, 8);
    per_node->all_reduce(buf.tensor(), ReduceOp::sum);
    EXPECT_EQ(per_node->stats().total_cross_node_bytes(), 0u);

    std::unique_ptr<Communicator> across = c.split(r % 4, r);
    EXPECT_EQ(across->world_size(), 2);
    EXPECT_EQ(across->node_count(), 2);
    EXPECT_EQ(across->node_of(0), 0);  // members r % 4 and r % 4 + 4
    EXPECT_EQ(across->node_of(1), 1);
    EXPECT_EQ(across->sequence(), 1u);
    EXPECT_EQ(across->stats().total_cross_node_bytes(), 0u);  // the exchange ran before the nodes were known
    across->all_reduce(buf.tensor(), ReduceOp::sum);          // 32 bytes, W = 2, o = 1: 2·1·32/2 = 32
    EXPECT_EQ(across->stats().cross_node_bytes_sent(CollectiveKind::all_reduce), 32u);

    // A child of a child: the two-node group split into singletons by node keeps one node each.
    std::unique_ptr<Communicator> single = across->split(across->rank(), 0);
    EXPECT_EQ(single->node_count(), 1);
    EXPECT_EQ(single->node_of(0), r / 4);
    EXPECT_EQ(single->sequence(), 1u);
  });
}

TEST(CommunicatorNodes, SplitOnOneNodeIssuesNoExchange) {
  run_local_ranks(4, [&](Communicator& c) {
    std::unique_ptr<Communicator> child = c.split(c.rank() % 2, 0);
    EXPECT_EQ(child->sequence(), 0u);
    EXPECT_EQ(child->stats().total_calls(), 0u);
    EXPECT_EQ(child->node_count(), 1);
    // Nodes set to one id other than 0: still one node, still no exchange.
    c.set_nodes({2, 2, 2, 2});
    std::unique_ptr<Communicator> again = c.split(c.rank() % 2, 0);
    EXPECT_EQ(again->sequence(), 0u);
  });
}

TEST(CommunicatorNodes, CommsLoggerTakesItsInnerCommunicatorsNodes) {
  run_local_ranks(4, [&](Communicator& c) {
    c.set_nodes({0, 0, 1, 1});
    CommsLogger logger(c, CommsLoggerOptions{});
    EXPECT_EQ(logger.node_count(), 2);
    EXPECT_EQ(logger.log().node_count(), 2);
    HostBuf buf(DType::fp32, 8);
    logger.all_reduce(buf.tensor(), ReduceOp::sum);  // 2·2·32/4 = 32
    EXPECT_EQ(logger.stats().cross_node_bytes_sent(CollectiveKind::all_reduce), 32u);
    ASSERT_EQ(logger.log().rows().size(), 1u);
    EXPECT_EQ(logger.log().rows()[0].cross_node_bytes, 32u);
    // The logger's child wraps the inner's child, which inherited the nodes: no second exchange.
    std::unique_ptr<Communicator> child = logger.split(c.rank() % 2, 0);
    EXPECT_EQ(child->node_count(), 2);
    EXPECT_EQ(child->sequence(), 0u);
  });
}

TEST(CommunicatorNodes, CommsTableHasACrossNodeColumnOnlyWhenAsked) {
  CommsLogRow row;
  row.op = "all_reduce";
  row.msg_bytes = 2048;
  row.count = 1;
  row.cross_node_bytes = 4096;
  const std::string plain = format_comms_table({row});
  const std::string cross = format_comms_table({row}, true);
  EXPECT_THAT(plain, ::testing::Not(HasSubstr("Cross-node")));
  EXPECT_THAT(cross, HasSubstr("Cross-node Bytes"));
  EXPECT_THAT(cross, HasSubstr("4.0 KB"));
}

TEST(CommunicatorNodes, SetNodesErrors) {
  run_local_ranks(4, [&](Communicator& c) {
    const auto error_of = [&](std::vector<int> nodes) -> std::string {
      try {
        c.set_nodes(std::move(nodes));
      } catch (const Error& e) {
        return e.what();
      }
      return "(no error)";
    };
    EXPECT_THAT(error_of({0, 0, 1}), HasSubstr("3 node ids for a group of 4 ranks"));
    EXPECT_THAT(error_of({0, 0, -1, 1}), HasSubstr("rank 2 has node id -1"));
    EXPECT_EQ(c.node_count(), 1);  // a refused vector changes nothing
    try {
      (void)c.node_of(4);
      ADD_FAILURE() << "node_of(4) on 4 ranks did not throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 4 is outside"));
    }
    EXPECT_THROW((void)c.node_of(-1), Error);
  });
}
