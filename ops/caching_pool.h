// CachingPool: the bookkeeping of a caching allocator (CudaAllocator, CudaPinnedAllocator), with no
// CUDA in it, so that its rounding, reuse, splitting and merging are unit-tested on the CPU.
//
// Why cache: cudaFree synchronises the whole device and cudaMalloc / cudaHostAlloc are slow, and
// ZeRO allocates and frees transient buffers every step. A freed block goes back to a free list of
// the pool instead of to the backend, and a later request of a size it can hold reuses it, so after
// the first step(s) a training loop makes no backend call at all. This is the scheme of PyTorch's
// CUDACachingAllocator, without streams (see the owners' headers for when reuse is safe):
//
//   - A request of `bytes` is rounded up to a multiple of kMinBlock (512 B): round_size().
//   - Rounded sizes up to kSmallSize (1 MiB) are "small" and are carved from kSmallSegment (2 MiB)
//     segments; larger ones are "large" and come from segments of kLargeSegment (20 MiB) when
//     below kLargeThreshold (10 MiB), else of the size rounded up to kLargeRound (2 MiB):
//     segment_size(). Small and large blocks never share a segment, so small buffers do not
//     fragment the big ones.
//   - Best fit: the smallest cached block of the request's pool (small or large) that holds it,
//     lowest address first among equals. Only when none fits is a new segment asked of the backend.
//   - Splitting: the block found is cut to the rounded size when the rest is at least kMinBlock
//     (small pool) or more than kSmallSize (large pool); the rest stays cached. A large block with
//     less left over is handed out whole (its size counts in allocated_bytes).
//   - Merging: a freed block joins its free neighbours in the same segment, so a segment whose
//     blocks are all free is one block again.
//   - Out of memory: when the backend cannot give a new segment, every cached segment with no live
//     block is returned to it (release_cached()) and the request is tried once more; nullptr if
//     that fails too. The caller reports the error.
//   - release_cached() (the allocators' empty_cache()) returns whole free segments only; free
//     blocks inside a segment that still has a live block stay cached.
//
// Blocks are aligned to kMinBlock relative to the segment base (backends give at least that).
// All members are thread-safe (one mutex; backend calls are made under it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

namespace dstrain {

class CachingPool {
 public:
  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallSize = std::size_t{1} << 20;        // 1 MiB
  static constexpr std::size_t kSmallSegment = std::size_t{2} << 20;     // 2 MiB
  static constexpr std::size_t kLargeThreshold = std::size_t{10} << 20;  // 10 MiB
  static constexpr std::size_t kLargeSegment = std::size_t{20} << 20;    // 20 MiB
  static constexpr std::size_t kLargeRound = std::size_t{2} << 20;       // 2 MiB

  // The memory the pool carves: allocate(bytes) returns a block of at least kMinBlock alignment or
  // nullptr when out of memory (other failures throw); free(ptr, bytes) returns it.
  struct Backend {
    std::function<void*(std::size_t bytes)> allocate;
    std::function<void(void* ptr, std::size_t bytes)> free;
  };

  struct Stats {
    std::size_t reserved_bytes = 0;         // held from the backend: live blocks and cache
    std::size_t peak_reserved_bytes = 0;    // high-water mark of reserved_bytes
    std::size_t allocated_bytes = 0;        // live blocks, as rounded (and possibly unsplit) sizes
    std::uint64_t segments = 0;             // segments held now
    std::uint64_t backend_allocations = 0;  // successful backend allocate calls (cudaMalloc)
    std::uint64_t backend_frees = 0;        // backend free calls (cudaFree)
    std::uint64_t cache_hits = 0;           // allocate() served from the cache, no backend call
    std::uint64_t cache_flushes = 0;        // out-of-memory retries (the cache was released first)

    std::size_t cached_bytes() const { return reserved_bytes - allocated_bytes; }
  };

  // One block of a segment, for inspection (tests, fragmentation reports).
  struct BlockInfo {
    std::uintptr_t address = 0;
    std::size_t size = 0;
    bool allocated = false;
  };
  struct SegmentInfo {
    std::uintptr_t base = 0;
    std::size_t size = 0;
    bool small = false;
    std::vector<BlockInfo> blocks;  // in address order, covering [base, base + size)
  };

  explicit CachingPool(Backend backend);
  // Returns every segment without a live block to the backend (errors ignored: destructors do not
  // throw). Segments with live blocks are left alone: someone may still use that memory.
  ~CachingPool();
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // The size a request of `bytes` occupies, and the segment a new one would come from. `bytes`
  // must be > 0 and at most max_request().
  static std::size_t round_size(std::size_t bytes);
  static std::size_t segment_size(std::size_t rounded);
  static constexpr std::size_t max_request() { return ~std::size_t{0} - 2 * kLargeRound; }

  // A block of at least `bytes` (> 0), or nullptr when the backend is out of memory even after
  // the cache was released. Backend exceptions propagate; the pool stays consistent.
  void* allocate(std::size_t bytes);
  // Returns a block from allocate() to the cache. Error for any other pointer (or a double free).
  void free(void* ptr);
  // Returns every segment without a live block to the backend; the bytes released.
  std::size_t release_cached();

  // The size the block at `ptr` occupies (>= its request); Error if it is not live.
  std::size_t block_size(const void* ptr) const;
  Stats stats() const;
  std::vector<SegmentInfo> segments() const;

 private:
  struct Block {
    std::uintptr_t address;
    std::size_t size;
    bool allocated;
    bool small;
    Block* prev;  // neighbours in the same segment (nullptr at its ends)
    Block* next;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const { return a->size != b->size ? a->size < b->size : a->address < b->address; }
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& free_set(bool small) { return small ? small_free_ : large_free_; }
  std::size_t release_cached_locked();

  Backend backend_;
  mutable std::mutex mutex_;
  FreeSet small_free_, large_free_;
  std::unordered_map<std::uintptr_t, Block*> live_;
  std::map<std::uintptr_t, Block*> segments_;  // segment base -> its first block
  Stats stats_;
};

}  // namespace dstrain
