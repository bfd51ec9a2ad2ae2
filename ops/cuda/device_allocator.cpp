#include "ops/cuda/device_allocator.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_runtime_info.h"
#include "ops/cuda/device_scope.h"
#include "ops/error.h"

namespace dstrain {

namespace {

// cudaMalloc / cudaFree of whole pool segments on GPU `ordinal`.
CachingPool::Backend cuda_backend(int ordinal) {
  return {[ordinal](std::size_t bytes) -> void* {
            CudaDeviceScope scope(ordinal);
            void* ptr = nullptr;
            const cudaError_t status = cudaMalloc(&ptr, bytes);
            if (status == cudaErrorMemoryAllocation) {
              (void)cudaGetLastError();  // out of memory is not sticky; clear it and let the pool retry or report
              return nullptr;
            }
            DSTRAIN_CUDA_CHECK(status);
            return ptr;
          },
          [ordinal](void* ptr, std::size_t /*bytes*/) {
            CudaDeviceScope scope(ordinal);
            DSTRAIN_CUDA_CHECK(cudaFree(ptr));
          }};
}

}  // namespace

CudaAllocator::CudaAllocator(int ordinal) : ordinal_(ordinal), pool_(cuda_backend(ordinal)) { require_cuda_device(ordinal); }

void* CudaAllocator::raw_allocate(std::size_t bytes, std::size_t alignment) {
  DSTRAIN_CHECK(alignment <= kAlignment,
                "CudaAllocator on {}: alignment {} requested for {} bytes, but blocks are aligned to {} bytes only; ask for {} or less",
                device().str(), alignment, bytes, kAlignment, kAlignment);
  return pool_.allocate(bytes);  // nullptr after the cache was released and cudaMalloc retried once
}

void CudaAllocator::raw_deallocate(void* ptr, std::size_t /*bytes*/, std::size_t /*alignment*/) {
  pool_.free(ptr);  // into the cache: no cudaFree, no device synchronisation (see the header)
}

std::string CudaAllocator::out_of_memory_detail() const {
  const CachingPool::Stats pool = pool_.stats();
  std::string detail = fmt::format(
      "this allocator reserves {} from CUDA ({} of it cached; unused cached segments were freed and "
      "cudaMalloc retried)",
      format_bytes(pool.reserved_bytes), format_bytes(pool.cached_bytes()));
  try {
    CudaDeviceScope scope(ordinal_);
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return detail;
    }
    return detail + fmt::format("; {} has {} free of {} (other processes and the CUDA context use the rest)", device().str(),
                                format_bytes(free_bytes), format_bytes(total_bytes));
  } catch (const Error&) {
    return detail;
  }
}

}  // namespace dstrain
