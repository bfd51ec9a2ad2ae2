#include "offload/io_ring.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "offload/io_error.h"
#include "ops/error.h"

namespace dstrain {
namespace {

// Transient submission failures (no kernel memory for a moment, completions not yet reaped, a
// signal): retried, reaping completions in between, this many times before the ring gives up.
constexpr int kSubmitRetries = 1000;

}  // namespace

IoRing::IoRing(unsigned queue_depth, bool single_submit, bool overlap_events, unsigned file_slots, unsigned buffer_slots)
    : depth_(queue_depth), single_submit_(single_submit), overlap_events_(overlap_events) {
  io_uring_params params{};
  // Twice as many completion slots as pieces in flight: completions never overflow.
  params.flags = IORING_SETUP_CQSIZE;
  params.cq_entries = 2 * queue_depth;
  int r = io_uring_queue_init_params(queue_depth, &ring_, &params);
  if (r < 0)
    fail("cannot create an io_uring of {} entries (aio.queue_depth): {}; {}", queue_depth, std::strerror(-r),
         -r == EPERM || -r == ENOSYS ? "io_uring is disabled here (sysctl kernel.io_uring_disabled, or a container's seccomp profile): allow it "
                                       "(sysctl -w kernel.io_uring_disabled=0; docker/podman: a seccomp profile that permits io_uring_setup)"
                                     : "lower aio.queue_depth / aio.intra_op_parallelism, or raise the locked-memory limit (ulimit -l)");
  r = io_uring_register_files_sparse(&ring_, file_slots);
  if (r == 0) r = io_uring_register_buffers_sparse(&ring_, buffer_slots);
  if (r < 0) {
    io_uring_queue_exit(&ring_);
    fail(
        "cannot register {} file and {} buffer slots with an io_uring: {}; this needs Linux 5.19 or later "
        "(sparse registered files and buffers): upgrade the kernel",
        file_slots, buffer_slots, std::strerror(-r));
  }
  thread_ = std::thread([this] { run(); });
}

IoRing::~IoRing() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_one();
  thread_.join();
  io_uring_queue_exit(&ring_);
}

void IoRing::submit(std::vector<IoPiece> pieces) {
  {
    std::lock_guard lock(mutex_);
    for (IoPiece& p : pieces) queue_.push_back(std::move(p));
  }
  work_.notify_one();
}

int IoRing::set_file(unsigned slot, int fd) {
  const int r = io_uring_register_files_update(&ring_, slot, &fd, 1);
  return r < 0 ? -r : 0;
}

int IoRing::set_buffer(unsigned slot, void* data, std::size_t bytes) {
  iovec iov{data, data == nullptr ? 0 : bytes};
  __u64 tag = 0;
  const int r = io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1);
  return r < 0 ? -r : 0;
}

void IoRing::run() {
  std::deque<IoPiece> waiting;
  std::vector<IoPiece*> unsubmitted;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (in_flight_ == 0 && waiting.empty()) work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      while (!queue_.empty()) {
        waiting.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (stopping_ && waiting.empty() && in_flight_ == 0) return;
    }
    // overlap_events: top the ring up to queue_depth whenever a piece completes. Without it, a
    // batch of up to queue_depth pieces goes in only when the previous batch has completed.
    unsigned room = overlap_events_ ? depth_ - in_flight_ : (in_flight_ == 0 ? depth_ : 0);
    while (room > 0 && !waiting.empty()) {
      auto* piece = new IoPiece(std::move(waiting.front()));
      waiting.pop_front();
      --room;
      if (!broken_.empty()) {
        std::string why = broken_;
        piece->request->piece_done(&why);
        delete piece;
        continue;
      }
      if (piece->faulted && piece->fault.kind == IoFault::Kind::slow)  // the test hook's slow drive
        std::this_thread::sleep_for(std::chrono::milliseconds(IoFault::kSlowPieceDelayMs));
      prepare(piece);
      unsubmitted.push_back(piece);
      if (single_submit_) flush(unsubmitted);
    }
    if (!unsubmitted.empty()) flush(unsubmitted);
    if (in_flight_ == 0) continue;

    io_uring_cqe* cqe = nullptr;
    const int r = io_uring_wait_cqe(&ring_, &cqe);
    if (r == -EINTR || r == -EAGAIN) continue;
    if (r < 0) {
      // The ring is unusable; the pieces in the kernel cannot be waited for. Should never happen
      // with a completion queue twice the submission queue; reported rather than hung.
      broken_ = fmt::format("io_uring_wait_cqe failed: {}; the I/O engine stopped — restart the run", std::strerror(-r));
      for (IoPiece* p : in_kernel_) {
        std::string why = broken_;
        p->request->piece_done(&why);
        delete p;
      }
      in_kernel_.clear();
      in_flight_ = 0;
      continue;
    }
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      complete(static_cast<IoPiece*>(io_uring_cqe_get_data(cqe)), cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring_, seen);
  }
}

void IoRing::prepare(IoPiece* p) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  // The submission queue holds queue_depth entries and at most queue_depth pieces are prepared and
  // not yet completed, so an entry is always free.
  if (p->faulted && p->fault.kind == IoFault::Kind::error) {
    io_uring_prep_nop(sqe);  // the test hook's failure: the kernel is not asked
  } else if (p->op == IoOp::read) {
    if (p->buffer_slot >= 0)
      io_uring_prep_read_fixed(sqe, static_cast<int>(p->file_slot), p->data, p->bytes, p->offset, p->buffer_slot);
    else
      io_uring_prep_read(sqe, static_cast<int>(p->file_slot), p->data, p->bytes, p->offset);
    sqe->flags |= IOSQE_FIXED_FILE;
  } else {
    if (p->buffer_slot >= 0)
      io_uring_prep_write_fixed(sqe, static_cast<int>(p->file_slot), p->data, p->bytes, p->offset, p->buffer_slot);
    else
      io_uring_prep_write(sqe, static_cast<int>(p->file_slot), p->data, p->bytes, p->offset);
    sqe->flags |= IOSQE_FIXED_FILE;
  }
  io_uring_sqe_set_data(sqe, p);
  ++in_flight_;
  in_kernel_.insert(p);
}

void IoRing::flush(std::vector<IoPiece*>& unsubmitted) {
  int retries = 0;
  while (!unsubmitted.empty()) {
    const int r = io_uring_submit(&ring_);
    if (r > 0) {
      unsubmitted.erase(unsubmitted.begin(), unsubmitted.begin() + std::min<std::size_t>(r, unsubmitted.size()));
      continue;
    }
    const int e = r == 0 ? EAGAIN : -r;
    if ((e == EAGAIN || e == EBUSY || e == EINTR) && ++retries < kSubmitRetries) {
      // Make room: reap what has completed, or let the kernel breathe.
      io_uring_cqe* cqe = nullptr;
      if (in_flight_ > unsubmitted.size() && io_uring_peek_cqe(&ring_, &cqe) == 0) {
        unsigned head = 0;
        unsigned seen = 0;
        io_uring_for_each_cqe(&ring_, head, cqe) {
          complete(static_cast<IoPiece*>(io_uring_cqe_get_data(cqe)), cqe->res);
          ++seen;
        }
        io_uring_cq_advance(&ring_, seen);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      continue;
    }
    // The entries stay in the submission queue, which is never submitted again: fail their pieces.
    broken_ = fmt::format(
        "io_uring_submit failed: {}; the I/O engine stopped — restart the run (if it recurs, lower "
        "aio.queue_depth)",
        std::strerror(e));
    for (IoPiece* p : unsubmitted) {
      --in_flight_;
      in_kernel_.erase(p);
      std::string why = broken_;
      p->request->piece_done(&why);
      delete p;
    }
    unsubmitted.clear();
  }
}

void IoRing::complete(IoPiece* p, int result) {
  --in_flight_;
  in_kernel_.erase(p);
  if (p->faulted) {
    if (p->fault.kind == IoFault::Kind::error) result = -p->fault.errno_value;
    if (p->fault.kind == IoFault::Kind::short_transfer && result > 0) result = static_cast<int>(p->bytes / 2);
  }
  std::string message;
  if (result < 0)
    message = io_failure_message(p->op, *p->path, p->offset, p->bytes, -result);
  else if (static_cast<std::uint32_t>(result) < p->bytes)
    message = io_short_message(p->op, *p->path, p->offset, p->bytes, static_cast<std::uint64_t>(result));
  p->request->piece_done(message.empty() ? nullptr : &message);
  delete p;
}

}  // namespace dstrain
