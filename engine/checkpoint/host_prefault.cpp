#include "engine/checkpoint/host_prefault.h"

#include <sys/mman.h>

#include <algorithm>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries' headers lack the name
#endif

namespace dstrain {

namespace {
// Small enough that the filling thread, when it catches up, waits on at most one chunk's faults
// (the kernel holds the mapping's lock per call), large enough that the calls cost nothing.
constexpr std::size_t kChunk = std::size_t{8} << 20;
}  // namespace

BackgroundPrefault::BackgroundPrefault(std::byte* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  thread_ = std::thread([this, p, bytes] {
    for (std::size_t at = 0; at < bytes && !stop_.load(std::memory_order_relaxed); at += kChunk) {
      // Any failure (EINVAL: an older kernel; ENOMEM) ends the prefault: the filling thread
      // faults the rest in itself, and reports an out-of-memory as it would have anyway.
      if (::madvise(p + at, std::min(kChunk, bytes - at), MADV_POPULATE_WRITE) != 0) return;
    }
  });
}

BackgroundPrefault::~BackgroundPrefault() {
  stop_.store(true, std::memory_order_relaxed);
  wait();
}

void BackgroundPrefault::wait() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace dstrain
