// CommQueue: the order in which one rank's collectives run, and whether they overlap compute.
//
// ZeRO issues its collectives (gradient buckets during backward, parameter gathers ahead of the
// layers that need them) through this queue, in program order. With overlap off every submit runs
// the collective at once on the calling thread. With overlap on (zero_optimization.overlap_comm)
// a worker thread of the rank runs them, one at a time and in submission order, while the caller
// goes on computing; the caller waits for a ticket only right before it reads what that collective
// writes. This is the CPU counterpart of NCCL's stream + event ordering: the same calls, the same
// order on every rank, completion observed per collective, never a global synchronize.
//
// A collective that fails on the worker is rethrown by the next wait() / drain() on the caller,
// and the queue refuses further work (the group is unusable after a failure anyway).
//
// The worker runs its CPU work (reductions, conversions, the partition adds) with ONE OpenMP thread:
// the caller's OpenMP team already has the cores, and a second team on the worker would
// oversubscribe them.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dstrain {

class CommQueue {
 public:
  using Ticket = std::uint64_t;  // 1, 2, ... in submission order; 0 = nothing to wait for

  // `overlap`: run on a worker thread, whose log lines carry the caller's rank (ops/log.h).
  explicit CommQueue(bool overlap);
  ~CommQueue();  // drains what is queued (errors are dropped: the destructor cannot throw)
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  bool overlapped() const { return worker_.joinable(); }

  // Queues `work` (a collective). Without overlap it has run when submit returns.
  Ticket submit(std::function<void()> work);
  // Returns once work `ticket` (and everything submitted before it) has run; rethrows its error.
  void wait(Ticket ticket);
  // wait() for everything submitted so far.
  void drain();

  // Marks: `marker` is called right after each work item has run, on the thread that ran it, and
  // its value is kept for that ticket — the communicator's sequence() there, so that a wait can
  // order compute after the ticket's own collectives and not after later ones (NCCL's per-ticket
  // events, Communicator::order_compute_after). Set before the first submit.
  void set_marker(std::function<std::uint64_t()> marker) { marker_ = std::move(marker); }
  // The mark of `ticket` once wait(ticket) has returned; 0 when no marker is set or the ticket is
  // older than the last kMarks tickets (then the caller orders after everything: never too early).
  std::uint64_t mark(Ticket ticket) const;

 private:
  void run_worker();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Ticket, std::function<void()>>> queue_;
  Ticket submitted_ = 0;
  Ticket completed_ = 0;
  std::exception_ptr error_;
  std::function<std::uint64_t()> marker_;
  static constexpr std::size_t kMarks = 256;
  std::array<std::pair<Ticket, std::uint64_t>, kMarks> marks_{};  // marks_[t % kMarks] = (t, mark)
  bool stop_ = false;
  int log_rank_ = 0;
  int log_world_ = 1;
  std::thread worker_;
};

}  // namespace dstrain
