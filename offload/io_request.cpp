#include "offload/io_request.h"

#include <chrono>

#include "ops/error.h"

namespace dstrain {

void IoTracker::started() {
  std::lock_guard lock(mutex_);
  ++unfinished_;
}

void IoTracker::finished(const std::string* error) {
  std::lock_guard lock(mutex_);
  if (error != nullptr && first_error_.empty()) first_error_ = *error;
  if (--unfinished_ == 0) idle_.notify_all();
}

void IoTracker::wait_all() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return unfinished_ == 0; });
  if (!first_error_.empty()) {
    const std::string e = std::move(first_error_);
    first_error_.clear();
    throw Error(e);
  }
}

void IoTracker::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return unfinished_ == 0; });
}

std::size_t IoTracker::unfinished() const {
  std::lock_guard lock(mutex_);
  return unfinished_;
}

IoRequestState::IoRequestState(std::size_t pieces, IoTracker* engine, IoTracker* file, std::shared_ptr<std::atomic<std::uint64_t>> waited_ns)
    : left_(pieces), engine_(engine), file_(file), waited_ns_(std::move(waited_ns)) {
  engine_->started();
  file_->started();
}

void IoRequestState::piece_done(const std::string* error) {
  bool last = false;
  {
    std::lock_guard lock(mutex_);
    if (error != nullptr && error_.empty()) error_ = *error;
    last = --left_ == 0;
  }
  if (!last) return;
  // The trackers first: a caller woken by wait() may close the file or end the engine at once.
  file_->finished(nullptr);
  engine_->finished(error_.empty() ? nullptr : &error_);
  std::lock_guard lock(mutex_);
  finished_.notify_all();
}

void IoRequestState::wait() {
  std::unique_lock lock(mutex_);
  if (left_ != 0) {
    // The clock is read only when the caller really blocks: a finished request costs nothing.
    const auto t0 = std::chrono::steady_clock::now();
    finished_.wait(lock, [&] { return left_ == 0; });
    if (waited_ns_) {
      *waited_ns_ += static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  if (!error_.empty()) throw Error(error_);
}

bool IoRequestState::done() const {
  std::lock_guard lock(mutex_);
  return left_ == 0;
}

void IoHandle::wait() const {
  if (state_) state_->wait();
}

bool IoHandle::done() const { return !state_ || state_->done(); }

}  // namespace dstrain
