// CudaPinnedAllocator: page-locked host memory (cudaHostAlloc), cached, counted like any Allocator.
//
// Host memory that the GPU's copy engines read and write directly, so cudaMemcpyAsync runs at PCIe
// speed and truly overlaps with kernels (pageable memory is staged through a driver buffer, and a
// device-to-host copy into it blocks the host). For cpu_checkpointing's kept activations and the
// host side of batch uploads. Its device() is the CPU: tensors in it are host tensors.
//
// cudaHostAlloc is slow (it pins pages) and cudaFreeHost synchronises the device, so blocks are
// cached exactly as CudaAllocator caches device memory (ops/caching_pool.h: 512-byte rounding,
// 2 MiB segments for small blocks, best fit with splitting and merging, empty_cache(), and on
// failure the cache is freed and cudaHostAlloc retried once before the Error). Allocations are
// cudaHostAllocPortable: usable by every GPU's context, not only the current device's.
//
// Reuse contract: the allocator cannot see copies in flight. Free a block only when no copy that
// reads or writes it can still be running (after the event or stream that ends its last copy was
// waited on by the host — synchronize — or the block's next user's copies are ordered after it on
// the same stream); otherwise the next owner may see its bytes change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/allocator.h"
#include "ops/caching_pool.h"

namespace dstrain {

class CudaPinnedAllocator final : public Allocator {
 public:
  static constexpr std::size_t kDefaultAlignment = 64;  // as CpuAllocator; blocks are 512-aligned

  // Throws Error (require_cuda_device) when GPU `ordinal` cannot be used: pinning needs the driver.
  // `ordinal` is the device whose context is current while memory is pinned.
  explicit CudaPinnedAllocator(int ordinal = 0);
  ~CudaPinnedAllocator() override = default;  // cudaFreeHost of cached segments (errors ignored)

  Device device() const override { return Device::cpu(); }
  std::size_t default_alignment() const override { return kDefaultAlignment; }

  std::size_t reserved_bytes() const { return pool_.stats().reserved_bytes; }
  std::size_t cached_bytes() const { return pool_.stats().cached_bytes(); }
  std::uint64_t cuda_host_alloc_calls() const { return pool_.stats().backend_allocations; }
  std::uint64_t cache_hits() const { return pool_.stats().cache_hits; }
  CachingPool::Stats pool_stats() const { return pool_.stats(); }
  std::size_t empty_cache() { return pool_.release_cached(); }

 protected:
  void* raw_allocate(std::size_t bytes, std::size_t alignment) override;
  void raw_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override;
  std::string out_of_memory_detail() const override;

 private:
  CachingPool pool_;
};

}  // namespace dstrain
