// CudaAllocator: GPU memory with the same Allocator interface and MemoryStats as the host, cached.
//
// The statistics users see are the base class's: the bytes callers asked for, per purpose, live
// now and at the peak — equal to what CpuAllocator reports for the same sequence of calls. Below
// them, a caching pool (ops/caching_pool.h, PyTorch's CUDACachingAllocator in spirit) keeps freed
// blocks for reuse instead of calling cudaFree, which synchronises the whole device, and carves
// requests out of cached segments instead of calling cudaMalloc. ZeRO's per-step transient buffers
// are therefore served from the cache after the first step(s): no cudaMalloc, no cudaFree, no host
// synchronisation inside a step. What the pool holds from CUDA is reported apart:
// reserved_bytes() (live blocks, their rounding, and the cache), cached_bytes(), and counts of
// cudaMalloc / cudaFree calls and cache hits. empty_cache() returns every cached segment without
// a live block to CUDA (e.g. before handing memory to another library).
//
// Out of memory: when cudaMalloc fails, the cache is returned to CUDA (cudaFree of every unused
// cached segment) and cudaMalloc is tried once more; only then is the base class's Error thrown
// ("out of cuda:N memory ..."), with what the pool reserves and the GPU's free memory added.
//
// When reuse of a freed block is safe (the streams contract): every dstrain kernel and copy runs on
// the legacy default stream of the device (ops/cuda/README.md); NCCL's stream waits on an event of
// the compute stream before reading, and the compute stream waits on an event of NCCL's before
// using what NCCL wrote; CudaCopyStream's side stream does the same. A block is freed in
// host program order after the last work that uses it was enqueued, and the next user's work is
// enqueued later on the legacy default stream (or on a stream ordered after it by an event), so it
// runs after the previous user's work has finished: no synchronisation is needed. The legacy
// default stream also orders itself with every blocking stream (cudaStreamCreate without flags).
// A caller that uses a block on a NON-blocking stream (cudaStreamNonBlocking, including NCCL's and
// the transfer's side streams) must, before freeing it, either make the legacy default stream wait
// on an event recorded after that work (cudaStreamWaitEvent: NcclCommunicator::
// compute_wait_for_comm(), CudaCopyStream::wait()) or synchronise that stream; otherwise
// the block may be handed to new work while the old is still running. (New work enqueued on
// NCCL's or the transfer's stream is safe too: those streams wait on the compute stream's event
// before each collective or copy.)
//
// Thread-safe: the base class locks its block table, the pool its free lists (each rank has its
// own allocator; several threads may still share one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/allocator.h"
#include "ops/caching_pool.h"

namespace dstrain {

class CudaAllocator final : public Allocator {
 public:
  // Pool blocks are aligned to 512 bytes; 256 is what cudaMalloc promises and what is offered
  // (larger alignments are an Error).
  static constexpr std::size_t kAlignment = 256;

  // Throws Error (require_cuda_device) when GPU `ordinal` cannot be used.
  explicit CudaAllocator(int ordinal);
  // cudaFree of the cached segments; blocks still live are left alone (errors ignored).
  ~CudaAllocator() override = default;

  Device device() const override { return Device::cuda(ordinal_); }
  std::size_t default_alignment() const override { return kAlignment; }

  // ---- the cache (held from CUDA, apart from the per-purpose statistics) ----
  std::size_t reserved_bytes() const { return pool_.stats().reserved_bytes; }
  std::size_t cached_bytes() const { return pool_.stats().cached_bytes(); }
  std::uint64_t cuda_malloc_calls() const { return pool_.stats().backend_allocations; }
  std::uint64_t cuda_free_calls() const { return pool_.stats().backend_frees; }
  std::uint64_t cache_hits() const { return pool_.stats().cache_hits; }
  CachingPool::Stats pool_stats() const { return pool_.stats(); }
  // Returns every cached segment without a live block to CUDA (cudaFree, which synchronises the
  // device); the bytes released.
  std::size_t empty_cache() { return pool_.release_cached(); }

 protected:
  void* raw_allocate(std::size_t bytes, std::size_t alignment) override;
  void raw_deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override;
  std::string out_of_memory_detail() const override;

 private:
  int ordinal_;
  CachingPool pool_;  // last: destroyed first, while ordinal_ is still there for its cudaFree
};

}  // namespace dstrain
