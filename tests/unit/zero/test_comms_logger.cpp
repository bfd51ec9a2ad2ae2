// CommsLogger (the comms_logger section): DeepSpeed's calc_bw_log, convert_size and log_all table
// against values computed by hand and by DeepSpeed's own Python (comms_logging.py, run on the same
// inputs), and the decorator over a LocalCommunicator with a fake clock: counts, message sizes,
// latencies, trimmed means, prof_ops filtering, verbose lines, and that the collectives still
// compute what the inner communicator computes.
#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/comms_logger.h"
#include "zero/local_communicator.h"

using namespace dstrain;

namespace {

// Hands out the latencies in order: the first call of each pair starts a collective, the second
// ends it `latencies[i]` ms later.
struct FakeClock {
  std::vector<double> latencies;
  std::size_t next = 0;
  bool started = false;
  double now = 100.0;
  double operator()() {
    if (started) now += latencies.at(next++);
    started = !started;
    return now;
  }
};

TEST(CommsLogger, BandwidthFormulasAgainstHandComputedValues) {
  // S = 1e6 bytes, t = 2 ms, n = 4: S/t = 5e5 bytes/ms = 4 Gbps (· 8 / 1e6).
  const auto bw = [](CollectiveKind k) { return comm_bandwidth(k, 1'000'000, 2.0, 4); };
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_reduce).algbw_gbps, 8.0);   // 2S/t
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_reduce).busbw_gbps, 6.0);   // S/t · 2·3/4
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_gather).algbw_gbps, 16.0);  // the input is one of 4 shards
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_gather).busbw_gbps, 12.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::reduce_scatter).algbw_gbps, 4.0);  // the input is the whole buffer
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::reduce_scatter).busbw_gbps, 3.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_to_all).algbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::all_to_all).busbw_gbps, 3.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::broadcast).algbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::broadcast).busbw_gbps, 4.0);
  // send and recv: DeepSpeed's "send", "recv" row of calc_bw_log, busbw = algbw = S/t.
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::send).algbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::send).busbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::recv).algbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(bw(CollectiveKind::recv).busbw_gbps, 4.0);
  EXPECT_DOUBLE_EQ(comm_bandwidth(CollectiveKind::barrier, 0, 2.0, 4).busbw_gbps, 0.0);
  EXPECT_DOUBLE_EQ(comm_bandwidth(CollectiveKind::all_reduce, 4000, 0.0, 4).algbw_gbps, 0.0);  // no division by zero
  EXPECT_DOUBLE_EQ(comm_bandwidth(CollectiveKind::all_reduce, 4000, 1.0, 1).busbw_gbps, 0.0);  // one rank moves nothing
}

TEST(CommsLogger, SizesAndTableAsDeepSpeedPrintsThem) {
  // DeepSpeed's convert_size on the same inputs: 1152 B = 1.125 KB rounds half to even.
  EXPECT_EQ(convert_comm_size(0), "0B");
  EXPECT_EQ(convert_comm_size(512), "512.0 B");
  EXPECT_EQ(convert_comm_size(1152), "1.12 KB");
  EXPECT_EQ(convert_comm_size(2048), "2.0 KB");
  EXPECT_EQ(convert_comm_size(4000), "3.91 KB");
  EXPECT_EQ(convert_comm_size(1048576), "1.0 MB");
  EXPECT_EQ(convert_comm_size(711835000), "678.86 MB");

  const std::vector<CommsLogRow> rows{{"all_reduce", 4000, 10, 55.0, 5.5, 0.1, 0.05}, {"all_reduce", 1048576, 1, 2.0, 2.0, 8.388608, 4.194304}};
  // DeepSpeed's log_all print of these rows (f"{x: <20}" / f"{x: <20.2f}"), trailing padding included.
  const std::string want =
      "Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)    \n"
      "all_reduce\n"
      "                    3.91 KB             10                  55.00               5.50                0.10                0.05                \n"
      "                    1.0 MB              1                   2.00                2.00                8.39                4.19                "
      "\n";
  EXPECT_EQ(format_comms_table(rows), want);
  EXPECT_EQ(format_comms_call(CollectiveKind::all_reduce, 4000, 1.5, 2),
            "comm op: all_reduce | time (ms): 1.50 | msg size: 3.91 KB | algbw (Gbps): 0.04 | busbw (Gbps): 0.02");
}

// Every collective through a CommsLogger over 2 local ranks, each with its own fake clock.
TEST(CommsLogger, RecordsCountsSizesLatenciesAndForwards) {
  constexpr int W = 2;
  std::vector<std::vector<CommsLogRow>> rows(W);
  std::vector<std::vector<CommsOpTotals>> totals(W);
  std::vector<std::string> verbose;
  std::mutex m;
  std::vector<std::vector<float>> reduced(W);
  std::vector<std::uint64_t> inner_calls(W), logger_calls(W);
  run_local_ranks(W, [&](Communicator& inner) {
    const int r = inner.rank();
    // 10 all_reduces of 1000 fp32 taking 1..9 and 30 ms, then one of each other kind taking 4 ms.
    FakeClock clock{{1, 2, 3, 4, 5, 6, 7, 8, 9, 30, 4, 4, 4, 4, 4, 4}};
    CommsLoggerOptions o;
    o.verbose = true;
    o.clock_ms = std::ref(clock);
    o.print = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(m);
      verbose.push_back(line);
    };
    CommsLogger log(inner, o);
    EXPECT_EQ(log.backend(), "local");
    std::vector<float> buf(1000);
    for (int k = 0; k < 10; ++k) {
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(r + 1);
      log.all_reduce(Tensor(buf.data(), DType::fp32, Shape{1000}), ReduceOp::sum);
    }
    reduced[static_cast<std::size_t>(r)] = buf;
    std::vector<float> full(8, 1.0f), shard(4);
    log.reduce_scatter(Tensor(full.data(), DType::fp32, Shape{8}), Tensor(shard.data(), DType::fp32, Shape{4}), ReduceOp::sum);  // 32 B
    log.all_gather(Tensor(shard.data(), DType::fp32, Shape{4}), Tensor(full.data(), DType::fp32, Shape{8}));                     // 16 B
    log.broadcast(Tensor(full.data(), DType::fp32, Shape{8}), 0);                                                                // 32 B
    log.barrier();
    std::vector<float> recv(8);
    log.all_to_all(Tensor(full.data(), DType::fp32, Shape{8}), Tensor(recv.data(), DType::fp32, Shape{8}));  // 32 B
    log.all_reduce(Tensor(full.data(), DType::fp32, Shape{8}), ReduceOp::max);                               // 32 B, a second size
    rows[static_cast<std::size_t>(r)] = log.log().rows();
    totals[static_cast<std::size_t>(r)] = log.log().op_totals();
    inner_calls[static_cast<std::size_t>(r)] = inner.stats().total_calls();
    logger_calls[static_cast<std::size_t>(r)] = log.stats().total_calls();
  });
  for (int r = 0; r < W; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    EXPECT_EQ(reduced[ur][0], 3.0f) << "the inner communicator ran the sum";
    EXPECT_EQ(inner_calls[ur], 16u);
    EXPECT_EQ(logger_calls[ur], 16u);
    const std::vector<CommsLogRow>& rw = rows[ur];
    ASSERT_EQ(rw.size(), 7u);
    // First-logged order; all_reduce's sizes ascending.
    EXPECT_EQ(rw[0].op, "all_reduce");
    EXPECT_EQ(rw[0].msg_bytes, 32u);
    EXPECT_EQ(rw[0].count, 1u);
    EXPECT_DOUBLE_EQ(rw[0].total_latency_ms, 4.0);
    EXPECT_EQ(rw[1].op, "all_reduce");
    EXPECT_EQ(rw[1].msg_bytes, 4000u);
    EXPECT_EQ(rw[1].count, 10u);
    EXPECT_DOUBLE_EQ(rw[1].total_latency_ms, 75.0);
    // trim_mean(·, 0.1) of 10 values drops round(1.0) = 1 at each end: latencies 2..9 (the plain mean is 7.5).
    EXPECT_DOUBLE_EQ(rw[1].avg_latency_ms, 5.5);
    double alg = 0.0, bus = 0.0;
    for (int t = 2; t <= 9; ++t) {
      alg += 2.0 * 4000 / t * 8 / 1e6;              // 2S/t
      bus += 4000.0 / t * (2.0 * 1 / 2) * 8 / 1e6;  // S/t · 2(n−1)/n, n = 2
    }
    EXPECT_NEAR(rw[1].algbw_avg_gbps, alg / 8, 1e-15);
    EXPECT_NEAR(rw[1].busbw_avg_gbps, bus / 8, 1e-15);
    const std::vector<std::pair<std::string, std::uint64_t>> others{{"reduce_scatter_tensor", 32},
                                                                    {"all_gather_into_tensor", 16},
                                                                    {"broadcast", 32},
                                                                    {"barrier", 0},
                                                                    {"all_to_all_single", 32}};
    for (std::size_t k = 0; k < others.size(); ++k) {
      EXPECT_EQ(rw[k + 2].op, others[k].first);
      EXPECT_EQ(rw[k + 2].msg_bytes, others[k].second) << others[k].first;
      EXPECT_EQ(rw[k + 2].count, 1u);
      EXPECT_DOUBLE_EQ(rw[k + 2].avg_latency_ms, 4.0);
    }
    EXPECT_DOUBLE_EQ(rw[3].algbw_avg_gbps, 16.0 * 2 / 4 * 8 / 1e6);  // all_gather: 2 shards of 16 B in 4 ms
    EXPECT_DOUBLE_EQ(rw[3].busbw_avg_gbps, 16.0 * 2 / 4 * 0.5 * 8 / 1e6);
    // Per op over every size: Σ algbw·t / Σ t.
    ASSERT_EQ(totals[ur].size(), 6u);
    EXPECT_EQ(totals[ur][0].op, "all_reduce");
    EXPECT_EQ(totals[ur][0].count, 11u);
    EXPECT_EQ(totals[ur][0].msg_bytes, 10u * 4000 + 32);
    EXPECT_DOUBLE_EQ(totals[ur][0].total_latency_ms, 79.0);
    EXPECT_NEAR(totals[ur][0].algbw_gbps, (10 * 2.0 * 4000 + 2.0 * 32) * 8 / 1e6 / 79.0, 1e-15);
  }
  // verbose: rank 0's calls only, DeepSpeed's line.
  ASSERT_EQ(verbose.size(), 16u);
  EXPECT_EQ(verbose[0], "comm op: all_reduce | time (ms): 1.00 | msg size: 3.91 KB | algbw (Gbps): 0.06 | busbw (Gbps): 0.03");
  EXPECT_EQ(verbose[14], "comm op: all_to_all_single | time (ms): 4.00 | msg size: 32.0 B | algbw (Gbps): 0.00 | busbw (Gbps): 0.00");
}

TEST(CommsLogger, ProfOpsSelectsOpsByDeepSpeedOrDstrainName) {
  std::vector<std::vector<CommsLogRow>> rows(2);
  run_local_ranks(2, [&](Communicator& inner) {
    CommsLoggerOptions o;
    o.prof_all = false;
    o.prof_ops = {"all_gather", "reduce_scatter_tensor", "no_such_op"};
    CommsLogger log(inner, o);
    EXPECT_FALSE(log.profiles(CollectiveKind::all_reduce));
    EXPECT_TRUE(log.profiles(CollectiveKind::all_gather));
    EXPECT_TRUE(log.profiles(CollectiveKind::reduce_scatter));
    std::vector<float> full(8, 1.0f), shard(4);
    log.all_reduce(Tensor(full.data(), DType::fp32, Shape{8}), ReduceOp::sum);
    log.reduce_scatter(Tensor(full.data(), DType::fp32, Shape{8}), Tensor(shard.data(), DType::fp32, Shape{4}), ReduceOp::sum);
    log.all_gather(Tensor(shard.data(), DType::fp32, Shape{4}), Tensor(full.data(), DType::fp32, Shape{8}));
    log.all_gather(Tensor(shard.data(), DType::fp32, Shape{4}), Tensor(full.data(), DType::fp32, Shape{8}));
    log.barrier();
    EXPECT_EQ(log.stats().total_calls(), 5u) << "unprofiled collectives still run";
    rows[static_cast<std::size_t>(inner.rank())] = log.log().rows();
  });
  for (const auto& rw : rows) {
    ASSERT_EQ(rw.size(), 2u);
    EXPECT_EQ(rw[0].op, "reduce_scatter_tensor");
    EXPECT_EQ(rw[0].count, 1u);
    EXPECT_EQ(rw[1].op, "all_gather_into_tensor");
    EXPECT_EQ(rw[1].count, 2u);
  }
  EXPECT_EQ(unknown_comms_ops({"all_reduce", "allreduce", "all_to_all_single", "reduce"}), (std::vector<std::string>{"allreduce", "reduce"}));
}

// send and recv go through the logger as DeepSpeed's timed send / recv: one row per rank of the
// pair under its own name, the buffer as the message size; the data still arrives, prof_ops
// selects them by name, and the counters are the inner communicator's rule (recv sends 0 bytes).
TEST(CommsLogger, SendAndRecvAreLoggedUnderDeepSpeedsNames) {
  std::vector<std::vector<CommsLogRow>> rows(2);
  std::vector<float> got(8);
  std::vector<CommStats> stats(2);
  run_local_ranks(2, [&](Communicator& inner) {
    FakeClock clock{{2.0, 3.0}};
    CommsLoggerOptions o;
    o.clock_ms = std::ref(clock);
    CommsLogger log(inner, o);
    std::vector<float> buf(8);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i) + 0.5f;
    const Tensor t(buf.data(), DType::fp32, Shape{8});
    if (inner.rank() == 0) {
      log.send(t, 1);
    } else {
      std::fill(buf.begin(), buf.end(), 0.0f);
      log.recv(t, 0);
      got = buf;
    }
    CommsLoggerOptions only_send;
    only_send.prof_all = false;
    only_send.prof_ops = {"send"};
    CommsLogger selective(inner, only_send);
    EXPECT_TRUE(selective.profiles(CollectiveKind::send));
    EXPECT_FALSE(selective.profiles(CollectiveKind::recv));
    rows[static_cast<std::size_t>(inner.rank())] = log.log().rows();
    stats[static_cast<std::size_t>(inner.rank())] = log.stats();
  });
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<float>(i) + 0.5f);
  ASSERT_EQ(rows[0].size(), 1u);
  ASSERT_EQ(rows[1].size(), 1u);
  EXPECT_EQ(rows[0][0].op, "send");
  EXPECT_EQ(rows[1][0].op, "recv");
  for (const auto& rw : rows) {
    EXPECT_EQ(rw[0].msg_bytes, 32u);
    EXPECT_EQ(rw[0].count, 1u);
    EXPECT_DOUBLE_EQ(rw[0].total_latency_ms, 2.0);
    EXPECT_DOUBLE_EQ(rw[0].algbw_avg_gbps, 32.0 / 2.0 * 8 / 1e6);
    EXPECT_DOUBLE_EQ(rw[0].busbw_avg_gbps, 32.0 / 2.0 * 8 / 1e6);
  }
  EXPECT_EQ(stats[0].bytes_sent(CollectiveKind::send), 32u);
  EXPECT_EQ(stats[1].bytes_sent(CollectiveKind::recv), 0u);
  EXPECT_EQ(stats[1].call_count(CollectiveKind::recv), 1u);
  CollectiveKind k = CollectiveKind::barrier;
  EXPECT_TRUE(comms_op_from_name("recv", &k));
  EXPECT_EQ(k, CollectiveKind::recv);
  EXPECT_EQ(comms_log_name(CollectiveKind::send), "send");
}

// A send_recv batch goes through the logger as one batch (the neighbours' exchange must not
// become blocking calls, or it would deadlock) and is logged op by op as DeepSpeed's send / recv,
// each with the batch's time; prof_ops selects among them, and the counters are the standalone
// calls' (each send its bytes, each recv 0).
TEST(CommsLogger, SendRecvBatchIsForwardedAsOneAndLoggedOpByOp) {
  std::vector<std::vector<CommsLogRow>> rows(2), recv_rows(2);
  std::vector<std::vector<float>> got(2);
  std::vector<CommStats> stats(2), inner_stats(2);
  run_local_ranks(
      2,
      [&](Communicator& inner) {
        const int r = inner.rank(), other = 1 - r;
        FakeClock clock{{2.0}};
        CommsLoggerOptions o;
        o.clock_ms = std::ref(clock);
        CommsLogger log(inner, o);
        // Rank 0 sends 8 floats and receives 4; rank 1 the other way round.
        std::vector<float> out(r == 0 ? 8 : 4), in(r == 0 ? 4 : 8, 0.0f);
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(10 * r + static_cast<int>(i)) + 0.25f;
        const PointToPointOp send{true, Tensor(out.data(), DType::fp32, Shape{static_cast<std::int64_t>(out.size())}), other};
        const PointToPointOp recv{false, Tensor(in.data(), DType::fp32, Shape{static_cast<std::int64_t>(in.size())}), other};
        // Both send first: deadlocks unless the batch reaches the inner communicator whole.
        log.send_recv(std::vector<PointToPointOp>{send, recv});
        got[static_cast<std::size_t>(r)] = in;
        rows[static_cast<std::size_t>(r)] = log.log().rows();
        stats[static_cast<std::size_t>(r)] = log.stats();
        inner_stats[static_cast<std::size_t>(r)] = inner.stats();

        FakeClock clock2{{5.0}};
        CommsLoggerOptions only_recv;
        only_recv.prof_all = false;
        only_recv.prof_ops = {"recv"};
        only_recv.clock_ms = std::ref(clock2);
        CommsLogger selective(inner, only_recv);
        selective.send_recv(std::vector<PointToPointOp>{recv, send});
        recv_rows[static_cast<std::size_t>(r)] = selective.log().rows();
      },
      std::chrono::milliseconds(5'000));
  for (int r = 0; r < 2; ++r) {
    const auto k = static_cast<std::size_t>(r);
    const std::size_t n = r == 0 ? 4 : 8;
    ASSERT_EQ(got[k].size(), n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(got[k][i], static_cast<float>(10 * (1 - r) + static_cast<int>(i)) + 0.25f) << r << " " << i;
    ASSERT_EQ(rows[k].size(), 2u) << "rank " << r;
    EXPECT_EQ(rows[k][0].op, "send");
    EXPECT_EQ(rows[k][0].msg_bytes, r == 0 ? 32u : 16u);
    EXPECT_EQ(rows[k][1].op, "recv");
    EXPECT_EQ(rows[k][1].msg_bytes, r == 0 ? 16u : 32u);
    for (const CommsLogRow& row : rows[k]) {
      EXPECT_EQ(row.count, 1u);
      EXPECT_DOUBLE_EQ(row.total_latency_ms, 2.0);
    }
    ASSERT_EQ(recv_rows[k].size(), 1u);
    EXPECT_EQ(recv_rows[k][0].op, "recv");
    EXPECT_DOUBLE_EQ(recv_rows[k][0].total_latency_ms, 5.0);
    for (const CommStats& s : {stats[k], inner_stats[k]}) {
      EXPECT_EQ(s.bytes_sent(CollectiveKind::send), r == 0 ? 32u : 16u);
      EXPECT_EQ(s.call_count(CollectiveKind::send), 1u);
      EXPECT_EQ(s.bytes_sent(CollectiveKind::recv), 0u);
      EXPECT_EQ(s.call_count(CollectiveKind::recv), 1u);
    }
  }
}

}  // namespace
