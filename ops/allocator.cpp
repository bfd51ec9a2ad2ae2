#include "ops/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ops/error.h"

namespace dstrain {

namespace {

std::string usage_by_purpose(const MemoryStats& s) {
  std::string out;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    out += fmt::format("{} {}, ", memory_purpose_name(p), format_bytes(s[p].current));
  }
  return out + fmt::format("total {} (peak {})", format_bytes(s.total.current), format_bytes(s.total.peak));
}

}  // namespace

void* Allocator::allocate(std::size_t bytes, MemoryPurpose purpose, std::size_t alignment) {
  DSTRAIN_CHECK(static_cast<std::size_t>(purpose) < kNumMemoryPurposes, "allocate: invalid memory purpose {}", static_cast<int>(purpose));
  DSTRAIN_CHECK(alignment == 0 || std::has_single_bit(alignment),
                "allocate: alignment {} for {} bytes of {} is not a power of two; pass 0 for the default ({})", alignment, bytes,
                memory_purpose_name(purpose), default_alignment());
  if (bytes == 0) return nullptr;
  alignment = std::max(alignment, default_alignment());

  void* ptr = raw_allocate(bytes, alignment);  // outside the lock: the raw call may be slow
  if (ptr == nullptr) {
    const MemoryStats now = stats();
    const std::string detail = out_of_memory_detail();
    fail(
        "out of {} memory: could not allocate {} ({} bytes) for {}; in use by this allocator: {}{}{}. "
        "Fix: reduce the micro-batch size or sequence length, or save memory with ZeRO stages, offload or "
        "activation checkpointing",
        device().str(), format_bytes(bytes), bytes, memory_purpose_name(purpose), usage_by_purpose(now), detail.empty() ? "" : "; ", detail);
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.emplace(ptr, Block{bytes, alignment, purpose});
    stats_.on_allocate(bytes, purpose);
  } catch (...) {  // the map could not grow: give the block back rather than leak it
    raw_deallocate(ptr, bytes, alignment);
    throw;
  }
  return ptr;
}

const Allocator::Block& Allocator::find_block(const void* ptr, const char* what) const {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    fail(
        "{}: pointer {} was not allocated by this {} allocator, or was already freed (double free); "
        "free memory with the allocator that returned it, exactly once",
        what, ptr, device().str());
  }
  return it->second;
}

void Allocator::deallocate(void* ptr) {
  if (ptr == nullptr) return;
  Block block;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    block = find_block(ptr, "deallocate");
    blocks_.erase(ptr);
    stats_.on_free(block.bytes, block.purpose);
  }
  raw_deallocate(ptr, block.bytes, block.alignment);
}

std::size_t Allocator::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return find_block(ptr, "block_size").bytes;
}

MemoryPurpose Allocator::block_purpose(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return find_block(ptr, "block_purpose").purpose;
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Allocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.reset_peaks();
}

// ---- CpuAllocator ----

void* CpuAllocator::raw_allocate(std::size_t bytes, std::size_t alignment) {
  const bool huge = bytes >= kHugeBlockBytes;
  if (huge) alignment = std::max(alignment, kHugePageBytes);
  // std::aligned_alloc wants a size that is a multiple of the alignment; a request too large to
  // round up cannot be satisfied anyway, so it is reported as out of memory.
  if (bytes > std::numeric_limits<std::size_t>::max() - alignment) return nullptr;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* ptr = std::aligned_alloc(alignment, rounded);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: without transparent huge pages (or with them set to "never") this fails and the
  // block simply stays on 4 KiB pages.
  if (ptr != nullptr && huge) (void)madvise(ptr, rounded, MADV_HUGEPAGE);
#endif
  return ptr;
}

void CpuAllocator::raw_deallocate(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) { std::free(ptr); }

CpuAllocator& cpu_allocator() {
  static CpuAllocator* const instance = new CpuAllocator();  // intentionally leaked: see the header
  return *instance;
}

}  // namespace dstrain
