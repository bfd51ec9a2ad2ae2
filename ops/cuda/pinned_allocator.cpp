#include "ops/cuda/pinned_allocator.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_runtime_info.h"
#include "ops/cuda/device_scope.h"
#include "ops/error.h"

namespace dstrain {

namespace {

CachingPool::Backend pinned_backend(int ordinal) {
  return {[ordinal](std::size_t bytes) -> void* {
            CudaDeviceScope scope(ordinal);
            void* ptr = nullptr;
            const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
            if (status == cudaErrorMemoryAllocation) {
              (void)cudaGetLastError();  // not sticky: the pool frees its cache and retries, or the caller reports
              return nullptr;
            }
            DSTRAIN_CUDA_CHECK(status);
            return ptr;
          },
          [ordinal](void* ptr, std::size_t /*bytes*/) {
            CudaDeviceScope scope(ordinal);
            DSTRAIN_CUDA_CHECK(cudaFreeHost(ptr));
          }};
}

}  // namespace

CudaPinnedAllocator::CudaPinnedAllocator(int ordinal) : pool_(pinned_backend(ordinal)) { require_cuda_device(ordinal); }

void* CudaPinnedAllocator::raw_allocate(std::size_t bytes, std::size_t alignment) {
  DSTRAIN_CHECK(alignment <= CachingPool::kMinBlock,
                "CudaPinnedAllocator: alignment {} requested for {} bytes, but pinned blocks are aligned to {} bytes only; ask for {} or less",
                alignment, bytes, CachingPool::kMinBlock, CachingPool::kMinBlock);
  return pool_.allocate(bytes);
}

void CudaPinnedAllocator::raw_deallocate(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) { pool_.free(ptr); }

std::string CudaPinnedAllocator::out_of_memory_detail() const {
  const CachingPool::Stats pool = pool_.stats();
  return fmt::format(
      "pinned (page-locked) host memory via cudaHostAlloc; this allocator pins {} ({} of it cached; unused cached "
      "segments were freed and cudaHostAlloc retried); the OS limit on locked memory (ulimit -l, container "
      "memory limits) may be lower than the free RAM",
      format_bytes(pool.reserved_bytes), format_bytes(pool.cached_bytes()));
}

}  // namespace dstrain
