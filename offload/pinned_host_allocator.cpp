#include "offload/pinned_host_allocator.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

std::size_t system_page_size() {
  const long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::size_t>(p) : std::size_t{4096};
}

}  // namespace

PinnedHostAllocator::PinnedHostAllocator(bool lock) : page_(std::max<std::size_t>(system_page_size(), 4096)), lock_(lock) {}

std::uint64_t PinnedHostAllocator::locked_bytes() const {
  std::lock_guard<std::mutex> g(mutex_);
  return locked_bytes_;
}

std::uint64_t PinnedHostAllocator::lock_failures() const {
  std::lock_guard<std::mutex> g(mutex_);
  return lock_failures_;
}

void* PinnedHostAllocator::raw_allocate(std::size_t bytes, std::size_t alignment) {
  const bool huge = bytes >= kHugeBlockBytes;
  alignment = std::max(alignment, page_);
  if (huge) alignment = std::max(alignment, kHugeBlockBytes);
  if (bytes > std::numeric_limits<std::size_t>::max() / 2 - alignment) return nullptr;
  const std::size_t len = round_up(bytes, page_);
  // mmap returns page-aligned memory; for a larger alignment map the slack too and unmap the
  // unaligned head and the tail beyond the block.
  const std::size_t slack = alignment > page_ ? alignment : 0;
  void* raw = ::mmap(nullptr, len + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;  // out of memory: Allocator reports it with the bytes and purpose
  auto* base = static_cast<std::byte*>(raw);
  auto* block = base;
  if (slack != 0) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(base);
    block = base + (round_up(a, alignment) - a);
    if (block != base) ::munmap(base, static_cast<std::size_t>(block - base));
    const std::size_t tail = static_cast<std::size_t>((base + len + slack) - (block + len));
    if (tail != 0) ::munmap(block + len, tail);
  }
#if defined(MADV_HUGEPAGE)
  if (huge) (void)::madvise(block, len, MADV_HUGEPAGE);  // advice only; see the header
#endif
  bool locked = false;
  int lock_errno = 0;
  if (lock_) {
    locked = ::mlock(block, len) == 0;
    if (!locked) lock_errno = errno;
  }
  bool first_failure = false;
  {
    std::lock_guard<std::mutex> g(mutex_);
    mappings_[block] = Mapping{len, locked};
    if (locked) locked_bytes_ += len;
    if (lock_ && !locked) first_failure = lock_failures_++ == 0;
  }
  if (first_failure) {
    rlimit lim{};
    (void)::getrlimit(RLIMIT_MEMLOCK, &lim);
    log_warning(
        "pinned host memory: mlock of {} bytes failed ({}); the offloaded optimizer state stays in pageable memory, which the "
        "kernel may swap out. The locked-memory limit is {} bytes: raise it (ulimit -l unlimited, or memlock in "
        "/etc/security/limits.conf), or set offload_optimizer.pin_memory to false to silence this",
        len, std::strerror(lock_errno), lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_cur));
  }
  return block;
}

void PinnedHostAllocator::raw_deallocate(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) {
  std::size_t len = 0;
  {
    std::lock_guard<std::mutex> g(mutex_);
    const auto it = mappings_.find(ptr);
    if (it == mappings_.end()) return;  // Allocator already refused foreign pointers; nothing to unmap
    len = it->second.length;
    if (it->second.locked) locked_bytes_ -= len;
    mappings_.erase(it);
  }
  ::munmap(ptr, len);  // also unlocks the pages
}

}  // namespace dstrain
