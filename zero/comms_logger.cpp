#include "zero/comms_logger.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

constexpr CollectiveKind kAllKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                        CollectiveKind::all_gather, CollectiveKind::broadcast,
                                        CollectiveKind::barrier,    CollectiveKind::all_to_all,
                                        CollectiveKind::send,       CollectiveKind::recv,
                                        CollectiveKind::all_to_all_v};
static_assert(std::size(kAllKinds) == kCollectiveKinds, "every kind is logged");

// Python's f"{x:.2f}" (and "%.2f"): printf rounds the exact binary value, ties to even, as Python.
std::string fixed2(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

// DeepSpeed's trim_mean(data, 0.1): sorted, k = round(n · 0.1) (half to even) dropped at each end.
double trim_mean(std::vector<double> data) {
  const std::size_t n = data.size();
  if (n == 0) return 0.0;
  std::sort(data.begin(), data.end());
  const auto k = static_cast<std::size_t>(std::nearbyint(static_cast<double>(n) * 0.1));
  double sum = 0.0;
  for (std::size_t i = k; i < n - k; ++i) sum += data[i];
  return sum / static_cast<double>(n - 2 * k);
}

double default_clock_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

std::string_view comms_log_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter_tensor";
    case CollectiveKind::all_gather:
      return "all_gather_into_tensor";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v:  // torch's all_to_all_single with split sizes: the same op
      return "all_to_all_single";
    case CollectiveKind::send:
      return "send";
    case CollectiveKind::recv:
      return "recv";
  }
  return "?";
}

bool comms_op_from_name(std::string_view name, CollectiveKind* kind) {
  for (CollectiveKind k : kAllKinds) {
    if (name == comms_log_name(k) || name == collective_name(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

std::vector<std::string> unknown_comms_ops(const std::vector<std::string>& prof_ops) {
  std::vector<std::string> unknown;
  CollectiveKind k;
  for (const std::string& name : prof_ops)
    if (!comms_op_from_name(name, &k)) unknown.push_back(name);
  return unknown;
}

CommBandwidth comm_bandwidth(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, int world_size) {
  if (!(latency_ms > 0.0)) return {};
  const double n = world_size;
  double size = static_cast<double>(msg_bytes);
  double algbw = 0.0, busbw = 0.0;  // bytes per ms
  switch (kind) {
    case CollectiveKind::all_reduce:
      algbw = size * 2.0 / latency_ms;
      busbw = size / latency_ms * (2.0 * (n - 1.0) / n);
      break;
    case CollectiveKind::all_gather:
      size *= n;  // the input is one shard; the gathered buffer is n of them
      algbw = size / latency_ms;
      busbw = algbw * ((n - 1.0) / n);
      break;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
    case CollectiveKind::all_to_all_v:
      algbw = size / latency_ms;
      busbw = algbw * ((n - 1.0) / n);
      break;
    case CollectiveKind::broadcast:
    case CollectiveKind::barrier:
    case CollectiveKind::send:
    case CollectiveKind::recv:
      algbw = size / latency_ms;
      busbw = algbw;
      break;
  }
  // bytes/ms · 8 bits / 1e6 = Gbit/s
  return {algbw * 8.0 / 1e6, busbw * 8.0 / 1e6};
}

std::string convert_comm_size(std::uint64_t bytes) {
  if (bytes == 0) return "0B";
  static constexpr const char* kNames[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  int i = static_cast<int>(std::floor(std::log(static_cast<double>(bytes)) / std::log(1024.0)));
  i = std::clamp(i, 0, 8);
  // Python's str(round(x, 2)): the 2-decimal value without trailing zeros, at least one decimal.
  std::string s = fixed2(static_cast<double>(bytes) / std::pow(1024.0, i));
  while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
  return s + " " + kNames[i];
}

void CommsLog::record(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, std::uint64_t cross_node_bytes) {
  const CommBandwidth bw = comm_bandwidth(kind, msg_bytes, latency_ms, world_size_);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(ops_.begin(), ops_.end(), [&](const Op& o) { return o.kind == kind; });
  if (it == ops_.end()) {
    ops_.push_back(Op{kind, {}});
    it = ops_.end() - 1;
  }
  Entry& e = it->by_size[msg_bytes];
  e.count += 1;
  e.total_latency_ms += latency_ms;
  e.algbw_ms_product += bw.algbw_gbps * latency_ms;
  e.busbw_ms_product += bw.busbw_gbps * latency_ms;
  e.cross_node_bytes += cross_node_bytes;
  e.recent_latency_ms.push_back(latency_ms);
  if (e.recent_latency_ms.size() > kCommsLogWindow) e.recent_latency_ms.pop_front();
}

std::vector<CommsLogRow> CommsLog::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CommsLogRow> out;
  for (const Op& o : ops_) {
    for (const auto& [size, e] : o.by_size) {
      CommsLogRow r;
      r.op = std::string(comms_log_name(o.kind));
      r.msg_bytes = size;
      r.count = e.count;
      r.total_latency_ms = e.total_latency_ms;
      r.cross_node_bytes = e.cross_node_bytes;
      std::vector<double> lat(e.recent_latency_ms.begin(), e.recent_latency_ms.end()), alg, bus;
      for (double t : lat) {
        const CommBandwidth bw = comm_bandwidth(o.kind, size, t, world_size_);
        alg.push_back(bw.algbw_gbps);
        bus.push_back(bw.busbw_gbps);
      }
      r.avg_latency_ms = trim_mean(std::move(lat));
      r.algbw_avg_gbps = trim_mean(std::move(alg));
      r.busbw_avg_gbps = trim_mean(std::move(bus));
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::vector<CommsOpTotals> CommsLog::op_totals() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CommsOpTotals> out;
  for (const Op& o : ops_) {
    CommsOpTotals t;
    t.op = std::string(comms_log_name(o.kind));
    double alg = 0.0, bus = 0.0;
    for (const auto& [size, e] : o.by_size) {
      t.count += e.count;
      t.msg_bytes += size * e.count;
      t.total_latency_ms += e.total_latency_ms;
      alg += e.algbw_ms_product;
      bus += e.busbw_ms_product;
    }
    if (t.total_latency_ms > 0.0) {
      t.algbw_gbps = alg / t.total_latency_ms;
      t.busbw_gbps = bus / t.total_latency_ms;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::uint64_t CommsLog::total_calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t n = 0;
  for (const Op& o : ops_)
    for (const auto& [size, e] : o.by_size) n += e.count;
  return n;
}

std::string format_comms_table(const std::vector<CommsLogRow>& rows, bool cross_node) {
  std::string out = fmt::format("{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}", "Comm. Op", "Message Size", "Count", "Total Latency(ms)",
                                "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
  out += cross_node ? fmt::format("{:<20}\n", "Cross-node Bytes") : std::string("\n");
  const std::string* op = nullptr;
  for (const CommsLogRow& r : rows) {
    if (op == nullptr || *op != r.op) out += r.op + "\n";
    op = &r.op;
    out += fmt::format("{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}{:<20}", " ", convert_comm_size(r.msg_bytes), r.count, fixed2(r.total_latency_ms),
                       fixed2(r.avg_latency_ms), fixed2(r.algbw_avg_gbps), fixed2(r.busbw_avg_gbps));
    out += cross_node ? fmt::format("{:<20}\n", convert_comm_size(r.cross_node_bytes)) : std::string("\n");
  }
  return out;
}

std::string format_comms_call(CollectiveKind kind, std::uint64_t msg_bytes, double latency_ms, int world_size) {
  const CommBandwidth bw = comm_bandwidth(kind, msg_bytes, latency_ms, world_size);
  return fmt::format("comm op: {} | time (ms): {} | msg size: {} | algbw (Gbps): {} | busbw (Gbps): {}", comms_log_name(kind), fixed2(latency_ms),
                     convert_comm_size(msg_bytes), fixed2(bw.algbw_gbps), fixed2(bw.busbw_gbps));
}

CommsLogger::CommsLogger(Communicator& inner, CommsLoggerOptions options)
    : Communicator(inner.rank(), inner.world_size()), inner_(inner), options_(std::move(options)), log_(inner.world_size(), inner.node_count()) {
  for (CollectiveKind k : kAllKinds) {
    bool on = options_.prof_all;
    CollectiveKind named;
    for (const std::string& name : options_.prof_ops)
      if (comms_op_from_name(name, &named) && named == k) on = true;
    profiled_[static_cast<std::size_t>(k)] = on;
  }
  // The fixed and the variable all-to-all are one op to DeepSpeed (all_to_all_single), logged in
  // one table entry: naming either profiles both.
  auto& a2a = profiled_[static_cast<std::size_t>(CollectiveKind::all_to_all)];
  auto& a2av = profiled_[static_cast<std::size_t>(CollectiveKind::all_to_all_v)];
  a2a = a2av = a2a || a2av;
  if (!options_.clock_ms) options_.clock_ms = default_clock_ms;
  // The inner communicator's nodes, so this one's stats() count the same cross-node bytes; a split
  // child, wrapping the inner's child (which inherited them), copies them the same way.
  std::vector<int> nodes(static_cast<std::size_t>(inner.world_size()));
  for (int r = 0; r < inner.world_size(); ++r) nodes[static_cast<std::size_t>(r)] = inner.node_of(r);
  set_nodes(std::move(nodes));
}

namespace {
Communicator& non_null(const std::unique_ptr<Communicator>& comm) {
  DSTRAIN_CHECK(comm != nullptr, "CommsLogger: the inner communicator is null. Fix: pass the communicator to log");
  return *comm;
}
}  // namespace

CommsLogger::CommsLogger(std::unique_ptr<Communicator> inner, CommsLoggerOptions options) : CommsLogger(non_null(inner), std::move(options)) {
  owned_inner_ = std::move(inner);  // the object does not move: inner_ still refers to it
}

std::unique_ptr<Communicator> CommsLogger::do_split(int color, int key) {
  std::unique_ptr<Communicator> child = inner_.split(color, key);
  CommsLoggerOptions options = options_;
  if (options.synchronize) {
    Communicator* child_inner = child.get();  // owned by the child logger, which holds this function
    options.synchronize = [sync = options_.synchronize, child_inner] {
      sync();
      child_inner->synchronize();
    };
  }
  return std::make_unique<CommsLogger>(std::move(child), std::move(options));
}

template <typename Fn>
void CommsLogger::timed(CollectiveKind kind, std::uint64_t msg_bytes, Fn&& fn) {
  if (!profiles(kind)) {
    fn();
    return;
  }
  const std::uint64_t cross_before = inner_.stats().total_cross_node_bytes();
  const double start = options_.clock_ms();
  fn();
  if (options_.synchronize) options_.synchronize();
  const double ms = options_.clock_ms() - start;
  record(kind, msg_bytes, ms, inner_.stats().total_cross_node_bytes() - cross_before);
}

void CommsLogger::record(CollectiveKind kind, std::uint64_t msg_bytes, double ms, std::uint64_t cross_node_bytes) {
  log_.record(kind, msg_bytes, ms, cross_node_bytes);
  if (options_.verbose) {
    const std::string line = format_comms_call(kind, msg_bytes, ms, world_size());
    if (options_.print) {
      if (rank() == 0) options_.print(line);
    } else if (rank() == 0) {
      log_info("{}", line);
    }
  }
}

void CommsLogger::do_all_reduce(const Tensor& buf, ReduceOp op) {
  timed(CollectiveKind::all_reduce, buf.nbytes(), [&] { inner_.all_reduce(buf, op); });
}

void CommsLogger::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  timed(CollectiveKind::reduce_scatter, send.nbytes(), [&] { inner_.reduce_scatter(send, recv, op); });
}

void CommsLogger::do_all_gather(const Tensor& send, const Tensor& recv) {
  timed(CollectiveKind::all_gather, send.nbytes(), [&] { inner_.all_gather(send, recv); });
}

void CommsLogger::do_broadcast(const Tensor& buf, int root) {
  timed(CollectiveKind::broadcast, buf.nbytes(), [&] { inner_.broadcast(buf, root); });
}

void CommsLogger::do_barrier() {
  timed(CollectiveKind::barrier, 0, [&] { inner_.barrier(); });
}

void CommsLogger::do_all_to_all(const Tensor& send, const Tensor& recv) {
  timed(CollectiveKind::all_to_all, send.nbytes(), [&] { inner_.all_to_all(send, recv); });
}

// Logged as all_to_all_single, DeepSpeed's op for both all-to-alls (one table entry with the fixed
// form), its message size the bytes of the send blocks (the input all_to_all_single would take).
void CommsLogger::do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                  std::span<const std::int64_t> recv_counts) {
  std::uint64_t bytes = 0;
  for (std::int64_t n : send_counts) bytes += static_cast<std::uint64_t>(n) * dtype_size(send.dtype);
  timed(CollectiveKind::all_to_all, bytes, [&] { inner_.all_to_all_v(send, send_counts, recv, recv_counts); });
}

// One all_to_all of W int64 values, logged as such.
void CommsLogger::do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) {
  timed(CollectiveKind::all_to_all, send_counts.size() * sizeof(std::int64_t), [&] {
    const std::vector<std::int64_t> got = inner_.exchange_counts(send_counts);
    std::copy(got.begin(), got.end(), out.begin());
  });
}

void CommsLogger::do_send(const Tensor& buf, int peer) {
  timed(CollectiveKind::send, buf.nbytes(), [&] { inner_.send(buf, peer); });
}

void CommsLogger::do_recv(const Tensor& buf, int peer) {
  timed(CollectiveKind::recv, buf.nbytes(), [&] { inner_.recv(buf, peer); });
}

// One forwarded batch (its ops run together, so they cannot be timed apart): each profiled op is
// logged as the send or recv it is, with the batch's time from its start to the end of its wait.
namespace {

struct LoggedBatch final : PendingPointToPoint {
  PointToPointRequest inner;
  double start_ms = 0.0;
  bool profiled = false;
  struct Op {
    CollectiveKind kind;
    std::uint64_t bytes;
    std::uint64_t cross_node_bytes;  // a send to another node: its bytes
  };
  std::vector<Op> ops;
};

}  // namespace

std::unique_ptr<PendingPointToPoint> CommsLogger::do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> /*calls*/) {
  auto batch = std::make_unique<LoggedBatch>();
  for (const PointToPointOp& op : ops) {
    const CollectiveKind kind = op.is_send ? CollectiveKind::send : CollectiveKind::recv;
    batch->profiled = batch->profiled || profiles(kind);
    const bool off_node = op.is_send && node_of(op.peer) != node_of(rank());
    batch->ops.push_back({kind, op.buffer.nbytes(), off_node ? op.buffer.nbytes() : 0});
  }
  if (batch->profiled) batch->start_ms = options_.clock_ms();
  batch->inner = inner_.start_send_recv(ops);
  return batch;
}

void CommsLogger::do_wait(PendingPointToPoint& pending) {
  auto& batch = static_cast<LoggedBatch&>(pending);
  inner_.wait(batch.inner);
  if (!batch.profiled) return;
  if (options_.synchronize) options_.synchronize();
  const double ms = options_.clock_ms() - batch.start_ms;
  for (const LoggedBatch::Op& op : batch.ops)
    if (profiles(op.kind)) record(op.kind, op.bytes, ms, op.cross_node_bytes);
}

// The inner request abandons itself (its backend's way); nothing is logged as completed.
void CommsLogger::do_abandon(PendingPointToPoint& pending) noexcept { static_cast<LoggedBatch&>(pending).inner = PointToPointRequest{}; }

}  // namespace dstrain
