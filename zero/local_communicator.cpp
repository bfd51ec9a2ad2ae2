#include "zero/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <vector>
#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <thread>

#include "ops/error.h"
#include "ops/log.h"
#include "zero/pairwise_collectives.h"
#include "zero/rank_reduce.h"

#if DSTRAIN_LOCAL_COMM_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/compute_stream.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_scope.h"
#include "ops/cuda/rank_reduce.h"
#endif

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

#if DSTRAIN_LOCAL_COMM_CUDA
// ---- the same work on device memory, enqueued on the device's legacy default stream ----

RankReduceOp rank_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return RankReduceOp::sum;
    case ReduceOp::avg:
      return RankReduceOp::avg;
    case ReduceOp::max:
      return RankReduceOp::max;
  }
  return RankReduceOp::sum;
}

// reduce_over_ranks's device twin (zero/rank_reduce.h): one kernel, the inputs in rank order,
// every output written.
void device_reduce(DType dtype, const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t n, ReduceOp op) {
  DSTRAIN_CHECK(static_cast<int>(in.size()) <= kRankReduceMaxBuffers,
                "local communicator: {} ranks share one GPU, but a device reduction takes at most {}; use fewer --num-ranks or the "
                "nccl backend",
                in.size(), kRankReduceMaxBuffers);
  cuda_rank_reduce(in.data(), static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()), dtype, static_cast<std::size_t>(n),
                   rank_reduce_op(op), cuda::compute_stream());
}

void device_copy(void* dst, const void* src, std::size_t bytes) {
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda::compute_stream()));
}
#endif

// The work of a collective on `device`: executed on the host, enqueued on the GPU.
void reduce_on(const Device& device, DType dtype, const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t n, ReduceOp op) {
#if DSTRAIN_LOCAL_COMM_CUDA
  if (device.is_cuda()) return device_reduce(dtype, in, out, n, op);
#endif
  (void)device;
  reduce_over_ranks(dtype, in, out, n, op);
}

void copy_on(const Device& device, void* dst, const void* src, std::size_t bytes) {
#if DSTRAIN_LOCAL_COMM_CUDA
  if (device.is_cuda()) return device_copy(dst, src, bytes);
#endif
  (void)device;
  std::memcpy(dst, src, bytes);
}

const char* at(const void* p, std::int64_t elements, DType dtype) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(elements) * dtype_size(dtype);
}
char* at(void* p, std::int64_t elements, DType dtype) { return static_cast<char*>(p) + static_cast<std::size_t>(elements) * dtype_size(dtype); }

struct Range {
  const char* begin;
  std::size_t bytes;
  const char* what;
};

bool ranges_overlap(const Range& a, const Range& b) {
  return a.bytes > 0 && b.bytes > 0 && a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i == 0 ? "" : ", ", ranks[i]);
  return s;
}

}  // namespace

namespace {

// "all_reduce #3 (fp32, 1024 elements, sum)": how errors name a call — the message backends' words
// (describe_call), with all_to_all_v's receive count, which only the local backend sees.
std::string describe(const LocalGroup::Call& c, int world) {
  if (c.kind == CollectiveKind::all_to_all_v) {
    return fmt::format("{} #{} ({}, sending {}, receiving {} elements)", collective_name(c.kind), c.sequence, dtype_name(c.dtype), c.count,
                       c.recv_count);
  }
  return describe_call(make_call(c.sequence, c.kind, c.dtype, c.count, c.op, c.root), world);
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// LocalGroup

LocalGroup::LocalGroup(int world_size, std::chrono::milliseconds timeout)
    : world_size_(world_size), timeout_(timeout), slots_(static_cast<std::size_t>(std::max(world_size, 0))) {
  DSTRAIN_CHECK(world_size >= 1, "a local group needs at least 1 rank, got {}", world_size);
  DSTRAIN_CHECK(timeout.count() > 0, "a local group's timeout must be positive, got {} ms", timeout.count());
}

void LocalGroup::poison(const std::string& message) {
  std::string first = message;
  std::vector<std::shared_ptr<LocalGroup>> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!poison_.empty()) first = poison_;
    for (const ChildMembership& m : children_)
      if (auto child = m.group.lock()) children.push_back(std::move(child));
  }
  // The sub-groups first, outside mu_ (no two groups' locks are ever held together), with this
  // group's first message, the root cause: a rank woken by this group's poison below finds its
  // sub-groups poisoned already, rather than completing one more collective there.
  for (const auto& child : children) child->poison(first);
  std::lock_guard<std::mutex> lock(mu_);
  poison_locked(message);
}

bool LocalGroup::poisoned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !poison_.empty();
}

void LocalGroup::leave(int rank) { leave(rank, true); }

void LocalGroup::leave(int rank, bool with_children) {
  std::vector<std::pair<std::shared_ptr<LocalGroup>, int>> joined;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.at(static_cast<std::size_t>(rank)).left = true;
    cv_.notify_all();
    for (const ChildMembership& m : children_) {
      if (!with_children) break;
      if (m.rank != rank) continue;
      if (auto child = m.group.lock()) joined.emplace_back(std::move(child), m.child_rank);
    }
  }
  for (const auto& [child, child_rank] : joined) child->leave(child_rank);
}

std::shared_ptr<LocalGroup> LocalGroup::child_group(std::uint64_t split, int color, int size) {
  std::lock_guard<std::mutex> lock(mu_);
  PendingChild& pending = pending_children_[{split, color}];
  if (!pending.group) pending.group = std::make_shared<LocalGroup>(size, timeout_);
  std::shared_ptr<LocalGroup> group = pending.group;
  if (++pending.taken == size) pending_children_.erase({split, color});
  return group;
}

void LocalGroup::adopt(int rank, const std::shared_ptr<LocalGroup>& child, int child_rank) {
  std::string poisoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(children_, [](const ChildMembership& m) { return m.group.expired(); });
    children_.push_back(ChildMembership{child, rank, child_rank});
    poisoned = poison_;
  }
  if (!poisoned.empty()) child->poison(poisoned);
}

void LocalGroup::poison_locked(const std::string& message) {
  if (poison_.empty()) poison_ = message.empty() ? std::string("local communicator group failed") : message;
  cv_.notify_all();
}

void LocalGroup::throw_poison_locked() const { throw Error(poison_); }

std::string LocalGroup::check_calls_locked() const {
  const Call& c0 = call_of(0);
  for (int r = 1; r < world_size_; ++r) {
    const Call& c = call_of(r);
    const bool reduces = c.kind == CollectiveKind::all_reduce || c.kind == CollectiveKind::reduce_scatter;
    // all_to_all_v's sizes differ per rank by design: its counts are checked pair by pair below.
    const bool sized = c.kind != CollectiveKind::all_to_all_v;
    const bool same = c.kind == c0.kind && c.sequence == c0.sequence &&
                      (c.kind == CollectiveKind::barrier || (c.dtype == c0.dtype && (!sized || c.count == c0.count) && (!reduces || c.op == c0.op) &&
                                                             (c.kind != CollectiveKind::broadcast || c.root == c0.root)));
    if (!same) {
      return fmt::format(
          "local communicator: collective mismatch: rank 0 called {} but rank {} called {}. Every rank must issue the "
          "same collectives in the same order with the same dtype, element count, op and root. Fix: look for a "
          "rank-dependent branch or size before this call",
          describe(c0, world_size_), r, describe(c, world_size_));
    }
  }
  // all_to_all_v: what rank a sends rank b is what rank b expects from rank a, for every pair (a
  // rank's block to itself included). Every rank is in the call, so their counts are readable.
  if (c0.kind == CollectiveKind::all_to_all_v) {
    for (int a = 0; a < world_size_; ++a) {
      for (int b = 0; b < world_size_; ++b) {
        const std::int64_t sent = call_of(a).send_counts[b];
        const std::int64_t expected = call_of(b).recv_counts[a];
        if (sent != expected) return all_to_all_v_mismatch("local communicator", c0.sequence, a, sent, b, expected);
      }
    }
  }
  // Device memory on one rank and host memory (or another GPU) on another: no copy could serve
  // both, and device pointers of two GPUs are two contexts' memory.
  for (int r = 1; r < world_size_; ++r) {
    const Call& c = call_of(r);
    if (c.kind != CollectiveKind::barrier && c.device != c0.device) {
      return fmt::format(
          "local communicator: in {}, rank 0's buffers are on {} but rank {}'s on {}. The ranks of a local group communicate "
          "buffers on one device: all on the CPU, or all on the same GPU. Fix: put every rank's buffers on the same device",
          describe(c0, world_size_), c0.device.str(), r, c.device.str());
    }
  }
  // Memory one rank writes must not be memory another rank reads or writes: threads share an
  // address space, so two ranks passing views of one buffer would race.
  std::vector<std::vector<Range>> ranges(static_cast<std::size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    const Call& c = call_of(r);
    const std::size_t es = dtype_size(c.dtype);
    const auto n = static_cast<std::size_t>(c.count);
    const auto w = static_cast<std::size_t>(world_size_);
    auto& v = ranges[static_cast<std::size_t>(r)];
    switch (c.kind) {
      case CollectiveKind::all_reduce:
      case CollectiveKind::broadcast:
        v.push_back({static_cast<const char*>(c.send), n * es, "buffer"});
        break;
      case CollectiveKind::reduce_scatter:
        v.push_back({static_cast<const char*>(c.send), w * n * es, "send"});
        v.push_back({static_cast<const char*>(c.recv), n * es, "recv"});
        break;
      case CollectiveKind::all_gather:
        v.push_back({static_cast<const char*>(c.send), n * es, "send"});
        v.push_back({static_cast<const char*>(c.recv), w * n * es, "recv"});
        break;
      case CollectiveKind::all_to_all:
        v.push_back({static_cast<const char*>(c.send), w * n * es, "send"});
        v.push_back({static_cast<const char*>(c.recv), w * n * es, "recv"});
        break;
      case CollectiveKind::all_to_all_v:
        v.push_back({static_cast<const char*>(c.send), n * es, "send"});
        v.push_back({static_cast<const char*>(c.recv), static_cast<std::size_t>(c.recv_count) * es, "recv"});
        break;
      case CollectiveKind::barrier:
      case CollectiveKind::send:
      case CollectiveKind::recv:
        break;
    }
  }
  for (int a = 0; a < world_size_; ++a)
    for (int b = a + 1; b < world_size_; ++b)
      for (const Range& ra : ranges[static_cast<std::size_t>(a)])
        for (const Range& rb : ranges[static_cast<std::size_t>(b)])
          if (ranges_overlap(ra, rb))
            return fmt::format(
                "local communicator: in {}, rank {}'s {} overlaps rank {}'s {}. Ranks of a local group share one "
                "address space, so each must communicate its own buffers. Fix: allocate a buffer per rank",
                describe(call_of(a), world_size_), a, ra.what, b, rb.what);
  return {};
}

std::string LocalGroup::missing_ranks_locked(const Call& call, Phase phase, bool timed_out) const {
  std::vector<int> missing;
  std::vector<int> gone;
  for (int r = 0; r < world_size_; ++r) {
    const Slot& s = slots_[static_cast<std::size_t>(r)];
    if (s.phases <= generation_) (s.left ? gone : missing).push_back(r);
  }
  std::string whose;
  for (int r : missing) {
    const Slot& s = slots_[static_cast<std::size_t>(r)];
    whose += s.has_called ? fmt::format("; rank {} last called {}", r, describe(s.call, world_size_))
                          : fmt::format("; rank {} has called no collective yet", r);
    if (s.p2p_waiting) whose += fmt::format(" and is waiting in {}", describe_point_to_point(s.p2p_waiting_in));
  }
  const char* where = phase == Phase::arrive ? "reach" : "finish";
  if (!gone.empty()) {
    return fmt::format(
        "local communicator: {} cannot complete: rank(s) {} finished (their function returned) without calling it{}{}. "
        "Every rank must issue the same collectives in the same order. Fix: look for an early return or a "
        "rank-dependent branch",
        describe(call, world_size_), ranks_text(gone), missing.empty() ? "" : fmt::format("; also missing: rank(s) {}", ranks_text(missing)), whose);
  }
  (void)timed_out;
  return fmt::format(
      "local communicator: {} timed out after {} ms: rank(s) {} of {} did not {} it{}. Every rank must issue the same "
      "collectives in the same order; a rank that skips one (an early return, a rank-dependent branch) or is stuck "
      "leaves the others waiting. Fix: find that rank's missing call, or raise DSTRAIN_COMM_TIMEOUT (seconds) if it "
      "is only slow",
      describe(call, world_size_), timeout_.count(), ranks_text(missing), world_size_, where, whose);
}

void LocalGroup::wait_all(int rank, const Call& call, Phase phase, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!poison_.empty()) throw_poison_locked();
  Slot& me = slots_[static_cast<std::size_t>(rank)];
  if (phase == Phase::arrive) {
    me.call = call;
    me.has_called = true;
  }
  ++me.phases;
  const std::uint64_t gen = generation_;
  if (++entered_ == world_size_) {
    if (phase == Phase::arrive) {
      if (std::string problem = check_calls_locked(); !problem.empty()) {
        poison_locked(problem);
        throw_poison_locked();
      }
    }
    entered_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  while (generation_ == gen && poison_.empty()) {
    bool gone = false;
    for (const Slot& s : slots_) gone = gone || (s.left && s.phases <= gen);
    if (gone) {
      poison_locked(missing_ranks_locked(call, phase, false));
      break;
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen && poison_.empty()) {
      poison_locked(missing_ranks_locked(call, phase, true));
    }
  }
  if (generation_ == gen) throw_poison_locked();
}

std::string LocalGroup::activity_locked(int peer) const {
  const Slot& s = slots_[static_cast<std::size_t>(peer)];
  if (s.p2p_waiting) return fmt::format("rank {} is waiting in {}", peer, describe_point_to_point(s.p2p_waiting_in));
  if (s.phases > generation_) return fmt::format("rank {} is waiting in {}", peer, describe(s.call, world_size_));
  if (s.has_called) return fmt::format("rank {} last called {}", peer, describe(s.call, world_size_));
  return fmt::format("rank {} has called no collective yet", peer);
}

std::string LocalGroup::point_to_point_timeout_locked(const PointToPoint& mine, int peer) const {
  PointToPointCall want = mine.call;  // the call the peer owes: the other side of this one
  want.is_send = !mine.call.is_send;
  return fmt::format(
      "local communicator: {} timed out after {} ms: rank {} did not post the matching {}; {}. A send returns once its receiver has "
      "taken the data, and the sends and recvs between two ranks match in program order. Fix: post the matching call on rank {}, "
      "order the calls so that no two ranks wait on each other (in a ring, even ranks send first and odd ranks receive first, or "
      "one send_recv batch), or raise DSTRAIN_COMM_TIMEOUT (seconds) if rank {} is only slow",
      describe_point_to_point(mine.call), timeout_.count(), peer, describe_point_to_point(want), activity_locked(peer), peer, peer);
}

std::string LocalGroup::check_point_to_point_locked(const PointToPoint& send, const PointToPoint& recv) const {
  if (std::string problem = point_to_point_mismatch("local", send.call, recv.call); !problem.empty()) return problem;
  if (send.device != recv.device) {
    return fmt::format(
        "local communicator: in {}, rank {}'s buffer is on {} but rank {}'s ({}) on {}. The ranks of a local group communicate buffers "
        "on one device: all on the CPU, or all on the same GPU. Fix: put both buffers on the same device",
        describe_point_to_point(send.call), send.call.sender, send.device.str(), recv.call.receiver, describe_point_to_point(recv.call),
        recv.device.str());
  }
  const std::size_t bytes = static_cast<std::size_t>(send.call.count) * dtype_size(send.call.dtype);
  if (ranges_overlap({static_cast<const char*>(send.data), bytes, "send"}, {static_cast<const char*>(recv.data), bytes, "recv"})) {
    return fmt::format(
        "local communicator: in {}, rank {}'s buffer overlaps rank {}'s receive buffer. Ranks of a local group share one address "
        "space, so each must communicate its own buffers. Fix: allocate a buffer per rank",
        describe_point_to_point(send.call), send.call.sender, recv.call.receiver);
  }
  return {};
}

// The peer's oldest posted op that `op` (this rank's) pairs with: its send to this rank for a recv,
// its recv from this rank for a send. A pair's ops one way are posted in program order on both
// ranks and each is matched when the second of its two is posted, so the unmatched ones of a pair
// are the newest on each side and the oldest of them are the pair's next numbers.
LocalGroup::PointToPoint* LocalGroup::counterpart_locked(int rank, const PointToPoint& op) {
  const int peer = op.call.is_send ? op.call.receiver : op.call.sender;
  for (PointToPoint& p : slots_[static_cast<std::size_t>(peer)].posted) {
    if (p.state != PointToPoint::State::posted || p.call.is_send == op.call.is_send) continue;
    if (op.call.is_send ? p.call.sender == rank : p.call.receiver == rank) return &p;
  }
  return nullptr;
}

void LocalGroup::withdraw_locked(std::unique_lock<std::mutex>& lock, int rank, const std::vector<PointToPointHandle>& ops) {
  // A copy in progress (either rank may be the copier) always ends with done or failed: wait for
  // it, or the buffer could be freed under it.
  for (;;) {
    bool copying = false;
    for (auto it : ops) copying = copying || it->state == PointToPoint::State::copying;
    if (!copying) break;
    cv_.wait(lock);
  }
  Slot& me = slots_[static_cast<std::size_t>(rank)];
  for (auto it : ops) me.posted.erase(it);
}

std::vector<LocalGroup::PointToPointHandle> LocalGroup::post_point_to_point(int rank, const std::vector<PointToPoint>& ops) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!poison_.empty()) throw_poison_locked();
  Slot& me = slots_[static_cast<std::size_t>(rank)];
  std::vector<PointToPointHandle> mine;
  bool failed = false;
  // Every op in batch order: matched now when its peer posted first (this rank copies), posted
  // for the peer to match otherwise. Nothing here waits for a peer.
  for (const PointToPoint& op : ops) {
    auto it = me.posted.insert(me.posted.end(), op);
    it->state = PointToPoint::State::posted;
    mine.push_back(it);
    PointToPoint* other = counterpart_locked(rank, *it);
    if (other == nullptr) continue;
    PointToPoint& send = it->call.is_send ? *it : *other;
    PointToPoint& recv = it->call.is_send ? *other : *it;
    if (std::string problem = check_point_to_point_locked(send, recv); !problem.empty()) {
      poison_locked(problem);
      failed = true;
      break;
    }
    failed = !move_locked(lock, send, recv);
    if (failed) break;
  }
  if (!mine.empty()) cv_.notify_all();
  if (failed) {
    withdraw_locked(lock, rank, mine);
    throw_poison_locked();
  }
  return mine;
}

bool LocalGroup::move_locked(std::unique_lock<std::mutex>& lock, PointToPoint& send, PointToPoint& recv) {
  // Copying: neither rank withdraws the two while the lock is released.
  send.state = recv.state = PointToPoint::State::copying;
  const std::size_t bytes = static_cast<std::size_t>(recv.call.count) * dtype_size(recv.call.dtype);
  const void* from = send.data;
  void* to = recv.data;
  const Device device = recv.device;
  lock.unlock();
  std::string copy_error;
  try {
    if (bytes > 0) {
#if DSTRAIN_LOCAL_COMM_CUDA
      // Enqueued on the one device both buffers are on (checked), after both ranks' earlier work
      // (each posted after queueing it) and before their later work (each waits for done first).
      std::optional<CudaDeviceScope> current;
      if (device.is_cuda()) current.emplace(device.index);
#endif
      copy_on(device, to, from, bytes);
    }
  } catch (const std::exception& e) {
    copy_error = e.what();
  }
  lock.lock();
  const auto state = copy_error.empty() ? PointToPoint::State::done : PointToPoint::State::failed;
  send.state = recv.state = state;
  if (!copy_error.empty()) poison_locked(copy_error);  // both ranks then fail with it
  cv_.notify_all();
  return copy_error.empty();
}

void LocalGroup::wait_point_to_point(int rank, const std::vector<PointToPointHandle>& ops, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  Slot& me = slots_[static_cast<std::size_t>(rank)];
  me.p2p_waiting = true;
  bool failed = false;
  for (;;) {
    const PointToPoint* waiting = nullptr;  // the first op whose peer has not posted yet
    bool copying = false;
    for (auto it : ops) {
      failed = failed || it->state == PointToPoint::State::failed;
      copying = copying || it->state == PointToPoint::State::copying;
      if (it->state == PointToPoint::State::posted && waiting == nullptr) waiting = &*it;
    }
    if (failed || (waiting == nullptr && !copying)) break;
    if (waiting == nullptr) {
      cv_.wait(lock);  // only copies in progress: they always end
      continue;
    }
    if (!poison_.empty()) {
      failed = true;
      break;
    }
    me.p2p_waiting_in = waiting->call;
    const PointToPoint* orphan = nullptr;  // an op whose peer finished without posting it
    for (auto it : ops) {
      const int peer = it->call.is_send ? it->call.receiver : it->call.sender;
      if (orphan == nullptr && it->state == PointToPoint::State::posted && slots_[static_cast<std::size_t>(peer)].left) orphan = &*it;
    }
    if (orphan != nullptr) {
      const bool sending = orphan->call.is_send;
      const int peer = sending ? orphan->call.receiver : orphan->call.sender;
      poison_locked(fmt::format(
          "local communicator: {} cannot complete: rank {} finished (its function returned) without {} it. Every {} needs the matching {} on "
          "its peer, in the same order. Fix: look for an early return or a rank-dependent branch on rank {}",
          describe_point_to_point(orphan->call), peer, sending ? "receiving" : "sending", sending ? "send" : "recv", sending ? "recv" : "send",
          peer));
      failed = true;
      break;
    }
    if (Clock::now() >= deadline) {
      poison_locked(point_to_point_timeout_locked(*waiting, waiting->call.is_send ? waiting->call.receiver : waiting->call.sender));
      failed = true;
      break;
    }
    cv_.wait_until(lock, deadline);
  }
  withdraw_locked(lock, rank, ops);
  me.p2p_waiting = false;
  if (failed) throw_poison_locked();
}

void LocalGroup::abandon_point_to_point(int rank, const std::vector<PointToPointHandle>& ops) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  std::string unmatched;
  for (auto it : ops)
    if (it->state == PointToPoint::State::posted) unmatched += (unmatched.empty() ? "" : ", ") + describe_point_to_point(it->call);
  withdraw_locked(lock, rank, ops);
  if (unmatched.empty()) return;  // every op had completed: nothing is lost
  const std::string message = fmt::format(
      "local communicator: rank {} destroyed a point-to-point request without waiting for it (PointToPointRequest::wait); its {} were "
      "withdrawn before their peers posted the matching calls, so the pairs' numbering cannot match again. Fix: wait() every request "
      "started with start_send_recv (an exception on rank {} may have skipped it: look for its error first)",
      rank, unmatched, rank);
  log_error("{}", message);
  poison_locked(message);
}

// ---------------------------------------------------------------------------------------------
// LocalCommunicator

LocalCommunicator::LocalCommunicator(LocalGroup& group, int rank) : Communicator(rank, group.world_size()), group_(group) {}

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : Communicator(rank, group->world_size()), owned_group_(std::move(group)), group_(*owned_group_) {}

LocalCommunicator::~LocalCommunicator() {
  if (!owned_group_) return;  // the caller's group: run_local_ranks (or the caller) says when a rank leaves
  // Destroyed while an exception unwinds: the rank's function is failing, and run_local_ranks is
  // about to poison every group with that exception, the root cause. Leaving now would let a
  // peer fail first with "rank finished without calling it", and its Error, not the cause, would
  // be the one run_local_ranks rethrows. (A thread of the caller's own that catches the exception
  // leaves its peers to the timeout instead.)
  if (std::uncaught_exceptions() > 0) return;
  try {
    // This rank issues no more collectives in its split group; the groups split from it live on.
    group_.leave(rank(), false);
  } catch (...) {  // a failed lock: the others then fail at the timeout instead
  }
}

void LocalCommunicator::on_error(const std::string& message) noexcept {
  try {
    group_.poison(message);
  } catch (...) {  // a failed lock: nothing more can be done, the caller still gets its Error
  }
}

void LocalCommunicator::check_device(const Tensor& t, const char* what, const std::string& call_name) const {
  if (t.device.is_cpu()) return;
  const std::string call = call_name.empty() ? fmt::format("collective #{}", sequence()) : call_name;
#if DSTRAIN_LOCAL_COMM_CUDA
  // Device memory of a GPU this process can use, on the device the tensor names: anything else
  // (no GPU or driver, a host pointer labelled cuda) would fail later inside a copy or a kernel
  // with a CUDA error that names neither the collective nor the rank.
  if (t.device.is_cuda()) {
    if (t.data == nullptr || t.numel() == 0) return;
    cudaPointerAttributes attr{};
    const cudaError_t status = cudaPointerGetAttributes(&attr, t.data);
    if (status != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it for the next CUDA call
    const bool on_device =
        status == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == t.device.index;
    if (on_device) return;
    fail(
        "local communicator: {} of {} on rank {} is on {}; the local backend communicates host memory, or device "
        "memory of one GPU that every rank shares, and this is not device memory of {} ({}). Fix: allocate the buffer on {} "
        "(cudaMalloc, the engine's device allocator), or pass host memory as a cpu tensor",
        what, call, rank(), t.device.str(), t.device.str(),
        status != cudaSuccess                     ? fmt::format("CUDA: {}", cudaGetErrorString(status))
        : attr.type == cudaMemoryTypeHost         ? std::string("the pointer is pinned host memory")
        : attr.type == cudaMemoryTypeUnregistered ? std::string("the pointer is host memory")
                                                  : fmt::format("the pointer is memory of cuda:{}", attr.device),
        t.device.str());
  }
#endif
  fail(
      "local communicator: {} of {} on rank {} is on {}; the local backend communicates host memory (this build has no "
      "CUDA backend for device memory). Fix: use host buffers, or build with -DDSTRAIN_CUDA=ON to share one GPU between the ranks",
      what, call, rank(), t.device.str());
}

void LocalCommunicator::synchronize() {
#if DSTRAIN_LOCAL_COMM_CUDA
  if (pending_device_ < 0) return;
  CudaDeviceScope current(pending_device_);
  // Polls instead of cudaStreamSynchronize so that a GPU that never finishes fails after the
  // timeout rather than hang (the Communicator contract).
  const auto deadline = Clock::now() + group_.timeout();
  for (;;) {
    const cudaError_t status = cudaStreamQuery(cuda::compute_stream());
    if (status == cudaSuccess) break;
    if (status != cudaErrorNotReady) DSTRAIN_CUDA_CHECK(status);
    if (Clock::now() > deadline) {
      fail(
          "local communicator: rank {}: the GPU work of its collectives (up to #{}) did not finish within {} ms on cuda:{}. Fix: raise "
          "DSTRAIN_COMM_TIMEOUT (seconds) if the GPU is only busy, or look for a kernel that never ends",
          rank(), sequence(), group_.timeout().count(), pending_device_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  pending_device_ = -1;
#endif
}

// Host memory: the work is done when `work` returns, and the two rendezvous order it against the
// ranks' own reads and writes of their buffers directly.
//
// Device memory (CUDA build): `work` only enqueues copies and kernels, on the legacy default
// stream of the one device every rank's buffers are on (check_calls_locked checks it); ranks are
// threads of one process, so each rank's device pointers are valid in that device's one (primary)
// context, for every thread. One in-order stream that every rank shares orders all GPU work by
// the host order of the enqueues, and the rendezvous put the enqueues in the order the data needs:
//   1. Producers before the collective. Rank q enqueued the kernels that wrote its buffers before
//      it called the collective (program order in q's thread). The arrive rendezvous lets rank r
//      through only after every rank posted its call (a mutex hand-off: q's enqueues happen before
//      r's), so r's copies/kernel that read q's buffer are queued behind q's producers.
//   2. Consumers after the collective. The depart rendezvous lets a rank return only after every
//      rank finished `work`, i.e. enqueued all of its part of the collective. A returning rank's
//      next kernels are therefore queued behind the whole collective: those that read its result
//      (written by its own part, or, for all-reduce chunks, by the other ranks' parts) and those
//      that overwrite its buffers while another rank's part still reads them (the write-after-read
//      hazard: without depart, rank q could return and queue a kernel overwriting its send buffer
//      before rank r had queued the copy that reads it, and the copy would read the new data).
//   3. The next collective's work is queued after its arrive, hence behind all of this one's.
// Kernels on other streams: a blocking stream (created without cudaStreamNonBlocking, or the
// per-thread default stream) synchronises with the legacy stream implicitly; work on a
// non-blocking stream must be synchronised by the caller before the collective and before
// reading its result. The call returns with the work enqueued, not done (as NCCL's do): the host
// reads a result after synchronize() or any synchronising call (a cudaMemcpy to the host).
void LocalCommunicator::collective(LocalGroup::Call call, const std::function<void()>& work) {
  call.sequence = sequence();
  const auto deadline = Clock::now() + group_.timeout();
  group_.wait_all(rank(), call, LocalGroup::Phase::arrive, deadline);
  if (work) {
#if DSTRAIN_LOCAL_COMM_CUDA
    std::optional<CudaDeviceScope> current;  // device memory: enqueue on that device's stream
    if (call.device.is_cuda()) {
      current.emplace(call.device.index);
      pending_device_ = call.device.index;
    }
#endif
    work();
  }
  group_.wait_all(rank(), call, LocalGroup::Phase::depart, deadline + group_.timeout());
}

void LocalCommunicator::do_all_reduce(const Tensor& buf, ReduceOp op) {
  check_device(buf, "the buffer");
  LocalGroup::Call call{CollectiveKind::all_reduce, buf.dtype, buf.numel(), op, 0, 0, buf.data, buf.data, buf.device};
  collective(call, [&] {
    // This rank owns elements [n·r/W, n·(r+1)/W) of every rank's buffer: no two ranks touch the
    // same element, and uneven splits (W = 3) need no padding.
    const int w = world_size();
    const auto n = static_cast<std::uint64_t>(buf.numel());
    const auto begin = static_cast<std::int64_t>(n * static_cast<std::uint64_t>(rank()) / static_cast<std::uint64_t>(w));
    const auto end = static_cast<std::int64_t>(n * static_cast<std::uint64_t>(rank() + 1) / static_cast<std::uint64_t>(w));
    if (end == begin) return;
    std::vector<const void*> in;
    std::vector<void*> out;
    for (int r = 0; r < w; ++r) {
      void* p = group_.call_of(r).recv;
      in.push_back(at(p, begin, buf.dtype));
      out.push_back(at(p, begin, buf.dtype));
    }
    reduce_on(buf.device, buf.dtype, in, out, end - begin, op);
  });
}

void LocalCommunicator::do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
  check_device(send, "send");
  check_device(recv, "recv");
  LocalGroup::Call call{CollectiveKind::reduce_scatter, send.dtype, recv.numel(), op, 0, 0, send.data, recv.data, send.device};
  collective(call, [&] {
    const std::int64_t n = recv.numel();
    if (n == 0) return;
    std::vector<const void*> in;
    for (int r = 0; r < world_size(); ++r) in.push_back(at(group_.call_of(r).send, n * rank(), send.dtype));
    reduce_on(send.device, send.dtype, in, {recv.data}, n, op);
  });
}

void LocalCommunicator::do_all_gather(const Tensor& send, const Tensor& recv) {
  check_device(send, "send");
  check_device(recv, "recv");
  LocalGroup::Call call{CollectiveKind::all_gather, send.dtype, send.numel(), ReduceOp::sum, 0, 0, send.data, recv.data, send.device};
  collective(call, [&] {
    const std::int64_t n = send.numel();
    for (int r = 0; r < world_size(); ++r) {
      char* dst = at(recv.data, n * r, recv.dtype);
      const void* src = group_.call_of(r).send;
      if (dst != src && n > 0) copy_on(send.device, dst, src, send.nbytes());  // in place: own shard already there
    }
  });
}

void LocalCommunicator::do_broadcast(const Tensor& buf, int root) {
  check_device(buf, "the buffer");
  LocalGroup::Call call{CollectiveKind::broadcast, buf.dtype, buf.numel(), ReduceOp::sum, root, 0, buf.data, buf.data, buf.device};
  collective(call, [&] {
    if (rank() != root && buf.nbytes() > 0) copy_on(buf.device, buf.data, group_.call_of(root).send, buf.nbytes());
  });
}

void LocalCommunicator::do_all_to_all(const Tensor& send, const Tensor& recv) {
  check_device(send, "send");
  check_device(recv, "recv");
  const std::int64_t n = send.numel() / world_size();  // one shard
  LocalGroup::Call call{CollectiveKind::all_to_all, send.dtype, n, ReduceOp::sum, 0, 0, send.data, recv.data, send.device};
  collective(call, [&] {
    if (n == 0) return;
    // This rank writes only its own recv: shard r comes from shard `rank` of rank r's send.
    for (int r = 0; r < world_size(); ++r) {
      copy_on(send.device, at(recv.data, n * r, recv.dtype), at(group_.call_of(r).send, n * rank(), send.dtype),
              static_cast<std::size_t>(n) * dtype_size(send.dtype));
    }
  });
}

void LocalCommunicator::do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                                        std::span<const std::int64_t> recv_counts) {
  check_device(send, "send");
  check_device(recv, "recv");
  const std::int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), std::int64_t{0});
  const std::int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
  LocalGroup::Call call{CollectiveKind::all_to_all_v, send.dtype, sent, ReduceOp::sum, 0, 0, send.data, recv.data, send.device};
  call.recv_count = received;
  call.send_counts = send_counts.data();
  call.recv_counts = recv_counts.data();
  collective(call, [&] {
    // This rank writes only its own recv: block i comes from rank i's block `rank`, which starts
    // after rank i's blocks to the ranks before this one.
    const int w = world_size();
    const std::size_t es = dtype_size(send.dtype);
    std::int64_t dst = 0;
    for (int i = 0; i < w; ++i) {
      const std::int64_t n = recv_counts[static_cast<std::size_t>(i)];
      if (n > 0) {
        const LocalGroup::Call& from = group_.call_of(i);
        std::int64_t src = 0;
        for (int j = 0; j < rank(); ++j) src += from.send_counts[j];
        copy_on(send.device, at(recv.data, dst, recv.dtype), at(from.send, src, send.dtype), static_cast<std::size_t>(n) * es);
      }
      dst += n;
    }
  });
}

void LocalCommunicator::do_barrier() { collective(LocalGroup::Call{}, nullptr); }

namespace {

struct LocalPending final : PendingPointToPoint {
  std::vector<LocalGroup::PointToPointHandle> ops;
};

}  // namespace

std::unique_ptr<PendingPointToPoint> LocalCommunicator::do_start_send_recv(std::span<const PointToPointOp> ops,
                                                                           std::span<const PointToPointCall> calls) {
  std::vector<LocalGroup::PointToPoint> mine(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Tensor& buf = ops[i].buffer;
    mine[i].call = calls[i];
    check_device(buf, "the buffer", describe_point_to_point(calls[i]));
    mine[i].data = buf.data;
    mine[i].device = buf.device;
#if DSTRAIN_LOCAL_COMM_CUDA
    // Either rank may enqueue the copy; synchronize() here waits for it too.
    if (buf.device.is_cuda()) pending_device_ = buf.device.index;
#endif
  }
  auto pending = std::make_unique<LocalPending>();
  pending->ops = group_.post_point_to_point(rank(), mine);
  return pending;
}

void LocalCommunicator::do_wait(PendingPointToPoint& pending) {
  group_.wait_point_to_point(rank(), static_cast<LocalPending&>(pending).ops, Clock::now() + group_.timeout());
}

void LocalCommunicator::do_abandon(PendingPointToPoint& pending) noexcept {
  group_.abandon_point_to_point(rank(), static_cast<LocalPending&>(pending).ops);
}

std::unique_ptr<Communicator> LocalCommunicator::do_split(int color, int key) {
  // Every rank's (color, key), through the parent: a rank that does not come, or calls another
  // collective, fails here naming it, as any collective would.
  const int w = world_size();
  std::int32_t mine[2] = {color, key};
  std::vector<std::int32_t> table(static_cast<std::size_t>(2 * w));
  all_gather(Tensor(mine, DType::int32, Shape{2}), Tensor(table.data(), DType::int32, Shape{2 * w}));
  // The exchange's number is the same on every rank (the rendezvous checked it): it names this
  // split in the parent's registry, so two splits never share a child.
  const std::uint64_t split_id = sequence();
  std::vector<int> members;  // parent ranks of this color, in rank order, then stably by key
  for (int r = 0; r < w; ++r)
    if (table[static_cast<std::size_t>(2 * r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return table[static_cast<std::size_t>(2 * a + 1)] < table[static_cast<std::size_t>(2 * b + 1)]; });
  const int child_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  std::shared_ptr<LocalGroup> child = group_.child_group(split_id, color, static_cast<int>(members.size()));
  group_.adopt(rank(), child, child_rank);
  return std::unique_ptr<Communicator>(new LocalCommunicator(std::move(child), child_rank));
}

// ---------------------------------------------------------------------------------------------

void run_local_ranks(int world_size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  LocalGroup group(world_size, timeout);
  std::mutex first_mu;
  std::exception_ptr first;
  // Every thread waits at this gate until all of them exist: when the system refuses a thread
  // (a memory or process limit), the ones already started leave without touching the group, and
  // the caller gets an Error instead of std::terminate from a joinable thread's destructor.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  enum class Gate { closed, go, abort } gate = Gate::closed;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  const auto open_gate = [&](Gate to) {
    {
      std::lock_guard<std::mutex> lock(gate_mu);
      gate = to;
    }
    gate_cv.notify_all();
  };
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([&, r] {
        {
          std::unique_lock<std::mutex> lock(gate_mu);
          gate_cv.wait(lock, [&] { return gate != Gate::closed; });
          if (gate == Gate::abort) return;
        }
        set_thread_log_rank(r, world_size);
        try {
          LocalCommunicator comm(group, r);
          fn(comm);
        } catch (...) {
          std::exception_ptr e = std::current_exception();
          std::string what = "an exception that is not a std::exception";
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& ex) {
            what = ex.what();
          } catch (...) {
          }
          {
            std::lock_guard<std::mutex> lock(first_mu);
            if (!first) first = e;
          }
          // The others must not wait for this rank until the timeout. A collective's own Error
          // already poisoned the group with its message; then this one is ignored.
          group.poison(fmt::format("local communicator: rank {} failed: {}", r, what));
        }
        group.leave(r);
        set_thread_log_rank(-1, 1);
      });
    } catch (const std::system_error& e) {
      open_gate(Gate::abort);
      for (std::thread& t : threads) t.join();
      fail(
          "cannot start the thread of local rank {} of {}: {}. Each rank is a thread of this process with its own model states; give "
          "fewer --num-ranks, or raise the process or memory limits (ulimit -u / -v)",
          r, world_size, e.what());
    }
  }
  open_gate(Gate::go);
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace dstrain
