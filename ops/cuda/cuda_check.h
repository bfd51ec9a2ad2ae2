// Status checks for CUDA runtime, cuBLAS(Lt) and NCCL calls: a failure becomes a dstrain::Error
// naming the call as written, its file:line, the status name and text, and (for common statuses)
// the fix. Usable from .cpp and .cu files:
//
//   DSTRAIN_CUDA_CHECK(cudaMalloc(&ptr, bytes));
//   DSTRAIN_CUBLAS_CHECK(cublasLtMatmul(...));
//   DSTRAIN_NCCL_CHECK(ncclAllReduce(...));
//
// Kernel launches report configuration errors only through cudaGetLastError(), so check it right
// after a launch: DSTRAIN_CUDA_CHECK(cudaGetLastError()).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace dstrain::detail {

// Throw dstrain::Error. throw_cuda_error also clears the runtime's last-error slot, so a later
// cudaGetLastError() does not report this failure a second time.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line);

}  // namespace dstrain::detail

#define DSTRAIN_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                                   \
    const cudaError_t dstrain_status_ = (call);                                                                          \
    if (dstrain_status_ != cudaSuccess) ::dstrain::detail::throw_cuda_error(dstrain_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define DSTRAIN_CUBLAS_CHECK(call)                                                                                                   \
  do {                                                                                                                               \
    const cublasStatus_t dstrain_status_ = (call);                                                                                   \
    if (dstrain_status_ != CUBLAS_STATUS_SUCCESS) ::dstrain::detail::throw_cublas_error(dstrain_status_, #call, __FILE__, __LINE__); \
  } while (0)

// Blocking communicators only: a non-blocking one returns ncclInProgress, which is not a failure
// and must be polled with ncclCommGetAsyncError instead.
#define DSTRAIN_NCCL_CHECK(call)                                                                                         \
  do {                                                                                                                   \
    const ncclResult_t dstrain_status_ = (call);                                                                         \
    if (dstrain_status_ != ncclSuccess) ::dstrain::detail::throw_nccl_error(dstrain_status_, #call, __FILE__, __LINE__); \
  } while (0)
