// CommsLogger: DeepSpeed's communication logger (the ds_config "comms_logger" section;
// deepspeed/utils/comms_logging.py and the timed_op wrapper of deepspeed/comm/comm.py), as a
// Communicator that forwards every collective to the real one and records, per op name and message
// size, the count and the latencies. The engine installs it only when comms_logger.enabled, so a
// run without it pays nothing. docs/monitoring.md §6.
//
// What DeepSpeed records, and dstrain with it:
//   - op name: the deepspeed.comm function a collective goes through (comms_log_name), so tables and
//     prof_ops read as DeepSpeed's: all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
//     broadcast, barrier, all_to_all_single (the fixed all_to_all and the variable all_to_all_v
//     alike, as torch's all_to_all_single with and without split sizes), send, recv.
//   - message size: the bytes of the call's input tensor (get_msg_size_from_args): the buffer of
//     all_reduce, broadcast, send and recv, the W·n send buffer of reduce_scatter and all_to_all,
//     the send blocks (sum of send_counts) of all_to_all_v,
//     the n-element send shard of all_gather; 0 for barrier.
//   - latency: milliseconds from the call to its completion; a profiled collective is made blocking
//     (DeepSpeed synchronizes the accelerator after it), here with the `synchronize` option.
//   - bandwidths (calc_bw_log), in Gbps = bytes/ms · 8 / 1e6, S = message size, t = latency, n = W:
//       all_reduce                algbw = 2S/t        busbw = S/t · 2(n−1)/n
//       all_gather_into_tensor    algbw = nS/t        busbw = algbw · (n−1)/n
//       reduce_scatter_tensor     algbw = S/t         busbw = algbw · (n−1)/n
//       all_to_all_single         algbw = S/t         busbw = algbw · (n−1)/n
//       broadcast, barrier,       algbw = busbw = S/t
//       send, recv
//     DeepSpeed multiplies reduce_scatter's size by n too, but its size is already the W·n input,
//     so its figures are n times what moved; dstrain uses the input once (nccl-tests' definition).
//     t = 0 gives 0 (DeepSpeed divides by zero).
//   - filtering: prof_all profiles every op; otherwise only those named in prof_ops (DeepSpeed's
//     name or dstrain's: "all_gather" and "all_gather_into_tensor" are the same op).
//   - the table (log_all): per op, per size ascending: Count, Total Latency(ms), and the trimmed
//     means (10% off each end, timer.py trim_mean) of latency, algbw and busbw. The means are over
//     the latest kCommsLogWindow calls of that op and size (DeepSpeed keeps every call; a long run
//     would grow without bound); count and total over all. dstrain's addition: when the group spans
//     nodes (Communicator::node_count() > 1), one more column, the bytes of those calls that crossed
//     nodes (cross_node_bytes_sent, summed over all); with one node the table is DeepSpeed's.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zero/communicator.h"

namespace dstrain {

// DeepSpeed's record name for a collective of this kind (the deepspeed.comm function's log_name).
std::string_view comms_log_name(CollectiveKind kind);

// The collective a prof_ops entry names (DeepSpeed's name or collective_name's); false if none.
bool comms_op_from_name(std::string_view name, CollectiveKind* kind);

// DeepSpeed's message size: the bytes of the call's input tensor (see above).
struct CommBandwidth {
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
};
// calc_bw_log for one call of `msg_bytes` that took `latency_ms` among `world_size` ranks.
CommBandwidth comm_bandwidth(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, int world_size);

// DeepSpeed's convert_size: "0B", "512.0 B", "2.0 KB", "678.86 MB" (1024-based, round(x, 2)).
std::string convert_comm_size(std::uint64_t bytes);

inline constexpr std::size_t kCommsLogWindow = 1000;

// One row of the table: an op at one message size.
struct CommsLogRow {
  std::string op;
  std::uint64_t msg_bytes = 0;
  std::uint64_t count = 0;
  double total_latency_ms = 0.0;
  double avg_latency_ms = 0.0;  // trimmed means
  double algbw_avg_gbps = 0.0;
  double busbw_avg_gbps = 0.0;
  std::uint64_t cross_node_bytes = 0;  // over every call of the row (cross_node_bytes_sent)
};

// One op over every message size, for the monitors: calls, message bytes, total latency, and the
// bandwidths of all of it together (Σ algbw·t / Σ t: the bytes-weighted rate, not a mean of rates).
struct CommsOpTotals {
  std::string op;
  std::uint64_t count = 0;
  std::uint64_t msg_bytes = 0;
  double total_latency_ms = 0.0;
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
};

// The records of one rank; thread-safe (with overlap_comm the collectives run on a worker thread).
class CommsLog {
 public:
  explicit CommsLog(int world_size, int node_count = 1) : world_size_(world_size), node_count_(node_count) {}

  // `cross_node_bytes`: of the call's traffic, the bytes that crossed nodes (0 on one node).
  void record(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, std::uint64_t cross_node_bytes = 0);

  int world_size() const { return world_size_; }
  int node_count() const { return node_count_; }  // the logged group's nodes: > 1 adds the table's cross-node column
  // Ops in the order they were first logged (DeepSpeed's dict order), sizes ascending.
  std::vector<CommsLogRow> rows() const;
  std::vector<CommsOpTotals> op_totals() const;
  std::uint64_t total_calls() const;

 private:
  struct Entry {
    std::uint64_t count = 0;
    double total_latency_ms = 0.0;
    double algbw_ms_product = 0.0;  // Σ algbw·t, Σ busbw·t
    double busbw_ms_product = 0.0;
    std::uint64_t cross_node_bytes = 0;
    std::deque<double> recent_latency_ms;  // the latest kCommsLogWindow
  };
  struct Op {
    CollectiveKind kind;
    std::map<std::uint64_t, Entry> by_size;
  };
  int world_size_;
  int node_count_;
  mutable std::mutex mutex_;
  std::vector<Op> ops_;  // first-logged order
};

// log_all's print: a header, then per op its name and one line per message size, 20-character
// columns, values with 2 decimals. Lines end in '\n'. `cross_node` (the group spans nodes) adds a
// last column, "Cross-node Bytes" (convert_comm_size of the row's cross_node_bytes).
std::string format_comms_table(const std::vector<CommsLogRow>& rows, bool cross_node = false);

// The per-call line of `verbose`:
// "comm op: all_reduce | time (ms): 0.12 | msg size: 6.0 MB | algbw (Gbps): 954.41 | busbw (Gbps): 894.76"
std::string format_comms_call(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, int world_size);

struct CommsLoggerOptions {
  bool verbose = false;  // print each profiled call (rank 0)
  bool prof_all = true;
  std::vector<std::string> prof_ops{};  // used when !prof_all
  // Called after each profiled collective, before its latency is read: makes it blocking (a device
  // synchronize and the communicator's own for NCCL). Empty: the backend completes on return.
  std::function<void()> synchronize{};
  std::function<double()> clock_ms{};               // empty: std::chrono::steady_clock
  std::function<void(const std::string&)> print{};  // verbose lines; empty: log_info on rank 0
};

// The names in `prof_ops` that name no collective (warned about: they never match).
std::vector<std::string> unknown_comms_ops(const std::vector<std::string>& prof_ops);

class CommsLogger final : public Communicator {
 public:
  // `inner` must outlive the logger; every collective of the logger runs on it. The logger takes
  // inner's nodes (Communicator::set_nodes) as they are now: set them on inner before wrapping it.
  CommsLogger(Communicator& inner, CommsLoggerOptions options);
  // The same, owning `inner` (a split's child: see do_split).
  CommsLogger(std::unique_ptr<Communicator> inner, CommsLoggerOptions options);

  std::string_view backend() const override { return inner_.backend(); }
  void synchronize() override { inner_.synchronize(); }
  void order_compute_after_collectives() override { inner_.order_compute_after_collectives(); }
  // The inner communicator numbers its collectives itself (another user of it may have issued
  // some): order after all of them, which is never too early.
  void order_compute_after(std::uint64_t sequence) override {
    if (sequence != 0) inner_.order_compute_after_collectives();
  }

  bool profiles(CollectiveKind kind) const { return profiled_[static_cast<std::size_t>(kind)]; }
  const CommsLog& log() const { return log_; }

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override;
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  void do_all_gather(const Tensor& send, const Tensor& recv) override;
  void do_broadcast(const Tensor& buf, int root) override;
  void do_barrier() override;
  void do_all_to_all(const Tensor& send, const Tensor& recv) override;
  // Forwarded, and logged as all_to_all_single (DeepSpeed's name for both all-to-alls: one entry
  // in the table, message size = the bytes of the send blocks); the logger's stats() count it as
  // all_to_all_v. exchange_counts is forwarded and logged as the all_to_all it is.
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) override;
  void do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) override;
  // Logged on each of the two ranks (DeepSpeed's send and recv are timed ops too).
  void do_send(const Tensor& buf, int peer) override;
  void do_recv(const Tensor& buf, int peer) override;
  // Forwarded to the inner communicator's start_send_recv / wait; logged (with the time from the
  // start to the end of the wait) when waited for.
  std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  void do_wait(PendingPointToPoint& pending) override;
  void do_abandon(PendingPointToPoint& pending) noexcept override;
  // Splits the inner communicator (its exchange is the inner's collective, not logged here: it is
  // no deepspeed.comm op) and wraps the child in a logger of its own, with these options, so the
  // sub-group's collectives are logged in its own table (DeepSpeed's logger is per process and
  // mixes groups; per-group tables say which group moved what). `synchronize`, when set, then
  // also synchronizes the child's inner communicator, whose work it would otherwise not wait for.
  // Verbose lines come from each group's rank 0.
  std::unique_ptr<Communicator> do_split(int color, int key) override;

 private:
  template <typename Fn>
  void timed(CollectiveKind kind, std::uint64_t msg_bytes, Fn&& fn);
  // Logs one profiled call that took `ms` (and prints it when verbose).
  void record(CollectiveKind kind, std::uint64_t msg_bytes, double ms, std::uint64_t cross_node_bytes);

  std::unique_ptr<Communicator> owned_inner_;  // set when the logger owns inner_
  Communicator& inner_;
  CommsLoggerOptions options_;
  std::array<bool, kCollectiveKinds> profiled_{};
  CommsLog log_;
};

}  // namespace dstrain
