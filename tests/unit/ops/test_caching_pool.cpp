// CachingPool (the bookkeeping of the CUDA caching allocators) against a fake backend that hands
// out addresses from a pretend address space with a capacity: rounding, reuse without backend
// calls, splitting and merging, statistics, release_cached, the out-of-memory retry, misuse, and
// a randomized sequence checked against a naive model after every operation.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ops/caching_pool.h"
#include "ops/error.h"

using namespace dstrain;

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

// Pretend memory: never dereferenced by the pool, so no real bytes are needed. Segments are placed
// 2 MiB-aligned with a gap between them, so two segments are never adjacent.
struct FakeBackend {
  std::size_t capacity = std::size_t{1} << 40;
  std::uintptr_t next = std::uintptr_t{1} << 40;
  std::map<std::uintptr_t, std::size_t> outstanding;  // base -> bytes
  std::size_t in_use = 0;
  std::uint64_t allocate_calls = 0, refused = 0, free_calls = 0;
  bool throw_next = false;
  std::mutex mutex;

  CachingPool::Backend backend() {
    return {[this](std::size_t bytes) -> void* {
              std::lock_guard<std::mutex> lock(mutex);
              ++allocate_calls;
              if (throw_next) {
                throw_next = false;
                throw std::runtime_error("backend failure");
              }
              if (bytes > capacity - in_use) {
                ++refused;
                return nullptr;
              }
              const std::uintptr_t base = next;
              next += (bytes + 2 * MiB - 1) / (2 * MiB) * (2 * MiB) + 2 * MiB;
              outstanding.emplace(base, bytes);
              in_use += bytes;
              return reinterpret_cast<void*>(base);
            },
            [this](void* ptr, std::size_t bytes) {
              std::lock_guard<std::mutex> lock(mutex);
              ++free_calls;
              const auto it = outstanding.find(reinterpret_cast<std::uintptr_t>(ptr));
              if (it == outstanding.end() || it->second != bytes) throw std::runtime_error("bad backend free");
              in_use -= bytes;
              outstanding.erase(it);
            }};
  }
};

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// The pool's segments agree with the backend, tile themselves with aligned blocks, never leave two
// free neighbours unmerged, and hold exactly `live` (address -> requested bytes) as allocated blocks;
// the statistics add up.
void check_consistent(const CachingPool& pool, const FakeBackend& be, const std::map<std::uintptr_t, std::size_t>& live) {
  const auto segs = pool.segments();
  const CachingPool::Stats st = pool.stats();
  ASSERT_EQ(segs.size(), be.outstanding.size());
  ASSERT_EQ(st.segments, segs.size());
  std::size_t reserved = 0, allocated = 0, n_live = 0;
  for (const auto& seg : segs) {
    const auto it = be.outstanding.find(seg.base);
    ASSERT_NE(it, be.outstanding.end()) << "segment not from the backend";
    ASSERT_EQ(it->second, seg.size);
    ASSERT_FALSE(seg.blocks.empty());
    reserved += seg.size;
    std::uintptr_t at = seg.base;
    bool prev_free = false;
    for (const auto& b : seg.blocks) {
      ASSERT_EQ(b.address, at) << "blocks do not tile the segment";
      ASSERT_GT(b.size, 0u);
      ASSERT_EQ(b.size % CachingPool::kMinBlock, 0u);
      ASSERT_FALSE(prev_free && !b.allocated) << "two free neighbours not merged";
      prev_free = !b.allocated;
      at += b.size;
      if (b.allocated) {
        const auto l = live.find(b.address);
        ASSERT_NE(l, live.end()) << "allocated block the model does not know";
        ASSERT_GE(b.size, l->second);
        if (seg.small)
          ASSERT_LE(b.size, CachingPool::kSmallSize);
        else
          ASSERT_GT(CachingPool::round_size(l->second), CachingPool::kSmallSize);
        ASSERT_EQ(pool.block_size(reinterpret_cast<void*>(b.address)), b.size);
        allocated += b.size;
        ++n_live;
      }
    }
    ASSERT_EQ(at, seg.base + seg.size);
  }
  ASSERT_EQ(n_live, live.size());
  ASSERT_EQ(st.reserved_bytes, reserved);
  ASSERT_EQ(st.reserved_bytes, be.in_use);
  ASSERT_EQ(st.allocated_bytes, allocated);
  ASSERT_GE(st.peak_reserved_bytes, st.reserved_bytes);
  ASSERT_EQ(st.backend_allocations - st.backend_frees, st.segments);
  // No two live requests overlap (implied by the tiling; checked directly against the model).
  std::uintptr_t end = 0;
  for (const auto& [a, bytes] : live) {
    ASSERT_GE(a, end) << "live blocks overlap";
    ASSERT_EQ(a % CachingPool::kMinBlock, 0u);
    end = a + bytes;
  }
}

}  // namespace

TEST(CachingPool, Rounding) {
  EXPECT_EQ(CachingPool::round_size(1), 512u);
  EXPECT_EQ(CachingPool::round_size(512), 512u);
  EXPECT_EQ(CachingPool::round_size(513), 1024u);
  EXPECT_EQ(CachingPool::round_size(MiB), MiB);
  EXPECT_EQ(CachingPool::segment_size(512), 2 * MiB);
  EXPECT_EQ(CachingPool::segment_size(MiB), 2 * MiB);         // the largest small block
  EXPECT_EQ(CachingPool::segment_size(MiB + 512), 20 * MiB);  // the smallest large one
  EXPECT_EQ(CachingPool::segment_size(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingPool::segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingPool::segment_size(10 * MiB + 512), 12 * MiB);
}

TEST(CachingPool, FreedBlockIsReusedWithoutBackendCall) {
  FakeBackend be;
  CachingPool pool(be.backend());
  void* a = pool.allocate(1000);
  EXPECT_EQ(pool.block_size(a), 1024u);
  EXPECT_EQ(be.allocate_calls, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 1024u);
  EXPECT_EQ(pool.stats().cached_bytes(), 2 * MiB - 1024);
  pool.free(a);
  EXPECT_EQ(be.free_calls, 0u);  // cached, not returned
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  // The same size again: the same block, from the cache.
  for (int step = 0; step < 10; ++step) {
    void* again = pool.allocate(1000);
    EXPECT_EQ(again, a);
    pool.free(again);
  }
  EXPECT_EQ(be.allocate_calls, 1u);
  const CachingPool::Stats st = pool.stats();
  EXPECT_EQ(st.backend_allocations, 1u);
  EXPECT_EQ(st.cache_hits, 10u);
  EXPECT_EQ(st.backend_frees, 0u);
}

TEST(CachingPool, SmallBlocksSplitAndMerge) {
  FakeBackend be;
  CachingPool pool(be.backend());
  void* a = pool.allocate(100);
  void* b = pool.allocate(1500);
  void* c = pool.allocate(512);
  EXPECT_EQ(be.allocate_calls, 1u);  // all three carved from one 2 MiB segment
  EXPECT_EQ(addr(b), addr(a) + 512);
  EXPECT_EQ(addr(c), addr(b) + 1536);
  auto segs = pool.segments();
  ASSERT_EQ(segs.size(), 1u);
  ASSERT_EQ(segs[0].blocks.size(), 4u);  // a, b, c and the free rest
  EXPECT_TRUE(segs[0].small);
  EXPECT_EQ(segs[0].blocks[3].size, 2 * MiB - 512 - 1536 - 512);
  EXPECT_FALSE(segs[0].blocks[3].allocated);

  pool.free(b);  // a hole between a and c
  pool.free(a);  // merges with the hole
  segs = pool.segments();
  ASSERT_EQ(segs[0].blocks.size(), 3u);
  EXPECT_EQ(segs[0].blocks[0].size, 2048u);
  EXPECT_FALSE(segs[0].blocks[0].allocated);
  // Best fit: 2000 bytes take the 2048-byte hole rather than the big rest.
  void* d = pool.allocate(2000);
  EXPECT_EQ(d, a);
  pool.free(d);
  pool.free(c);  // everything merges back into one block
  segs = pool.segments();
  ASSERT_EQ(segs[0].blocks.size(), 1u);
  EXPECT_EQ(segs[0].blocks[0].size, 2 * MiB);
  EXPECT_EQ(be.allocate_calls, 1u);
}

TEST(CachingPool, LargeBlocks) {
  FakeBackend be;
  CachingPool pool(be.backend());
  void* a = pool.allocate(3 * MiB);  // a 20 MiB segment, split: 17 MiB stay cached
  EXPECT_EQ(pool.stats().reserved_bytes, 20 * MiB);
  EXPECT_EQ(pool.block_size(a), 3 * MiB);
  void* b = pool.allocate(16 * MiB + 512 * KiB);  // from the rest; 512 KiB left is not split off
  EXPECT_EQ(be.allocate_calls, 1u);
  EXPECT_EQ(addr(b), addr(a) + 3 * MiB);
  EXPECT_EQ(pool.block_size(b), 17 * MiB);
  EXPECT_EQ(pool.stats().allocated_bytes, 20 * MiB);
  void* c = pool.allocate(11 * MiB);  // >= 10 MiB: its own segment, rounded to 2 MiB
  EXPECT_EQ(be.allocate_calls, 2u);
  EXPECT_EQ(pool.block_size(c), 12 * MiB);  // the 1 MiB rest is not split off
  EXPECT_EQ(pool.stats().reserved_bytes, 32 * MiB);
  for (void* p : {a, b, c}) pool.free(p);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().cached_bytes(), 32 * MiB);
  // A 12 MiB request reuses c's segment exactly (best fit), not the 20 MiB one.
  void* d = pool.allocate(12 * MiB);
  EXPECT_EQ(d, c);
  pool.free(d);
  EXPECT_EQ(be.allocate_calls, 2u);
}

TEST(CachingPool, SmallAndLargeDoNotShareSegments) {
  FakeBackend be;
  CachingPool pool(be.backend());
  pool.free(pool.allocate(100));       // a cached 2 MiB small segment
  void* big = pool.allocate(MiB + 1);  // large: may not use it even though it would fit
  EXPECT_EQ(be.allocate_calls, 2u);
  EXPECT_EQ(pool.stats().reserved_bytes, 22 * MiB);
  pool.free(big);
  pool.free(pool.allocate(20 * MiB - 512));  // fits the cached large segment whole
  EXPECT_EQ(be.allocate_calls, 2u);
}

TEST(CachingPool, ReleaseCachedReturnsOnlyWholeFreeSegments) {
  FakeBackend be;
  CachingPool pool(be.backend());
  void* s1 = pool.allocate(1000);  // small segment, stays partly used
  void* s2 = pool.allocate(1000);
  void* l1 = pool.allocate(12 * MiB);  // large segment, freed whole
  pool.free(s2);
  pool.free(l1);
  EXPECT_EQ(pool.stats().reserved_bytes, 14 * MiB);
  EXPECT_EQ(pool.release_cached(), 12 * MiB);
  EXPECT_EQ(be.free_calls, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 2 * MiB);
  EXPECT_EQ(pool.stats().segments, 1u);
  EXPECT_EQ(pool.stats().backend_frees, 1u);
  check_consistent(pool, be, {{addr(s1), 1000}});
  pool.free(s1);
  EXPECT_EQ(pool.release_cached(), 2 * MiB);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_TRUE(be.outstanding.empty());
  EXPECT_EQ(pool.stats().peak_reserved_bytes, 14 * MiB);
  EXPECT_EQ(pool.release_cached(), 0u);
}

TEST(CachingPool, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  FakeBackend be;
  be.capacity = 24 * MiB;
  CachingPool pool(be.backend());
  void* l = pool.allocate(3 * MiB);  // 20 MiB segment
  void* s = pool.allocate(KiB);      // 2 MiB segment
  pool.free(l);
  pool.free(s);
  // 21 MiB fits no cached block and needs a 22 MiB segment: refused, the two cached segments go
  // back, the retry succeeds.
  void* big = pool.allocate(21 * MiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(be.refused, 1u);
  EXPECT_EQ(pool.stats().cache_flushes, 1u);
  EXPECT_EQ(pool.stats().backend_frees, 2u);
  EXPECT_EQ(pool.stats().reserved_bytes, 22 * MiB);
  // Too big even with the cache empty: nullptr after exactly one retry; nothing changes.
  void* cached_small = pool.allocate(KiB);
  pool.free(cached_small);  // one cached segment that the flush returns
  EXPECT_EQ(pool.allocate(30 * MiB), nullptr);
  EXPECT_EQ(be.refused, 3u);
  EXPECT_EQ(pool.stats().cache_flushes, 2u);
  check_consistent(pool, be, {{addr(big), 21 * MiB}});
  // A request too large to round is out of memory without asking the backend.
  const std::uint64_t calls = be.allocate_calls;
  EXPECT_EQ(pool.allocate(~std::size_t{0}), nullptr);
  EXPECT_EQ(be.allocate_calls, calls);
  pool.free(big);
}

TEST(CachingPool, Misuse) {
  FakeBackend be;
  CachingPool pool(be.backend());
  EXPECT_THROW(pool.allocate(0), Error);
  void* a = pool.allocate(100);
  int other = 0;
  EXPECT_THROW(pool.free(&other), Error);
  EXPECT_THROW(pool.free(static_cast<char*>(a) + 8), Error);  // inside a block is not a block
  pool.free(a);
  try {
    pool.free(a);
    ADD_FAILURE() << "double free accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a live block"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)pool.block_size(a), Error);
  EXPECT_THROW(CachingPool(CachingPool::Backend{}), Error);
}

TEST(CachingPool, BackendExceptionLeavesThePoolConsistent) {
  FakeBackend be;
  CachingPool pool(be.backend());
  void* a = pool.allocate(100);
  be.throw_next = true;
  EXPECT_THROW(pool.allocate(12 * MiB), std::runtime_error);
  check_consistent(pool, be, {{addr(a), 100}});
  pool.free(a);
}

TEST(CachingPool, DestructorReturnsFreeSegmentsAndKeepsLiveOnes) {
  FakeBackend be;
  {
    CachingPool pool(be.backend());
    pool.allocate(100);                  // never freed: its segment must not be returned
    pool.free(pool.allocate(12 * MiB));  // cached: returned by the destructor
    EXPECT_EQ(be.outstanding.size(), 2u);
  }
  ASSERT_EQ(be.outstanding.size(), 1u);
  EXPECT_EQ(be.outstanding.begin()->second, 2 * MiB);
}

// A long random sequence of allocations (small, medium, large), frees and cache releases, on a
// backend small enough to run out now and then, checked against the naive model after each step.
TEST(CachingPool, RandomSequenceAgainstModel) {
  FakeBackend be;
  be.capacity = 160 * MiB;
  CachingPool pool(be.backend());
  std::mt19937_64 rng(12345);
  std::map<std::uintptr_t, std::size_t> live;
  std::vector<std::uintptr_t> order;  // live addresses, for picking one at random
  std::uint64_t nulls = 0, hits_seen = 0;
  for (int i = 0; i < 6000; ++i) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 55 || live.empty()) {
      std::size_t bytes = 0;
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 6)
        bytes = 1 + rng() % (64 * KiB);
      else if (kind < 8)
        bytes = 1 + rng() % (2 * MiB);
      else
        bytes = 1 + rng() % (24 * MiB);
      const std::uint64_t refused_before = be.refused;
      void* p = pool.allocate(bytes);
      if (p == nullptr) {
        ++nulls;
        // Only after the backend refused twice (the try and the retry after the flush), and the
        // flush left no whole free segment behind.
        ASSERT_EQ(be.refused, refused_before + 2);
        for (const auto& seg : pool.segments()) ASSERT_FALSE(seg.blocks.size() == 1 && !seg.blocks[0].allocated);
      } else {
        ASSERT_TRUE(live.emplace(addr(p), bytes).second) << "address handed out twice";
        order.push_back(addr(p));
      }
    } else if (op < 97) {
      const std::size_t k = rng() % order.size();
      const std::uintptr_t a = order[k];
      order[k] = order.back();
      order.pop_back();
      live.erase(a);
      pool.free(reinterpret_cast<void*>(a));
    } else {
      pool.release_cached();
    }
    check_consistent(pool, be, live);
    if (HasFatalFailure()) FAIL() << "at operation " << i;
  }
  hits_seen = pool.stats().cache_hits;
  EXPECT_GT(nulls, 0u) << "the sequence never ran out of memory; make the backend smaller";
  EXPECT_GT(hits_seen, 1000u);
  for (const auto& [a, bytes] : live) pool.free(reinterpret_cast<void*>(a));
  live.clear();
  check_consistent(pool, be, live);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
  EXPECT_TRUE(be.outstanding.empty());
}

// The per-step pattern the pool exists for: the same transient allocations every step reach a
// steady state in which no backend call is made.
TEST(CachingPool, RepeatedStepsStopCallingTheBackend) {
  FakeBackend be;
  CachingPool pool(be.backend());
  std::mt19937_64 rng(7);
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 200; ++i) sizes.push_back(1 + rng() % (rng() % 4 == 0 ? 30 * MiB : 256 * KiB));
  std::uint64_t calls_after_warmup = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<void*> held;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      held.push_back(pool.allocate(sizes[i]));
      if (i % 3 == 2) {  // free some mid-step, in a fixed pattern
        pool.free(held[i - 1]);
        held[i - 1] = nullptr;
      }
    }
    for (void* p : held)
      if (p != nullptr) pool.free(p);
    if (step == 1) calls_after_warmup = be.allocate_calls;
  }
  EXPECT_EQ(be.allocate_calls, calls_after_warmup);
  EXPECT_EQ(be.free_calls, 0u);
}

TEST(CachingPool, Threads) {
  FakeBackend be;
  CachingPool pool(be.backend());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        held.push_back(pool.allocate(static_cast<std::size_t>(1 + (i * 7919 + t * 104729) % (3 * MiB))));
        if (i % 2 == 1) {
          pool.free(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) pool.free(p);
    });
  }
  for (auto& th : threads) th.join();
  check_consistent(pool, be, {});
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  EXPECT_EQ(pool.stats().cache_hits + pool.stats().backend_allocations, 8000u);
}
