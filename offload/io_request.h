// The completion side of the io_uring engine: IoRequestState counts a request's pieces down as the
// rings finish them and keeps the first failure; IoHandle is what a caller waits on; IoTracker is
// the engine's count of unfinished requests, for wait_all (docs/offload.md §1.5).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace dstrain {

// Every unfinished request of one engine, and the first failure since the last wait_all.
class IoTracker {
 public:
  void started();
  void finished(const std::string* error);
  // Blocks until no request is unfinished; throws Error with the first failure since the last call.
  void wait_all();
  // Blocks until no request is unfinished; failures stay for wait_all.
  void wait_idle();
  std::size_t unfinished() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::size_t unfinished_ = 0;
  std::string first_error_;
};

class IoRequestState {
 public:
  // `pieces` > 0. The trackers (the engine's, the file's) outlive the request: the engine and a
  // file wait for their requests before they end. `waited_ns` (shared with the engine, which may
  // end before a finished handle is waited for): where wait() adds the nanoseconds it blocked.
  IoRequestState(std::size_t pieces, IoTracker* engine, IoTracker* file, std::shared_ptr<std::atomic<std::uint64_t>> waited_ns = nullptr);

  // Called once per piece, by the ring thread that completed it; `error` null on success.
  void piece_done(const std::string* error);
  void wait();
  bool done() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  std::size_t left_;
  std::string error_;
  IoTracker* engine_;
  IoTracker* file_;
  std::shared_ptr<std::atomic<std::uint64_t>> waited_ns_;
};

// A read or write in flight. wait() blocks until every piece has completed and throws Error with
// the first failure (file, offset, bytes, fix); a default or finished handle returns at once.
class IoHandle {
 public:
  IoHandle() = default;
  explicit IoHandle(std::shared_ptr<IoRequestState> state) : state_(std::move(state)) {}

  void wait() const;
  bool done() const;

 private:
  std::shared_ptr<IoRequestState> state_;
};

}  // namespace dstrain
