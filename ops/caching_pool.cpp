#include "ops/caching_pool.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "ops/error.h"

namespace dstrain {

CachingPool::CachingPool(Backend backend) : backend_(std::move(backend)) {
  DSTRAIN_CHECK(backend_.allocate && backend_.free, "CachingPool: the backend needs both an allocate and a free function");
}

CachingPool::~CachingPool() {
  for (auto& [base, head] : segments_) {
    if (!head->allocated && head->next == nullptr) {
      try {
        backend_.free(reinterpret_cast<void*>(base), head->size);
      } catch (...) {  // e.g. the CUDA runtime is already unloading at exit: nothing left to do
      }
    }
    // Live blocks' memory is left to the backend (leaked): a Buffer may still point into it.
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

std::size_t CachingPool::round_size(std::size_t bytes) { return (bytes + kMinBlock - 1) / kMinBlock * kMinBlock; }

std::size_t CachingPool::segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kLargeThreshold) return kLargeSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingPool::allocate(std::size_t bytes) {
  DSTRAIN_CHECK(bytes > 0, "CachingPool::allocate: a request of 0 bytes; allocators return nullptr for those without asking the pool");
  if (bytes > max_request()) return nullptr;  // cannot even be rounded: no memory holds it
  const std::size_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallSize;

  std::lock_guard<std::mutex> lock(mutex_);
  FreeSet& cache = free_set(small);
  Block key{0, rounded, false, small, nullptr, nullptr};
  Block* block = nullptr;
  if (auto it = cache.lower_bound(&key); it != cache.end()) {  // best fit: smallest that holds it
    block = *it;
    cache.erase(it);
    ++stats_.cache_hits;
  } else {
    const std::size_t seg = segment_size(rounded);
    void* ptr = backend_.allocate(seg);
    if (ptr == nullptr) {
      // Cached segments may be what fills the memory: give them back and try once more.
      ++stats_.cache_flushes;
      release_cached_locked();
      ptr = backend_.allocate(seg);
      if (ptr == nullptr) return nullptr;
    }
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto holder = std::make_unique<Block>(Block{address, seg, false, small, nullptr, nullptr});
    try {
      segments_.emplace(address, holder.get());
    } catch (...) {
      backend_.free(ptr, seg);
      throw;
    }
    block = holder.release();
    stats_.reserved_bytes += seg;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.segments;
    ++stats_.backend_allocations;
  }

  const std::size_t rest = block->size - rounded;
  if (small ? rest >= kMinBlock : rest > kSmallSize) {
    Block* tail = new Block{block->address + rounded, rest, false, small, block, block->next};
    if (block->next != nullptr) block->next->prev = tail;
    block->next = tail;
    block->size = rounded;
    cache.insert(tail);
  }
  block->allocated = true;
  live_.emplace(block->address, block);
  stats_.allocated_bytes += block->size;
  return reinterpret_cast<void*>(block->address);
}

void CachingPool::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end()) {
    fail(
        "CachingPool::free: pointer {} is not a live block of this pool (already freed, or allocated elsewhere); "
        "free each block once, through the allocator that returned it",
        ptr);
  }
  Block* block = it->second;
  live_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= block->size;

  FreeSet& cache = free_set(block->small);
  if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {  // prev absorbs block
    cache.erase(prev);                                                   // before its size (the set's key) changes
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (Block* next = block->next; next != nullptr && !next->allocated) {  // block absorbs next
    cache.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  cache.insert(block);
}

std::size_t CachingPool::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_cached_locked();
}

std::size_t CachingPool::release_cached_locked() {
  std::size_t released = 0;
  for (FreeSet* cache : {&small_free_, &large_free_}) {
    for (auto it = cache->begin(); it != cache->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {  // part of a segment with a live block
        ++it;
        continue;
      }
      backend_.free(reinterpret_cast<void*>(b->address), b->size);  // throws: this segment stays cached
      it = cache->erase(it);
      segments_.erase(b->address);
      stats_.reserved_bytes -= b->size;
      --stats_.segments;
      ++stats_.backend_frees;
      released += b->size;
      delete b;
    }
  }
  return released;
}

std::size_t CachingPool::block_size(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  DSTRAIN_CHECK(it != live_.end(), "CachingPool::block_size: pointer {} is not a live block of this pool", ptr);
  return it->second->size;
}

CachingPool::Stats CachingPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<CachingPool::SegmentInfo> CachingPool::segments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [base, head] : segments_) {
    SegmentInfo seg{base, 0, head->small, {}};
    for (const Block* b = head; b != nullptr; b = b->next) {
      seg.blocks.push_back({b->address, b->size, b->allocated});
      seg.size += b->size;
    }
    out.push_back(std::move(seg));
  }
  return out;
}

}  // namespace dstrain
