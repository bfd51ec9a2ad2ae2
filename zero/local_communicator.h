// The local backend: W ranks as W threads of one process, communicating host memory, or device
// memory of one GPU that all of them share (CUDA build).
//
// This is how CI trains with several ranks without GPUs or a network, and how ZeRO can be tried on
// one machine (on the CPU, or with every rank on the same GPU). Each collective is a shared-memory
// rendezvous:
//   1. arrive: every rank posts its call (kind, dtype, sizes, op, root, device) and buffer pointers,
//      and waits until all W have posted; the last to arrive checks that the calls match;
//   2. work: each rank reduces (or copies) the part of the result it owns, reading the other ranks'
//      buffers directly: all-reduce chunk r of N (chunks split N·r/W, any N), reduce-scatter
//      shard r, all-gather/broadcast/all-to-all into its own buffer. Reductions run over ranks 0, 1, ..., W−1
//      in that order, so the result is bit-identical on every rank and in every run;
//   3. depart: every rank waits until all have finished, so no buffer is reused while read.
//
// Device memory (all ranks' buffers on one cuda device; CUDA build only): the same three phases,
// but the work is enqueued rather than executed — device-to-device cudaMemcpyAsync for copies and
// cuda_rank_reduce kernels (ops/cuda/rank_reduce.h, the host reduction's semantics bit for bit)
// for reductions — on the device's legacy default stream, the stream dstrain's kernels run on.
// The call returns once the work is enqueued (as NCCL's do); synchronize() waits for it. Why the
// rendezvous make this ordering correct is explained at LocalCommunicator::collective
// (local_communicator.cpp).
//
// Failure is loud, never a hang or silent corruption:
//   - a rank that does not reach a collective within the timeout (default_comm_timeout(): 60 s or
//     DSTRAIN_COMM_TIMEOUT) fails it with an Error naming the collective, its sequence number, the
//     missing ranks and what each of them last called; a rank whose thread has finished fails the
//     others at once;
//   - mismatched calls (different collective, dtype, size, op or root) fail naming both calls;
//     in all_to_all_v, a rank whose recv_counts[i] is not rank i's send_counts[rank] fails every
//     rank, naming both ranks and both counts;
//   - after any failure, or any Error a collective raises on one rank, the group is poisoned: every
//     rank's current and later collectives throw the same message.
//
// Point-to-point (send / recv / send_recv / start_send_recv, zero/communicator.h): a rendezvous of
// the two ranks alone, outside the collectives' phases. Each rank's slot lists the ops it posted
// (start_send_recv posts a batch's, in batch order) until their request was waited for: the slots
// are the per-pair mailboxes. Whichever of a send and its recv is posted second finds the other —
// the peer's oldest unmatched op of the pair, the pair's program order, since a pair's ops one way
// are posted in order on both ranks and each is matched when the second of the two comes — checks
// that the two calls agree (number, dtype, count, device, no overlap), copies (or, on a GPU,
// enqueues the copy on the shared stream: each rank posted after queueing its earlier work and
// queues its later work only after its wait) and marks both done. So a post never waits for a
// peer, and wait() only for the peers' posts: a send's wait returns once its receiver posted and
// the data moved, so its buffer is never read after it returns, and a program whose sends wait on
// each other times out here as it would hang on NCCL; in one send_recv every op is posted before
// any waits, so two neighbours exchanging in one batch complete. Failures are the collectives': a
// mismatch poisons the group with both calls named; a peer that does not post the matching call
// within the timeout (counted from wait()) is named with what it is doing instead; a peer whose
// thread finished fails the waiting rank at once; a request destroyed without wait() withdraws its
// unmatched ops and poisons the group naming them.
//
// Sub-groups (split, zero/communicator.h): the ranks exchange (color, key) in one all_gather on the
// parent, so every rank computes the same member lists; the members of a color share one child
// LocalGroup, which the first of them to get there creates and the others find in the parent's
// registry (keyed by the exchange's sequence number and the color). Each member's child
// LocalCommunicator holds the child group (shared_ptr): it lives as long as any member's
// communicator, whatever happens to the parent. Failures cross from a group to its sub-groups,
// never the other way (a sub-group's failure reaches the rest through that rank's thread failing):
//   - a rank that leaves a group (its thread finished: run_local_ranks) leaves every sub-group it
//     joined, and theirs, so their other members fail at once instead of at the timeout;
//     destroying a split's LocalCommunicator leaves its group (only: the groups split from it do
//     not need it), except while an exception unwinds (the rank is failing: the poison below
//     then carries the cause). A sub-group reached only through a group whose every
//     communicator is gone is no longer told (its own communicator's end still is);
//   - poisoning a group poisons every sub-group split from it (and theirs), with the same message,
//     so a rank waiting in a sub-group learns the root cause, not a timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zero/communicator.h"
#include "zero/point_to_point.h"

namespace dstrain {

class LocalCommunicator;

// The state W LocalCommunicators share. Outlives them; thread-safe.
class LocalGroup {
 public:
  explicit LocalGroup(int world_size, std::chrono::milliseconds timeout = default_comm_timeout());
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Marks the group failed (the first message wins): every waiting and later collective throws it.
  // Poisons the groups split from this one too.
  void poison(const std::string& message);
  bool poisoned() const;

  // Rank `rank` will issue no more collectives (its thread is done): ranks waiting for it fail now
  // instead of at the timeout. It leaves the groups split from this one that it joined too.
  void leave(int rank);

  // One rank's current call, as the other ranks see it (public for error messages only).
  struct Call {
    CollectiveKind kind = CollectiveKind::barrier;
    DType dtype = DType::fp32;
    std::int64_t count = 0;  // all_reduce/broadcast: buffer; reduce_scatter: recv; all_gather: send
    ReduceOp op = ReduceOp::sum;
    int root = 0;
    std::uint64_t sequence = 0;
    const void* send = nullptr;  // all_reduce/broadcast: the buffer itself
    void* recv = nullptr;
    Device device = Device::cpu();  // where the buffers are (every rank's must be on the same one)
    // all_to_all_v: count is sum(send_counts), recv_count sum(recv_counts); the counts themselves
    // (world_size each, the caller's spans) are read only while every rank is in the call.
    std::int64_t recv_count = 0;
    const std::int64_t* send_counts = nullptr;
    const std::int64_t* recv_counts = nullptr;
  };

 private:
  friend class LocalCommunicator;

  // One send or recv a rank posted (see the top of this file).
  struct PointToPoint {
    PointToPointCall call;
    void* data = nullptr;  // send: read by the copier; recv: written
    Device device = Device::cpu();
    // posted (its peer has not posted the matching op) -> copying (the second of the two to post
    // moves the data: neither rank may withdraw it, even through a failure) -> done, or failed
    // (the copy threw; the group is poisoned).
    enum class State { posted, copying, done, failed } state = State::posted;
  };

  struct Slot {
    Call call;
    std::uint64_t phases = 0;  // phases this rank has entered
    bool has_called = false;
    bool left = false;
    // This rank's point-to-point ops, in post order, from start_send_recv until their request was
    // waited for or abandoned: the peers find their counterparts here. A list: handles and the
    // copier hold pointers into it.
    std::list<PointToPoint> posted;
    // The point-to-point call this rank waits in, if any (what a waiting peer's error names).
    bool p2p_waiting = false;
    PointToPointCall p2p_waiting_in;
  };
  enum class Phase { arrive, depart };

  // Posts `call` (on arrive) and waits until all ranks entered this phase. Throws the poison.
  void wait_all(int rank, const Call& call, Phase phase, std::chrono::steady_clock::time_point deadline);
  const Call& call_of(int rank) const { return slots_[static_cast<std::size_t>(rank)].call; }

  // Point-to-point, under the group's lock but outside the collectives' phases (the top of this
  // file). post: rank `rank`'s batch, in batch order; each op whose peer posted first is checked
  // and moved now (this thread copies), the others wait in the slot for their peers; never waits
  // for a peer. wait: until every op of `ops` was moved, then withdraws them. abandon: withdraws
  // them at once (a copy in progress finishes first) and, when some were unmatched, poisons the
  // group naming them. post and wait throw the poison (and poison first on a mismatch, a peer
  // that left, the deadline); neither returns nor throws while another rank copies from or into
  // this rank's buffers of `ops`.
 public:
  using PointToPointHandle = std::list<PointToPoint>::iterator;

 private:
  std::vector<PointToPointHandle> post_point_to_point(int rank, const std::vector<PointToPoint>& ops);
  void wait_point_to_point(int rank, const std::vector<PointToPointHandle>& ops, std::chrono::steady_clock::time_point deadline);
  void abandon_point_to_point(int rank, const std::vector<PointToPointHandle>& ops) noexcept;
  // Under mu_: the peer's posted op that `op` (rank `rank`'s) pairs with, or null.
  PointToPoint* counterpart_locked(int rank, const PointToPoint& op);
  // Moves send's data into recv's buffer outside the lock (both copying meanwhile), then marks
  // both done (true) or failed, poisoning the group with the copy's error (false).
  bool move_locked(std::unique_lock<std::mutex>& lock, PointToPoint& send, PointToPoint& recv);
  // Under mu_: waits for copies of `ops` in progress, then erases them from rank's slot.
  void withdraw_locked(std::unique_lock<std::mutex>& lock, int rank, const std::vector<PointToPointHandle>& ops);
  // Under mu_: "" when `send` (rank send.call.sender's post) may be received by `recv`, else the
  // Error text.
  std::string check_point_to_point_locked(const PointToPoint& send, const PointToPoint& recv) const;
  // Under mu_: what rank `peer` is doing, for a point-to-point call that waits for it.
  std::string activity_locked(int peer) const;
  std::string point_to_point_timeout_locked(const PointToPoint& mine, int peer) const;

  // leave(rank), and with `with_children` the same in the sub-groups `rank` joined.
  void leave(int rank, bool with_children);

  // Split bookkeeping (LocalCommunicator::do_split). The child group of color `color` of the split
  // whose exchange was collective #`split`: created (with `size` ranks and this group's timeout)
  // by the first member to ask, the same group for the others; forgotten once all `size` asked.
  std::shared_ptr<LocalGroup> child_group(std::uint64_t split, int color, int size);
  // Rank `rank` of this group is rank `child_rank` of `child`: leave(rank) makes it leave `child`,
  // and poison() poisons `child`. A group poisoned already poisons `child` now.
  void adopt(int rank, const std::shared_ptr<LocalGroup>& child, int child_rank);

  // Under mu_: set poison_ and wake everyone (first message wins).
  void poison_locked(const std::string& message);
  [[noreturn]] void throw_poison_locked() const;
  // Under mu_, by the last rank to arrive: empty when the calls agree, else the Error text.
  std::string check_calls_locked() const;
  std::string missing_ranks_locked(const Call& call, Phase phase, bool timed_out) const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  std::uint64_t generation_ = 0;  // completed phases
  int entered_ = 0;               // ranks in the current phase
  std::string poison_;

  // Under mu_. Children being created: (split, color) -> the group and how many members took it.
  struct PendingChild {
    std::shared_ptr<LocalGroup> group;
    int taken = 0;
  };
  std::map<std::pair<std::uint64_t, int>, PendingChild> pending_children_;
  // Under mu_. Every membership of a rank of this group in a child group (weak: the members'
  // communicators own the child; an expired one is skipped, and pruned by adopt).
  struct ChildMembership {
    std::weak_ptr<LocalGroup> group;
    int rank = 0;        // in this group
    int child_rank = 0;  // in the child
  };
  std::vector<ChildMembership> children_;
};

// One rank of a LocalGroup. Use it from one thread.
class LocalCommunicator final : public Communicator {
 public:
  // Rank `rank` of `group`, which must outlive the communicator (run_local_ranks' groups do).
  LocalCommunicator(LocalGroup& group, int rank);
  // A communicator made by split() owns (a share of) its group and leaves it when destroyed.
  ~LocalCommunicator() override;
  std::string_view backend() const override { return "local"; }
  LocalGroup& group() const { return group_; }

  // Device collectives (see the top of this file) are asynchronous: waits until every one this
  // rank issued has finished on the GPU (the device's legacy default stream drained), failing with
  // Error after the group's timeout rather than hang. No-op when all were on the host.
  void synchronize() override;

  // Nothing to do: device collectives are queued on the legacy default stream, the stream
  // dstrain's kernels run on, so compute queued after the call already runs after them (the
  // ordering argument at LocalCommunicator::collective). Host collectives are complete.
  void order_compute_after_collectives() override {}

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override;
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) override;
  void do_all_gather(const Tensor& send, const Tensor& recv) override;
  void do_broadcast(const Tensor& buf, int root) override;
  void do_barrier() override;
  void do_all_to_all(const Tensor& send, const Tensor& recv) override;
  // The rendezvous, where the last rank to arrive checks every pair's counts; then each rank copies
  // its blocks from the senders' buffers into its own recv.
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) override;
  // The rendezvous at the top of this file; the second of a pair to post copies. send, recv and
  // send_recv are the base's: start, then wait.
  std::unique_ptr<PendingPointToPoint> do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> calls) override;
  void do_wait(PendingPointToPoint& pending) override;
  // Withdraws the unmatched ops and poisons the group naming them (LocalGroup::abandon_point_to_point).
  void do_abandon(PendingPointToPoint& pending) noexcept override;
  // The (color, key) exchange, then this rank's LocalCommunicator of the shared child group (see
  // the top of this file).
  std::unique_ptr<Communicator> do_split(int color, int key) override;
  void on_error(const std::string& message) noexcept override;

 private:
  // A split's child: rank `rank` of `group`, which it shares with the other members.
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);

  // arrive, work (if any), depart; `work` runs between the two rendezvous.
  void collective(LocalGroup::Call call, const std::function<void()>& work);
  // Host memory, or (CUDA build) device memory; an Error naming the fix otherwise. `call`: how the
  // message names the call (default: "collective #<sequence()>").
  void check_device(const Tensor& t, const char* what, const std::string& call = {}) const;

  std::shared_ptr<LocalGroup> owned_group_;  // a split's child only: keeps group_ alive
  LocalGroup& group_;
  [[maybe_unused]] int pending_device_ = -1;  // (used only in CUDA builds) the cuda device with collectives not yet synchronize()d; -1: none
};

// Runs fn(communicator) on `world_size` threads, rank r on thread r, each with its own
// LocalCommunicator over one LocalGroup, and the thread's log rank set (ops/log.h
// set_thread_log_rank) so log lines carry the right rank. Returns when every thread is done;
// rethrows the first exception (in time) any rank raised — the root cause, since the other ranks
// then fail with the poisoned group's message.
void run_local_ranks(int world_size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout = default_comm_timeout());

}  // namespace dstrain
