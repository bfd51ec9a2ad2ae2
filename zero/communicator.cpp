#include "zero/communicator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <utility>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

void check_dtype(std::string_view call, DType dtype, const char* what) {
  DSTRAIN_CHECK(dtype == DType::fp32 || dtype == DType::fp16 || dtype == DType::bf16 || dtype == DType::int32 || dtype == DType::fp64,
                "{}: {} has dtype {}; collectives take fp32, fp16, bf16, fp64 (sums) or int32 (counts). Fix: cast the buffer first", call, what,
                dtype_name(dtype));
}

void check_op(std::string_view call, DType dtype, ReduceOp op) {
  DSTRAIN_CHECK(!(dtype == DType::int32 && op == ReduceOp::avg),
                "{}: avg of int32 is not defined (it would truncate). Fix: use sum and divide where the count is used", call);
}

void check_data(std::string_view call, const Tensor& t, const char* what) {
  DSTRAIN_CHECK(t.numel() == 0 || t.data != nullptr,
                "{}: {} ({}) has no memory (null data). Fix: pass a view of an "
                "allocated buffer",
                call, what, t.str());
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::all_to_all:
      return "all_to_all";
    case CollectiveKind::send:
      return "send";
    case CollectiveKind::recv:
      return "recv";
    case CollectiveKind::all_to_all_v:
      return "all_to_all_v";
  }
  return "?";
}

std::uint64_t ring_bytes_sent(CollectiveKind kind, std::uint64_t buffer_bytes, int world_size, bool is_root) {
  DSTRAIN_CHECK(world_size >= 1, "ring_bytes_sent: world size must be >= 1, got {}", world_size);
  const auto w = static_cast<std::uint64_t>(world_size);
  if (w == 1) return 0;
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2 * (w - 1) * buffer_bytes / w;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      return (w - 1) * buffer_bytes / w;
    case CollectiveKind::broadcast:
      return is_root ? buffer_bytes : 0;
    case CollectiveKind::barrier:
      return 0;
    case CollectiveKind::send:
    case CollectiveKind::all_to_all_v:  // the caller passes the bytes to the other ranks
      return buffer_bytes;
    case CollectiveKind::recv:
      return 0;
  }
  return 0;
}

std::uint64_t cross_node_bytes_sent(CollectiveKind kind, std::uint64_t buffer_bytes, int world_size, int ranks_off_node, int node_count,
                                    bool is_root) {
  DSTRAIN_CHECK(world_size >= 1, "cross_node_bytes_sent: world size must be >= 1, got {}", world_size);
  DSTRAIN_CHECK(ranks_off_node >= 0 && ranks_off_node < world_size && node_count >= 1 && node_count <= world_size,
                "cross_node_bytes_sent: {} ranks on other nodes and {} nodes do not fit a world of {} ranks", ranks_off_node, node_count,
                world_size);
  const auto w = static_cast<std::uint64_t>(world_size);
  const auto o = static_cast<std::uint64_t>(ranks_off_node);
  if (node_count == 1) return 0;
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2 * o * buffer_bytes / w;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
    case CollectiveKind::all_to_all:
      return o * buffer_bytes / w;
    case CollectiveKind::broadcast:
      return is_root ? buffer_bytes * static_cast<std::uint64_t>(node_count - 1) : 0;
    case CollectiveKind::barrier:
    case CollectiveKind::recv:
      return 0;
    case CollectiveKind::send:
      return o > 0 ? buffer_bytes : 0;
    case CollectiveKind::all_to_all_v:  // the caller passes the bytes to the ranks on other nodes
      return buffer_bytes;
  }
  return 0;
}

CommStats operator-(const CommStats& later, const CommStats& earlier) {
  CommStats d;
  for (std::size_t k = 0; k < d.bytes.size(); ++k) {
    d.bytes[k] = later.bytes[k] - earlier.bytes[k];
    d.calls[k] = later.calls[k] - earlier.calls[k];
    d.cross_node_bytes[k] = later.cross_node_bytes[k] - earlier.cross_node_bytes[k];
  }
  return d;
}

CommStats& operator+=(CommStats& sum, const CommStats& more) {
  for (std::size_t k = 0; k < sum.bytes.size(); ++k) {
    sum.bytes[k] += more.bytes[k];
    sum.calls[k] += more.calls[k];
    sum.cross_node_bytes[k] += more.cross_node_bytes[k];
  }
  return sum;
}

std::uint64_t CommStats::total_bytes_sent() const { return std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0}); }
std::uint64_t CommStats::total_calls() const { return std::accumulate(calls.begin(), calls.end(), std::uint64_t{0}); }
std::uint64_t CommStats::total_cross_node_bytes() const {
  return std::accumulate(cross_node_bytes.begin(), cross_node_bytes.end(), std::uint64_t{0});
}

std::chrono::milliseconds default_comm_timeout() {
  const char* env = std::getenv("DSTRAIN_COMM_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::milliseconds(60'000);
  errno = 0;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  DSTRAIN_CHECK(errno == 0 && end != env && *end == '\0' && std::isfinite(seconds) && seconds > 0 && seconds < 1e9,
                "DSTRAIN_COMM_TIMEOUT='{}' is not a positive number of seconds. Fix: set it to e.g. 60 or 0.5, or unset it "
                "for the default of 60 s",
                env);
  return std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(seconds * 1000.0))));
}

Tensor shard_of(const Tensor& full, int index, int world_size) {
  DSTRAIN_CHECK(world_size >= 1 && index >= 0 && index < world_size, "shard_of: shard {} of {} does not exist", index, world_size);
  const std::int64_t n = full.numel();
  DSTRAIN_CHECK(n % world_size == 0,
                "shard_of: {} elements ({}) do not split into {} equal shards. Fix: pad the flat buffer to a multiple "
                "of the world size",
                n, full.str(), world_size);
  const std::int64_t shard = n / world_size;
  return Tensor(static_cast<char*>(full.data) + static_cast<std::size_t>(shard * index) * dtype_size(full.dtype), full.dtype, Shape{shard},
                full.device);
}

Communicator::Communicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {
  DSTRAIN_CHECK(world_size >= 1, "a communicator needs world size >= 1, got {}", world_size);
  DSTRAIN_CHECK(rank >= 0 && rank < world_size, "rank {} is outside world size {} (ranks are 0..{})", rank, world_size, world_size - 1);
  sends_to_.assign(static_cast<std::size_t>(world_size), 0);
  recvs_from_.assign(static_cast<std::size_t>(world_size), 0);
  node_of_rank_.assign(static_cast<std::size_t>(world_size), 0);
}

int Communicator::node_of(int rank) const {
  DSTRAIN_CHECK(rank >= 0 && rank < world_size_, "node_of: rank {} is outside this group of {} ranks (ranks 0..{})", rank, world_size_,
                world_size_ - 1);
  return node_of_rank_[static_cast<std::size_t>(rank)];
}

int Communicator::node_count() const { return node_count_; }

int Communicator::ranks_on_node(int node) const {
  return static_cast<int>(std::count(node_of_rank_.begin(), node_of_rank_.end(), node));
}

void Communicator::set_nodes(std::vector<int> node_of_rank) {
  DSTRAIN_CHECK(node_of_rank.size() == static_cast<std::size_t>(world_size_),
                "set_nodes on rank {}: {} node ids for a group of {} ranks; pass one node id per rank of this group (a split group's "
                "world_size(), not the global one)",
                rank_, node_of_rank.size(), world_size_);
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    DSTRAIN_CHECK(node_of_rank[r] >= 0, "set_nodes on rank {}: rank {} has node id {}; node ids are >= 0", rank_, r, node_of_rank[r]);
  }
  std::vector<int> distinct = node_of_rank;
  std::sort(distinct.begin(), distinct.end());
  node_count_ = static_cast<int>(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
  const int mine = node_of_rank[static_cast<std::size_t>(rank_)];
  ranks_off_node_ = static_cast<int>(std::count_if(node_of_rank.begin(), node_of_rank.end(), [mine](int n) { return n != mine; }));
  node_of_rank_ = std::move(node_of_rank);
  nodes_given_ = true;
}

template <typename Fn>
void Communicator::run(CollectiveKind kind, std::uint64_t buffer_bytes, bool is_root, Fn&& fn) {
  ++sequence_;
  try {
    fn();
  } catch (const Error& e) {
    on_error(e.what());
    throw;
  }
  auto& s = stats_;
  s.calls[static_cast<std::size_t>(kind)] += 1;
  s.bytes[static_cast<std::size_t>(kind)] += ring_bytes_sent(kind, buffer_bytes, world_size_, is_root);
  s.cross_node_bytes[static_cast<std::size_t>(kind)] += cross_node_bytes_sent(kind, buffer_bytes, world_size_, ranks_off_node_, node_count_, is_root);
}

void Communicator::all_reduce(Tensor buf, ReduceOp op) {
  run(CollectiveKind::all_reduce, buf.nbytes(), false, [&] {
    const auto call = fmt::format("all_reduce #{} on rank {}", sequence_, rank_);
    check_dtype(call, buf.dtype, "the buffer");
    check_op(call, buf.dtype, op);
    check_data(call, buf, "the buffer");
    do_all_reduce(buf, op);
  });
}

// The checks reduce-scatter and all-gather share: `full` holds world_size × `shard`'s elements
// (reduce-scatter: full = send; all-gather: full = recv), same dtype and device, and when the two
// overlap, `shard` must be exactly this rank's shard of `full` (the in-place form).
void Communicator::check_full_and_shard(const std::string& call, const Tensor& full, const char* full_name, const Tensor& shard,
                                        const char* shard_name) const {
  DSTRAIN_CHECK(full.dtype == shard.dtype, "{}: {} is {} but {} is {}; both must have the same dtype", call, full_name, full.str(), shard_name,
                shard.str());
  DSTRAIN_CHECK(full.device == shard.device, "{}: {} is on {} but {} on {}", call, full_name, full.device.str(), shard_name, shard.device.str());
  DSTRAIN_CHECK(full.numel() == shard.numel() * world_size_, "{}: {} has {} elements, {} {}; {} must hold world_size ({}) × {}'s elements", call,
                full_name, full.numel(), shard_name, shard.numel(), full_name, world_size_, shard_name);
  check_data(call, full, full_name);
  check_data(call, shard, shard_name);
  if (overlaps(full, shard)) {
    DSTRAIN_CHECK(shard.data == shard_of(full, rank_, world_size_).data,
                  "{}: {} overlaps {} but is not this rank's shard of it; in place, {} must be shard_of({}, {}, {})", call, shard_name, full_name,
                  shard_name, full_name, rank_, world_size_);
  }
}

void Communicator::reduce_scatter(Tensor send, Tensor recv, ReduceOp op) {
  run(CollectiveKind::reduce_scatter, send.nbytes(), false, [&] {
    const auto call = fmt::format("reduce_scatter #{} on rank {}", sequence_, rank_);
    check_dtype(call, send.dtype, "send");
    check_op(call, send.dtype, op);
    check_full_and_shard(call, send, "send", recv, "recv");
    do_reduce_scatter(send, recv, op);
  });
}

void Communicator::all_gather(Tensor send, Tensor recv) {
  run(CollectiveKind::all_gather, recv.nbytes(), false, [&] {
    const auto call = fmt::format("all_gather #{} on rank {}", sequence_, rank_);
    check_dtype(call, recv.dtype, "recv");
    check_full_and_shard(call, recv, "recv", send, "send");
    do_all_gather(send, recv);
  });
}

void Communicator::broadcast(Tensor buf, int root) {
  run(CollectiveKind::broadcast, buf.nbytes(), root == rank_, [&] {
    const auto call = fmt::format("broadcast #{} on rank {}", sequence_, rank_);
    check_dtype(call, buf.dtype, "the buffer");
    DSTRAIN_CHECK(root >= 0 && root < world_size_, "{}: root {} is not a rank (world size {})", call, root, world_size_);
    check_data(call, buf, "the buffer");
    do_broadcast(buf, root);
  });
}

void Communicator::all_to_all(Tensor send, Tensor recv) {
  run(CollectiveKind::all_to_all, send.nbytes(), false, [&] {
    const auto call = fmt::format("all_to_all #{} on rank {}", sequence_, rank_);
    check_dtype(call, send.dtype, "send");
    DSTRAIN_CHECK(send.dtype == recv.dtype && send.numel() == recv.numel() && send.device == recv.device,
                  "{}: send ({}) and recv ({}) must have the same dtype, element count and device", call, send.str(), recv.str());
    DSTRAIN_CHECK(send.numel() % world_size_ == 0,
                  "{}: {} elements do not split into {} equal shards. Fix: pad the buffers to a multiple of the world size", call, send.numel(),
                  world_size_);
    check_data(call, send, "send");
    check_data(call, recv, "recv");
    DSTRAIN_CHECK(!overlaps(send, recv), "{}: send and recv overlap; all_to_all has no in-place form. Fix: use two buffers", call);
    do_all_to_all(send, recv);
  });
}

std::string all_to_all_v_mismatch(std::string_view backend, std::uint64_t sequence, int sender, std::int64_t sent, int receiver,
                                  std::int64_t expected) {
  return fmt::format(
      "{}: all_to_all_v #{}: rank {} sends {} elements to rank {} (its send_counts[{}]) but rank {} expects {} from rank {} (its "
      "recv_counts[{}]). Every rank's recv_counts[i] must equal rank i's send_counts[rank]. Fix: get recv_counts from "
      "exchange_counts(send_counts), or derive both from the same routing on every rank",
      backend, sequence, sender, sent, receiver, receiver, receiver, expected, sender, sender);
}

// The checks of one rank's counts: W of them, none negative, their sum (without overflow) within
// the tensor. Returns the sum.
std::int64_t Communicator::check_counts(const std::string& call, std::span<const std::int64_t> counts, const char* name, const Tensor& t,
                                        const char* what) const {
  DSTRAIN_CHECK(counts.size() == static_cast<std::size_t>(world_size_),
                "{}: {} has {} entries but the world size is {}. Fix: pass one count per rank of this communicator (a split group's "
                "world_size(), not the global one)",
                call, name, counts.size(), world_size_);
  std::int64_t sum = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    DSTRAIN_CHECK(counts[i] >= 0, "{}: {}[{}] is {}; counts are numbers of elements, >= 0. Fix: pass 0 for a rank that gets nothing",
                  call, name, i, counts[i]);
    DSTRAIN_CHECK(counts[i] <= t.numel() - sum,
                  "{}: {} sum to more than {}'s {} elements (at {}[{}] = {}, the blocks so far hold {}). Fix: size {} to at least "
                  "the sum of {}, or lower the counts",
                  call, name, what, t.numel(), name, i, counts[i], sum, what, name);
    sum += counts[i];
  }
  return sum;
}

void Communicator::all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv, std::span<const std::int64_t> recv_counts) {
  // The bytes to the other ranks, for stats(); computed once the counts are known to be sane.
  std::uint64_t sent_bytes = 0;
  std::uint64_t cross_bytes = 0;  // of them, to ranks on other nodes
  run(CollectiveKind::all_to_all_v, 0, false, [&] {
    const auto call = fmt::format("all_to_all_v #{} on rank {}", sequence_, rank_);
    check_dtype(call, send.dtype, "send");
    DSTRAIN_CHECK(send.dtype == recv.dtype,
                  "{}: send is {} but recv is {}; both must have the same dtype (the blocks are copied, not converted). Fix: cast "
                  "one of them first",
                  call, send.str(), recv.str());
    DSTRAIN_CHECK(send.device == recv.device, "{}: send is on {} but recv on {}; both must be on the same device", call, send.device.str(),
                  recv.device.str());
    check_counts(call, send_counts, "send_counts", send, "send");
    check_counts(call, recv_counts, "recv_counts", recv, "recv");
    check_data(call, send, "send");
    check_data(call, recv, "recv");
    DSTRAIN_CHECK(!overlaps(send, recv), "{}: send ({}) and recv ({}) overlap; all_to_all_v has no in-place form. Fix: use two buffers",
                  call, send.str(), recv.str());
    const int my_node = node_of_rank_[static_cast<std::size_t>(rank_)];
    for (int j = 0; j < world_size_; ++j) {
      if (j == rank_) continue;
      const std::uint64_t block = static_cast<std::uint64_t>(send_counts[static_cast<std::size_t>(j)]) * dtype_size(send.dtype);
      sent_bytes += block;
      if (node_of_rank_[static_cast<std::size_t>(j)] != my_node) cross_bytes += block;
    }
    do_all_to_all_v(send, send_counts, recv, recv_counts);
  });
  stats_.bytes[static_cast<std::size_t>(CollectiveKind::all_to_all_v)] += world_size_ > 1 ? sent_bytes : 0;
  stats_.cross_node_bytes[static_cast<std::size_t>(CollectiveKind::all_to_all_v)] += cross_bytes;
}

std::vector<std::int64_t> Communicator::exchange_counts(std::span<const std::int64_t> send_counts) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(world_size_), 0);
  run(CollectiveKind::all_to_all, static_cast<std::uint64_t>(world_size_) * sizeof(std::int64_t), false, [&] {
    const auto call = fmt::format("exchange_counts (all_to_all #{}) on rank {}", sequence_, rank_);
    DSTRAIN_CHECK(send_counts.size() == static_cast<std::size_t>(world_size_),
                  "{}: send_counts has {} entries but the world size is {}. Fix: pass one count per rank of this communicator", call,
                  send_counts.size(), world_size_);
    for (std::size_t i = 0; i < send_counts.size(); ++i)
      DSTRAIN_CHECK(send_counts[i] >= 0, "{}: send_counts[{}] is {}; counts are numbers of elements, >= 0", call, i, send_counts[i]);
    do_exchange_counts(send_counts, out);
  });
  return out;
}

void Communicator::do_exchange_counts(std::span<const std::int64_t> send_counts, std::span<std::int64_t> out) {
  // Each count as two int32 words: all_to_all moves bits, so the int64 arrives unchanged.
  static_assert(sizeof(std::int64_t) == 2 * sizeof(std::int32_t));
  const auto w = static_cast<std::int64_t>(world_size_);
  std::vector<std::int64_t> in(send_counts.begin(), send_counts.end());
  do_all_to_all(Tensor(in.data(), DType::int32, Shape{2 * w}), Tensor(out.data(), DType::int32, Shape{2 * w}));
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  try {
    DSTRAIN_CHECK(color >= 0,
                  "split on rank {} (after collective #{}): color {} is negative; every rank must join a group, so colors are >= 0 "
                  "(there is no MPI_UNDEFINED here). Fix: give the ranks that need no group a color of their own",
                  rank_, sequence_, color);
    std::unique_ptr<Communicator> child = do_split(color, key);
    DSTRAIN_CHECK(child != nullptr, "split on rank {}: the {} backend returned no communicator", rank_, backend());
    if (node_count_ > 1 && !child->nodes_given_) {
      // The child's members learn each other's nodes: every member sends its node to every member.
      const std::vector<std::int64_t> mine(static_cast<std::size_t>(child->world_size()), node_of_rank_[static_cast<std::size_t>(rank_)]);
      const std::vector<std::int64_t> theirs = child->exchange_counts(mine);
      child->set_nodes(std::vector<int>(theirs.begin(), theirs.end()));
    }
    return child;
  } catch (const Error& e) {
    on_error(e.what());
    throw;
  }
}

void Communicator::send(Tensor buf, int peer) { point_to_point(CollectiveKind::send, buf, peer); }

void Communicator::recv(Tensor buf, int peer) { point_to_point(CollectiveKind::recv, buf, peer); }

std::uint64_t Communicator::sends_to(int peer) const {
  DSTRAIN_CHECK(peer >= 0 && peer < world_size_, "sends_to: rank {} is outside the world of {} ranks", peer, world_size_);
  return sends_to_[static_cast<std::size_t>(peer)];
}

std::uint64_t Communicator::recvs_from(int peer) const {
  DSTRAIN_CHECK(peer >= 0 && peer < world_size_, "recvs_from: rank {} is outside the world of {} ranks", peer, world_size_);
  return recvs_from_[static_cast<std::size_t>(peer)];
}

// Not run(): a point-to-point call leaves sequence() alone (the other ranks do not see it), and is
// numbered in its pair's order instead. Its errors poison the group like a collective's, so that
// the peer waiting for it fails now, not at the timeout.
void Communicator::check_peer(std::string_view name, int peer, bool sending) const {
  DSTRAIN_CHECK(peer >= 0 && peer < world_size_,
                "{} on rank {}: peer {} is not a rank of this communicator (world size {}: ranks 0..{}). Fix: pass a rank of this "
                "group (a split group numbers its ranks from 0: Communicator::rank() of the peer's communicator)",
                name, rank_, peer, world_size_, world_size_ - 1);
  DSTRAIN_CHECK(peer != rank_,
                "{} on rank {}: peer {} is this rank itself (world size {}); a rank cannot {} itself. Fix: copy the buffer "
                "directly where peer == rank, or choose another peer",
                name, rank_, peer, world_size_, sending ? "send to" : "receive from");
}

void Communicator::point_to_point(CollectiveKind kind, const Tensor& buf, int peer) {
  const bool sending = kind == CollectiveKind::send;
  try {
    const char* name = sending ? "send" : "recv";
    check_peer(name, peer, sending);
    std::uint64_t& number = (sending ? sends_to_ : recvs_from_)[static_cast<std::size_t>(peer)];
    ++number;
    const auto call = fmt::format("{} #{} {} rank {} on rank {}", name, number, sending ? "to" : "from", peer, rank_);
    check_dtype(call, buf.dtype, "the buffer");
    check_data(call, buf, "the buffer");
    if (sending) {
      do_send(buf, peer);
    } else {
      do_recv(buf, peer);
    }
  } catch (const Error& e) {
    on_error(e.what());
    throw;
  }
  count_point_to_point(kind, buf.nbytes(), peer);
}

void Communicator::count_point_to_point(CollectiveKind kind, std::uint64_t bytes, int peer) {
  const bool off_node = node_of_rank_[static_cast<std::size_t>(peer)] != node_of_rank_[static_cast<std::size_t>(rank_)];
  stats_.calls[static_cast<std::size_t>(kind)] += 1;
  stats_.bytes[static_cast<std::size_t>(kind)] += ring_bytes_sent(kind, bytes, world_size_);
  stats_.cross_node_bytes[static_cast<std::size_t>(kind)] += cross_node_bytes_sent(kind, bytes, world_size_, off_node ? 1 : 0, node_count_);
}

// point_to_point for a whole batch: every op is checked before any is numbered or posted (so a bad
// op posts nothing), then the batch is numbered in its order and handed to the backend at once;
// wait() counts it as its sends and recvs one by one.
PointToPointRequest Communicator::start_send_recv(std::span<const PointToPointOp> ops) {
  PointToPointRequest request;
  if (ops.empty()) return request;
  const std::size_t n = ops.size();
  std::vector<PointToPointCall> calls(n);
  try {
    for (std::size_t i = 0; i < n; ++i) {
      const PointToPointOp& op = ops[i];
      const std::string name = fmt::format("{} (op {} of {} of a send_recv batch)", op.is_send ? "send" : "recv", i + 1, n);
      check_peer(name, op.peer, op.is_send);
      check_dtype(fmt::format("{} on rank {}", name, rank_), op.buffer.dtype, "the buffer");
      check_data(fmt::format("{} on rank {}", name, rank_), op.buffer, "the buffer");
    }
    // The batch's ops run concurrently: a recv writing memory another op reads or writes would race.
    for (std::size_t i = 0; i < n; ++i) {
      if (ops[i].is_send) continue;
      for (std::size_t j = 0; j < n; ++j) {
        DSTRAIN_CHECK(j == i || !overlaps(ops[i].buffer, ops[j].buffer),
                      "send_recv on rank {}: the buffer of op {} (recv from rank {}) overlaps the buffer of op {} ({} rank {}); the ops of "
                      "a batch run at the same time, so a recv's buffer must be its own. Fix: give each recv its own buffer, or issue the "
                      "ops in two batches",
                      rank_, i + 1, ops[i].peer, j + 1, ops[j].is_send ? "send to" : "recv from", ops[j].peer);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const PointToPointOp& op = ops[i];
      const auto peer = static_cast<std::size_t>(op.peer);
      const std::uint64_t number = ++(op.is_send ? sends_to_ : recvs_from_)[peer];
      calls[i] = PointToPointCall{op.is_send, op.is_send ? rank_ : op.peer, op.is_send ? op.peer : rank_, number, op.buffer.dtype, op.buffer.numel()};
    }
    request.state_ = do_start_send_recv(ops, calls);
  } catch (const Error& e) {
    on_error(e.what());
    throw;
  }
  request.comm_ = this;
  request.counted_.reserve(n);
  for (const PointToPointOp& op : ops) request.counted_.push_back({op.is_send, op.buffer.nbytes(), op.peer});
  return request;
}

void Communicator::wait(PointToPointRequest& request) {
  if (!request.pending()) return;
  DSTRAIN_CHECK(request.comm_ == this, "Communicator::wait on rank {}: the request was started on another communicator; wait it there", rank_);
  std::unique_ptr<PendingPointToPoint> state = std::move(request.state_);
  const std::vector<PointToPointRequest::Counted> counted = std::move(request.counted_);
  request.comm_ = nullptr;
  request.counted_.clear();
  if (state != nullptr) {
    try {
      do_wait(*state);
    } catch (const Error& e) {
      on_error(e.what());
      throw;
    }
  }
  for (const PointToPointRequest::Counted& c : counted) count_point_to_point(c.is_send ? CollectiveKind::send : CollectiveKind::recv, c.bytes, c.peer);
}

void Communicator::send_recv(std::span<const PointToPointOp> ops) {
  PointToPointRequest request = start_send_recv(ops);
  wait(request);
}

void Communicator::do_send(const Tensor& buf, int peer) {
  const PointToPointOp op{true, buf, peer};
  const PointToPointCall call{true, rank_, peer, sends_to(peer), buf.dtype, buf.numel()};
  do_send_recv({&op, 1}, {&call, 1});
}

void Communicator::do_recv(const Tensor& buf, int peer) {
  const PointToPointOp op{false, buf, peer};
  const PointToPointCall call{false, peer, rank_, recvs_from(peer), buf.dtype, buf.numel()};
  do_send_recv({&op, 1}, {&call, 1});
}

void Communicator::do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) {
  std::unique_ptr<PendingPointToPoint> pending = do_start_send_recv(ops, calls);
  if (pending != nullptr) do_wait(*pending);
}

std::unique_ptr<PendingPointToPoint> Communicator::do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) {
  do_send_recv(ops, calls);  // a blocking backend: complete when started
  return nullptr;
}

void Communicator::do_wait(PendingPointToPoint& /*pending*/) {}

void Communicator::do_abandon(PendingPointToPoint& pending) noexcept {
  try {
    do_wait(pending);
  } catch (const std::exception& e) {
    log_error("{} communicator, rank {}: a point-to-point request destroyed without wait() failed to complete: {}", backend(), rank_, e.what());
  }
}

PointToPointRequest::PointToPointRequest(PointToPointRequest&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)), state_(std::move(other.state_)), counted_(std::move(other.counted_)) {}

PointToPointRequest& PointToPointRequest::operator=(PointToPointRequest&& other) noexcept {
  if (this != &other) {
    abandon();
    comm_ = std::exchange(other.comm_, nullptr);
    state_ = std::move(other.state_);
    counted_ = std::move(other.counted_);
  }
  return *this;
}

PointToPointRequest::~PointToPointRequest() { abandon(); }

void PointToPointRequest::wait() {
  if (comm_ != nullptr) comm_->wait(*this);
}

void PointToPointRequest::abandon() noexcept {
  Communicator* comm = std::exchange(comm_, nullptr);
  std::unique_ptr<PendingPointToPoint> state = std::move(state_);
  counted_.clear();
  if (comm != nullptr && state != nullptr) comm->do_abandon(*state);
}

void Communicator::barrier() {
  run(CollectiveKind::barrier, 0, false, [&] { do_barrier(); });
}

}  // namespace dstrain
