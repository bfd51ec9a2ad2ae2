// IoRing: one io_uring and the thread that drives it (docs/offload.md §1.2). The engine hands it
// pieces — transfers of at most one block, on a registered (fixed) file, from a registered
// buffer where one covers them — and the thread keeps up to queue_depth of them in the kernel,
// refilling as they complete (overlap_events) or batch by batch, with one io_uring_submit per
// batch or per piece (single_submit). Each completion is checked: errno, short transfer.
#pragma once

#include <liburing.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "offload/io_fault_injection.h"
#include "offload/io_request.h"

namespace dstrain {

struct IoPiece {
  IoOp op = IoOp::read;
  unsigned file_slot = 0;  // index in the ring's fixed-file table
  int buffer_slot = -1;    // index in the fixed-buffer table; -1: not registered
  std::byte* data = nullptr;
  std::uint32_t bytes = 0;
  std::uint64_t offset = 0;
  std::shared_ptr<const std::string> path;  // for messages
  std::shared_ptr<IoRequestState> request;
  // The test hook's verdict for this piece (IoFaultInjection): none, or the fault to fake.
  bool faulted = false;
  IoFault fault;
};

class IoRing {
 public:
  // Throws Error when the kernel refuses the ring (io_uring disabled, memory limits).
  IoRing(unsigned queue_depth, bool single_submit, bool overlap_events, unsigned file_slots, unsigned buffer_slots);
  // Finishes every piece handed over, then stops the thread.
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  void submit(std::vector<IoPiece> pieces);

  // Fixed files and buffers: slot updates (fd -1 / null data empties a slot). A slot must have no
  // piece in flight when it changes (the engine waits first). Return 0 or a positive errno.
  int set_file(unsigned slot, int fd);
  int set_buffer(unsigned slot, void* data, std::size_t bytes);

 private:
  void run();
  void prepare(IoPiece* piece);
  void complete(IoPiece* piece, int result);
  // Hands the prepared entries to the kernel; on a hard failure fails them and marks the ring broken.
  void flush(std::vector<IoPiece*>& unsubmitted);

  io_uring ring_{};
  unsigned depth_;
  bool single_submit_;
  bool overlap_events_;
  unsigned in_flight_ = 0;
  std::unordered_set<IoPiece*> in_kernel_;  // prepared and not completed: failed together if the ring breaks
  std::string broken_;                      // why the ring can no longer submit (then every piece fails with it)

  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<IoPiece> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dstrain
