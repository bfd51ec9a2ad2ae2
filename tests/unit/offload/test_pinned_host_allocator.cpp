// PinnedHostAllocator (offload/pinned_host_allocator.h): page-aligned blocks (what O_DIRECT needs),
// zero-filled, counted by purpose like any Allocator, locked in RAM when asked — checked against
// the kernel's own count of this process's locked memory (VmLck in /proc/self/status) — and
// make_host_memory's choice for the engine.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "offload/host_memory.h"
#include "offload/pinned_host_allocator.h"
#include "ops/error.h"
#include "tests/sanitizers/asan_build.h"

namespace dstrain {
namespace {

// AddressSanitizer's runtime intercepts mlock with a no-op that returns 0 (sanitizer_common), so in the
// ASan build (scripts/gates.sh asan) the kernel never counts the pages: there the allocator's own
// count is checked and /proc's VmLck only for staying unchanged.
constexpr bool kMlockReachesTheKernel = !dstrain::testing::kAddressSanitizer;

// The kernel's count of this process's mlock'ed bytes; -1 when /proc does not say.
std::int64_t vm_locked_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) {
      std::istringstream f(line.substr(6));
      std::int64_t kb = -1;
      f >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  }
  return -1;
}

std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

TEST(PinnedHostAllocator, BlocksArePageAlignedZeroedAndCountedByPurpose) {
  PinnedHostAllocator a(/*lock=*/false);
  EXPECT_EQ(a.default_alignment() % 4096, 0u);
  EXPECT_TRUE(a.device().is_cpu());
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{4095}, std::size_t{4097}, std::size_t{100'000}, std::size_t{3} << 20}) {
    SCOPED_TRACE(bytes);
    auto* p = static_cast<unsigned char*>(a.allocate(bytes, MemoryPurpose::optimizer));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % page(), 0u);
    if (bytes >= PinnedHostAllocator::kHugeBlockBytes) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % PinnedHostAllocator::kHugeBlockBytes, 0u);
    }
    bool zero = true;
    for (std::size_t i = 0; i < bytes; ++i) zero = zero && p[i] == 0;
    EXPECT_TRUE(zero);
    std::memset(p, 0xab, bytes);  // writable to the last byte
    EXPECT_EQ(a.stats()[MemoryPurpose::optimizer].current, bytes);
    EXPECT_EQ(a.stats()[MemoryPurpose::params].current, 0u);
    a.deallocate(p);
    EXPECT_EQ(a.stats()[MemoryPurpose::optimizer].current, 0u);
  }
  // A larger alignment than a page is honoured too.
  void* q = a.allocate(10, MemoryPurpose::buffers, std::size_t{1} << 16);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % (std::size_t{1} << 16), 0u);
  a.deallocate(q);
  EXPECT_EQ(a.locked_bytes(), 0u);
  EXPECT_EQ(a.lock_failures(), 0u);
  int local = 0;
  EXPECT_THROW(a.deallocate(&local), Error);  // not its block
}

TEST(PinnedHostAllocator, LockedBytesAreWhatTheKernelCountsAsLocked) {
  const std::int64_t before = vm_locked_bytes();
  if (before < 0) GTEST_SKIP() << "no VmLck in /proc/self/status";
  PinnedHostAllocator a(/*lock=*/true);
  // Small blocks: within even an unprivileged default RLIMIT_MEMLOCK (64 KiB on old kernels).
  const std::size_t bytes = 3 * page() + 100;
  void* p = a.allocate(bytes, MemoryPurpose::optimizer);
  void* q = a.allocate(page(), MemoryPurpose::optimizer);
  RecordProperty("locked", a.lock_failures() == 0 ? "yes" : "no");
  if (a.lock_failures() > 0) {
    // mlock refused (a limit below 5 pages): the blocks are usable, counted, and nothing is locked.
    EXPECT_EQ(a.locked_bytes(), 0u);
    EXPECT_EQ(vm_locked_bytes(), before);
  } else {
    EXPECT_EQ(a.locked_bytes(), 5 * page());
    const std::int64_t kernel_locked = kMlockReachesTheKernel ? static_cast<std::int64_t>(5 * page()) : 0;
    EXPECT_EQ(vm_locked_bytes() - before, kernel_locked);
  }
  EXPECT_EQ(a.stats()[MemoryPurpose::optimizer].current, bytes + page());
  a.deallocate(p);
  a.deallocate(q);
  EXPECT_EQ(a.locked_bytes(), 0u);
  EXPECT_EQ(vm_locked_bytes(), before);  // munmap unlocked the pages
}

TEST(HostMemory, TheEngineGetsPinnedMemoryApartOnlyWithOffload) {
  // On the CPU device with offload: page-aligned memory of its own, locked when pin_memory.
  HostMemoryChoice pinned = make_host_memory(Device::cpu(), /*offloads=*/true, /*pin=*/true);
  auto* p = dynamic_cast<PinnedHostAllocator*>(pinned.allocator.get());
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->locks());
  HostMemoryChoice unpinned = make_host_memory(Device::cpu(), true, false);
  auto* u = dynamic_cast<PinnedHostAllocator*>(unpinned.allocator.get());
  ASSERT_NE(u, nullptr);
  EXPECT_FALSE(u->locks());
  // Without offload (cpu_checkpointing's host memory on the CPU): the plain host allocator.
  HostMemoryChoice plain = make_host_memory(Device::cpu(), false, true);
  EXPECT_NE(dynamic_cast<CpuAllocator*>(plain.allocator.get()), nullptr);
}

}  // namespace
}  // namespace dstrain
