#include "zero/comm_queue.h"

#include <omp.h>

#include <utility>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

CommQueue::CommQueue(bool overlap) : log_rank_(log_rank()), log_world_(log_world_size()) {
  if (overlap) worker_ = std::thread([this] { run_worker(); });
}

CommQueue::~CommQueue() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CommQueue::run_worker() {
  set_thread_log_rank(log_rank_, log_world_);
  omp_set_num_threads(1);  // this thread's parallel regions: one thread (see comm_queue.h)
  for (;;) {
    std::pair<Ticket, std::function<void()>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    std::uint64_t mark = 0;
    if (!error_) {  // after a failure the rest is dropped: the group is unusable
      try {
        item.second();
        if (marker_) mark = marker_();
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      marks_[item.first % kMarks] = {item.first, mark};
      completed_ = item.first;
    }
    cv_.notify_all();
  }
}

CommQueue::Ticket CommQueue::submit(std::function<void()> work) {
  if (!worker_.joinable()) {
    if (error_) std::rethrow_exception(error_);
    ++submitted_;
    try {
      work();
    } catch (...) {
      error_ = std::current_exception();
      completed_ = submitted_;  // a later wait() rethrows instead of waiting for work that will never run
      throw;
    }
    marks_[submitted_ % kMarks] = {submitted_, marker_ ? marker_() : 0};
    completed_ = submitted_;
    return submitted_;
  }
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    t = ++submitted_;
    queue_.emplace_back(t, std::move(work));
  }
  cv_.notify_all();
  return t;
}

void CommQueue::wait(Ticket ticket) {
  if (ticket == 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  DSTRAIN_CHECK(ticket <= submitted_, "CommQueue::wait: ticket {} was never submitted ({} so far)", ticket, submitted_);
  // The worker never stops while work is queued, and every collective fails within the
  // communicator's timeout, so this wait ends.
  cv_.wait(lock, [&] { return completed_ >= ticket; });  // after an error the worker still marks the dropped work done
  if (error_) std::rethrow_exception(error_);
}

std::uint64_t CommQueue::mark(Ticket ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& [t, m] = marks_[ticket % kMarks];
  return t == ticket ? m : 0;
}

void CommQueue::drain() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = submitted_;
  }
  wait(last);
}

}  // namespace dstrain
