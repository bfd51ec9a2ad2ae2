// Allocators, MemoryStats and Buffer: statistics through scripted sequences worked out by hand,
// alignment, thread safety, misuse (double free, foreign pointers, bad alignment), out of memory.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/error.h"
#include "ops/memory_stats.h"

using namespace dstrain;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

void expect_counter(const MemoryCounter& c, std::size_t current, std::size_t peak, std::uint64_t allocs, std::uint64_t frees, const char* what) {
  EXPECT_EQ(c.current, current) << what;
  EXPECT_EQ(c.peak, peak) << what;
  EXPECT_EQ(c.allocations, allocs) << what;
  EXPECT_EQ(c.frees, frees) << what;
}

}  // namespace

TEST(MemoryStats, PurposeNames) {
  EXPECT_EQ(memory_purpose_name(MemoryPurpose::params), "params");
  EXPECT_EQ(memory_purpose_name(MemoryPurpose::grads), "grads");
  EXPECT_EQ(memory_purpose_name(MemoryPurpose::optimizer), "optimizer");
  EXPECT_EQ(memory_purpose_name(MemoryPurpose::activations), "activations");
  EXPECT_EQ(memory_purpose_name(MemoryPurpose::buffers), "buffers");
}

TEST(MemoryStats, FormatBytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(std::size_t{768} << 20), "768.00 MiB");
  EXPECT_EQ(format_bytes(std::size_t{5} << 28), "1.25 GiB");
  EXPECT_EQ(format_bytes(std::size_t{3} << 40), "3.00 TiB");
}

// A scripted sequence, the expected figures worked out by hand:
//   step                     params  grads  activations | total
//   alloc params 100         100     0      0           | 100
//   alloc grads 200          100     200    0           | 300   <- total peak 300
//   free params              0       200    0           | 200
//   alloc activations 50     0       200    50          | 250
//   alloc params 30          30      200    50          | 280
// Per-purpose peaks: params 100, grads 200, activations 50 (sum 350), while the total peaked at 300:
// the peak of the total is its own figure.
TEST(CpuAllocator, ScriptedSequence) {
  CpuAllocator a;
  void* p1 = a.allocate(100, MemoryPurpose::params);
  void* g = a.allocate(200, MemoryPurpose::grads);
  a.deallocate(p1);
  void* act = a.allocate(50, MemoryPurpose::activations);
  void* p2 = a.allocate(30, MemoryPurpose::params);

  MemoryStats s = a.stats();
  expect_counter(s[MemoryPurpose::params], 30, 100, 2, 1, "params");
  expect_counter(s[MemoryPurpose::grads], 200, 200, 1, 0, "grads");
  expect_counter(s[MemoryPurpose::activations], 50, 50, 1, 0, "activations");
  expect_counter(s[MemoryPurpose::optimizer], 0, 0, 0, 0, "optimizer");
  expect_counter(s[MemoryPurpose::buffers], 0, 0, 0, 0, "buffers");
  expect_counter(s.total, 280, 300, 4, 1, "total");
  EXPECT_EQ(s.total.live_blocks(), 3u);

  // reset_peaks: peaks restart at the current values, counts are kept.
  a.reset_peaks();
  s = a.stats();
  expect_counter(s[MemoryPurpose::params], 30, 30, 2, 1, "params after reset");
  expect_counter(s.total, 280, 280, 4, 1, "total after reset");

  a.deallocate(g);                                     // 80
  void* big = a.allocate(1000, MemoryPurpose::grads);  // 1080: new total peak
  s = a.stats();
  expect_counter(s[MemoryPurpose::grads], 1000, 1000, 2, 1, "grads after reset");
  expect_counter(s.total, 1080, 1080, 5, 2, "total after reset");

  for (void* p : {act, p2, big}) a.deallocate(p);
  s = a.stats();
  for (MemoryPurpose p : kAllMemoryPurposes) EXPECT_EQ(s[p].current, 0u) << memory_purpose_name(p);
  expect_counter(s.total, 0, 1080, 5, 5, "total at end");
}

TEST(CpuAllocator, PurposesAreSeparate) {
  CpuAllocator a;
  std::vector<void*> ptrs;
  std::size_t bytes = 1000;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    ptrs.push_back(a.allocate(bytes, p));
    ptrs.push_back(a.allocate(bytes, p));
    bytes += 1000;
  }
  const MemoryStats s = a.stats();
  std::size_t expect = 1000;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    expect_counter(s[p], 2 * expect, 2 * expect, 2, 0, std::string(memory_purpose_name(p)).c_str());
    expect += 1000;
  }
  expect_counter(s.total, 2 * (1000 + 2000 + 3000 + 4000 + 5000), 30000, 10, 0, "total");
  EXPECT_EQ(a.block_size(ptrs[2]), 2000u);
  EXPECT_EQ(a.block_purpose(ptrs[2]), MemoryPurpose::grads);
  EXPECT_EQ(a.block_purpose(ptrs[9]), MemoryPurpose::buffers);
  for (void* p : ptrs) a.deallocate(p);
  EXPECT_EQ(a.stats().total.current, 0u);
}

TEST(CpuAllocator, Alignment) {
  CpuAllocator a;
  EXPECT_EQ(a.default_alignment(), 64u);
  std::vector<void*> ptrs;
  for (std::size_t bytes : {1, 3, 63, 64, 65, 1000, 4097}) {
    void* p = a.allocate(bytes, MemoryPurpose::buffers);
    EXPECT_EQ(addr(p) % 64, 0u) << bytes;
    ptrs.push_back(p);
  }
  void* small_align = a.allocate(10, MemoryPurpose::buffers, 8);  // below the default: still 64
  EXPECT_EQ(addr(small_align) % 64, 0u);
  void* page = a.allocate(100, MemoryPurpose::buffers, 4096);
  EXPECT_EQ(addr(page) % 4096, 0u);
  // Large blocks: 2 MiB aligned, whatever was asked.
  void* huge = a.allocate(CpuAllocator::kHugeBlockBytes, MemoryPurpose::params);
  EXPECT_EQ(addr(huge) % (std::size_t{2} << 20), 0u);
  void* huge2 = a.allocate((std::size_t{3} << 20) + 5, MemoryPurpose::optimizer, 128);
  EXPECT_EQ(addr(huge2) % (std::size_t{2} << 20), 0u);
  // Usable end to end (a stride touch of every page).
  for (std::size_t i = 0; i < (std::size_t{3} << 20) + 5; i += 4096) static_cast<char*>(huge2)[i] = 1;
  static_cast<char*>(huge2)[(std::size_t{3} << 20) + 4] = 1;
  // Statistics count the bytes asked for, not the padding.
  EXPECT_EQ(a.stats()[MemoryPurpose::optimizer].current, (std::size_t{3} << 20) + 5);
  for (void* p : {small_align, page, huge, huge2}) ptrs.push_back(p);
  for (void* p : ptrs) a.deallocate(p);
  EXPECT_EQ(a.stats().total.current, 0u);
}

TEST(CpuAllocator, RejectsBadAlignment) {
  CpuAllocator a;
  for (std::size_t bad : {3, 48, 100}) {
    try {
      a.allocate(64, MemoryPurpose::buffers, bad);
      ADD_FAILURE() << "alignment " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), std::to_string(bad))) << e.what();
      EXPECT_TRUE(contains(e.what(), "power of two")) << e.what();
    }
  }
  EXPECT_EQ(a.stats().total.allocations, 0u);
}

// Zero bytes: defined as "no block": nullptr, nothing counted; deallocate(nullptr) is a no-op.
TEST(CpuAllocator, ZeroBytes) {
  CpuAllocator a;
  EXPECT_EQ(a.allocate(0, MemoryPurpose::params), nullptr);
  EXPECT_NO_THROW(a.deallocate(nullptr));
  expect_counter(a.stats().total, 0, 0, 0, 0, "total");
  Buffer b(a, 0, MemoryPurpose::activations);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.bytes(), 0u);
  const Tensor t = b.tensor(DType::fp32, Shape{0, 8});
  EXPECT_EQ(t.data, nullptr);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_THROW(b.tensor(DType::fp32, Shape{1}), Error);
}

TEST(CpuAllocator, DoubleFreeAndForeignPointers) {
  CpuAllocator a, other;
  void* p = a.allocate(256, MemoryPurpose::grads);
  a.deallocate(p);
  const MemoryStats before = a.stats();
  try {
    a.deallocate(p);
    ADD_FAILURE() << "double free accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "double free")) << e.what();
  }
  int on_stack = 0;
  EXPECT_THROW(a.deallocate(&on_stack), Error);
  void* q = other.allocate(64, MemoryPurpose::params);
  EXPECT_THROW(a.deallocate(q), Error);  // another allocator's block
  EXPECT_THROW(a.block_size(q), Error);
  EXPECT_THROW(a.block_purpose(&on_stack), Error);
  void* r = a.allocate(128, MemoryPurpose::params);
  EXPECT_THROW(a.deallocate(static_cast<char*>(r) + 64), Error);  // inside a block, not its start
  // Failed frees changed nothing.
  const MemoryStats after = a.stats();
  EXPECT_EQ(after.total.frees, before.total.frees);
  EXPECT_EQ(after.total.current, 128u);
  EXPECT_EQ(other.stats().total.current, 64u);
  other.deallocate(q);
  a.deallocate(r);
}

TEST(CpuAllocator, OutOfMemoryNamesBytesPurposeAndUsage) {
  CpuAllocator a;
  void* p = a.allocate(1000, MemoryPurpose::params);
  void* g = a.allocate(2048, MemoryPurpose::grads);
  const std::size_t too_much = std::size_t{1} << 62;  // 4 EiB: beyond any address space
  try {
    a.allocate(too_much, MemoryPurpose::optimizer);
    ADD_FAILURE() << "4 EiB allocation succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "4611686018427387904 bytes")) << msg;
    EXPECT_TRUE(contains(msg, "for optimizer")) << msg;
    EXPECT_TRUE(contains(msg, "params 1000 B")) << msg;
    EXPECT_TRUE(contains(msg, "grads 2.00 KiB")) << msg;
    EXPECT_TRUE(contains(msg, "total 2.98 KiB")) << msg;  // 3048 B
    EXPECT_TRUE(contains(msg, "cpu")) << msg;
  }
  EXPECT_THROW(a.allocate(~std::size_t{0}, MemoryPurpose::buffers), Error);  // cannot even be rounded up
  expect_counter(a.stats().total, 3048, 3048, 2, 0, "total");
  a.deallocate(p);
  a.deallocate(g);
}

// Several threads allocate and free concurrently; counts must add up and totals return to 0.
TEST(CpuAllocator, ThreadSafety) {
  CpuAllocator a;
  constexpr int kThreads = 4, kOps = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&a, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<void*> live;
      for (int i = 0; i < kOps; ++i) {
        if (live.empty() || rng() % 3 != 0) {
          const auto purpose = kAllMemoryPurposes[rng() % kNumMemoryPurposes];
          void* p = a.allocate(1 + rng() % 5000, purpose);
          static_cast<char*>(p)[0] = static_cast<char>(t);  // the memory is really ours
          live.push_back(p);
        } else {
          const std::size_t k = rng() % live.size();
          a.deallocate(live[k]);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (void* p : live) a.deallocate(p);
    });
  }
  for (auto& th : threads) th.join();
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.total.current, 0u);
  EXPECT_EQ(s.total.allocations, s.total.frees);
  EXPECT_GT(s.total.peak, 0u);
  std::uint64_t allocs = 0;
  std::size_t max_peak = 0, sum_peaks = 0;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    EXPECT_EQ(s[p].current, 0u);
    EXPECT_EQ(s[p].allocations, s[p].frees);
    allocs += s[p].allocations;
    max_peak = std::max(max_peak, s[p].peak);
    sum_peaks += s[p].peak;
  }
  EXPECT_EQ(allocs, s.total.allocations);
  EXPECT_LE(max_peak, s.total.peak);
  EXPECT_LE(s.total.peak, sum_peaks);
}

TEST(CpuAllocator, ProcessWideInstance) {
  CpuAllocator& a = cpu_allocator();
  EXPECT_EQ(&a, &cpu_allocator());
  EXPECT_TRUE(a.device().is_cpu());
  const std::size_t before = a.stats()[MemoryPurpose::buffers].current;
  {
    Buffer b(a, 4096, MemoryPurpose::buffers);
    EXPECT_EQ(a.stats()[MemoryPurpose::buffers].current, before + 4096);
  }
  EXPECT_EQ(a.stats()[MemoryPurpose::buffers].current, before);
}

TEST(MemoryStats, FormatTable) {
  CpuAllocator a;
  void* p = a.allocate(1024, MemoryPurpose::params);
  void* q = a.allocate(1024, MemoryPurpose::params);
  a.deallocate(q);
  const std::string table = format_memory_stats(a.stats());
  EXPECT_TRUE(contains(table, "purpose           current         peak     allocs      frees\n")) << table;
  EXPECT_TRUE(contains(table, "params           1.00 KiB     2.00 KiB          2          1\n")) << table;
  EXPECT_TRUE(contains(table, "optimizer             0 B          0 B          0          0\n")) << table;
  EXPECT_TRUE(contains(table, "total            1.00 KiB     2.00 KiB          2          1\n")) << table;
  for (MemoryPurpose pu : kAllMemoryPurposes) EXPECT_TRUE(contains(table, std::string(memory_purpose_name(pu)))) << table;
  a.deallocate(p);
}

// ---- Buffer ----

TEST(Buffer, OwnsAndFrees) {
  CpuAllocator a;
  {
    Buffer b(a, 1000, MemoryPurpose::grads);
    EXPECT_FALSE(b.empty());
    EXPECT_EQ(b.bytes(), 1000u);
    EXPECT_EQ(b.purpose(), MemoryPurpose::grads);
    EXPECT_EQ(b.allocator(), &a);
    EXPECT_TRUE(b.device().is_cpu());
    EXPECT_EQ(a.block_size(b.data()), 1000u);
    EXPECT_EQ(a.stats()[MemoryPurpose::grads].current, 1000u);
  }
  expect_counter(a.stats()[MemoryPurpose::grads], 0, 1000, 1, 1, "grads");
}

TEST(Buffer, MoveOnly) {
  static_assert(!std::is_copy_constructible_v<Buffer> && !std::is_copy_assignable_v<Buffer>);
  static_assert(std::is_nothrow_move_constructible_v<Buffer> && std::is_nothrow_move_assignable_v<Buffer>);
  CpuAllocator a;
  Buffer b1(a, 100, MemoryPurpose::params);
  void* p1 = b1.data();
  Buffer b2(std::move(b1));
  EXPECT_TRUE(b1.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(b1.bytes(), 0u);
  EXPECT_EQ(b2.data(), p1);
  EXPECT_EQ(b2.bytes(), 100u);
  Buffer b3(a, 300, MemoryPurpose::activations);
  b3 = std::move(b2);  // frees b3's old block
  EXPECT_EQ(b3.data(), p1);
  MemoryStats s = a.stats();
  expect_counter(s[MemoryPurpose::activations], 0, 300, 1, 1, "activations");
  expect_counter(s.total, 100, 400, 2, 1, "total");
  b3.reset();
  EXPECT_TRUE(b3.empty());
  b3.reset();  // twice is fine
  s = a.stats();
  expect_counter(s.total, 0, 400, 2, 2, "total after reset");
}

TEST(Buffer, TensorViews) {
  CpuAllocator a;
  Buffer b(a, 4 * 6 * 4, MemoryPurpose::params);  // room for 24 fp32
  const Tensor t = b.tensor(DType::fp32, Shape{4, 6});
  EXPECT_EQ(t.data, b.data());
  EXPECT_EQ(t.dtype, DType::fp32);
  EXPECT_EQ(t.shape, (Shape{4, 6}));
  EXPECT_TRUE(t.device.is_cpu());
  t.as<float>()[23] = 1.5f;                           // last element is inside the block
  const Tensor h = b.tensor(DType::bf16, Shape{48});  // same bytes as 48 bf16
  EXPECT_EQ(h.nbytes(), 96u);
  const Tensor tail = b.tensor(DType::fp32, Shape{2, 6}, 48);  // rows 2..3
  EXPECT_EQ(tail.as<float>()[11], 1.5f);
  try {
    (void)b.tensor(DType::fp32, Shape{5, 6});
    ADD_FAILURE() << "oversized view accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "needs 120 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "has 96")) << e.what();
  }
  EXPECT_THROW((void)b.tensor(DType::fp32, Shape{2, 6}, 52), Error);  // 52 + 48 > 96
  EXPECT_THROW((void)b.tensor(DType::fp32, Shape{1}, 2), Error);      // misaligned for fp32
  EXPECT_THROW((void)b.tensor(DType::fp16, Shape{1}, 200), Error);    // offset past the end
  EXPECT_NO_THROW((void)b.tensor(DType::fp16, Shape{0}, 96));         // empty view at the end
}
