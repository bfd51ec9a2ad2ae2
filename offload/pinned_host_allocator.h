// PinnedHostAllocator: page-aligned host memory, locked in RAM where the system allows, for the
// offloaded optimizer partition (docs/training_state.md §3, §6).
//
// Why its own allocator rather than CpuAllocator:
//   - page alignment (4 KiB at least): the NVMe swapper reads and writes these buffers with
//     O_DIRECT, which needs page-aligned addresses and sizes; every block starts and ends on a page;
//   - locked pages (mlock): the offloaded state is the rank's largest host allocation and is swept
//     end to end every step; if the kernel swapped it out, a step would fault it back page by page.
//     DeepSpeed's pin_memory asks the same of its host buffers;
//   - its own statistics: on the CPU device the training allocator is host memory too, so the
//     offloaded bytes are counted apart and the summary can say where they live.
//
// Blocks come straight from mmap (anonymous, private: zero-filled pages) and go back with munmap.
// Locking is best effort: when mlock fails (RLIMIT_MEMLOCK too small for an unprivileged user,
// or no memory to lock) the block stays usable, unlocked; locked_bytes() and lock_failures() say
// what happened, and the first failure is logged once with the fix (ulimit -l).
// Blocks of kHugeBlockBytes or more are 2 MiB aligned and advised MADV_HUGEPAGE, as CpuAllocator's
// (ops/allocator.h): fewer TLB misses on the CPU optimizer's sweeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ops/allocator.h"

namespace dstrain {

class PinnedHostAllocator final : public Allocator {
 public:
  static constexpr std::size_t kHugeBlockBytes = std::size_t{2} << 20;

  // `lock`: mlock every block (offload_optimizer.pin_memory); false: page-aligned, unlocked.
  explicit PinnedHostAllocator(bool lock = true);
  ~PinnedHostAllocator() override = default;

  Device device() const override { return Device::cpu(); }
  // The page size (sysconf), so every block is page-aligned without asking.
  std::size_t default_alignment() const override { return page_; }

  bool locks() const { return lock_; }
  // Bytes of live blocks that mlock locked (whole pages), and how many blocks it could not lock.
  std::uint64_t locked_bytes() const;
  std::uint64_t lock_failures() const;

 protected:
  void* raw_allocate(std::size_t bytes, std::size_t alignment) override;
  void raw_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override;

 private:
  std::size_t page_;
  bool lock_;
  mutable std::mutex mutex_;
  struct Mapping {
    std::size_t length;  // mapped bytes (page-rounded)
    bool locked;         // mlock succeeded
  };
  std::unordered_map<void*, Mapping> mappings_;
  std::uint64_t locked_bytes_ = 0;
  std::uint64_t lock_failures_ = 0;
};

}  // namespace dstrain
