#include "ops/cuda/cuda_check.h"

#include <string>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::detail {

namespace {

// The fix for the statuses a user can do something about; empty when there is no general advice.
std::string cuda_fix(cudaError_t status) {
  switch (status) {
    case cudaErrorMemoryAllocation:
      return "Fix: reduce the micro-batch size or sequence length, or save memory with ZeRO stages, offload or "
             "activation checkpointing.";
    case cudaErrorInsufficientDriver:
      return "Fix: update the NVIDIA driver to one that supports this CUDA runtime (see `dstrain --version` and "
             "nvidia-smi).";
    case cudaErrorNoDevice:
      return "Fix: check that nvidia-smi lists a GPU and that CUDA_VISIBLE_DEVICES does not hide it, or run on the CPU.";
    case cudaErrorInvalidDevice:
      return "Fix: use a GPU ordinal below the number of visible GPUs (CUDA_VISIBLE_DEVICES renumbers them from 0).";
    case cudaErrorNoKernelImageForDevice:
      return "Fix: rebuild with CMAKE_CUDA_ARCHITECTURES including this GPU's compute capability.";
    default:
      return {};
  }
}

}  // namespace

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear the slot: this failure is reported here, once
  const std::string fix = cuda_fix(status);
  throw Error(fmt::format("CUDA call {} failed at {}:{}: {} ({}){}{}", call, file, line, cudaGetErrorName(status), cudaGetErrorString(status),
                          fix.empty() ? "" : ". ", fix));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  std::string fix;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) fix = ". Fix: free GPU memory (smaller micro-batch) or give cuBLASLt a workspace";
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) fix = ". Fix: this dtype/layout/shape combination has no cuBLASLt kernel on this GPU";
  throw Error(fmt::format("cuBLAS call {} failed at {}:{}: {} ({}){}", call, file, line, cublasLtGetStatusName(status),
                          cublasLtGetStatusString(status), fix));
}

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  // ncclGetLastError(nullptr) holds the human-readable detail of the most recent failure.
  const char* detail = ncclGetLastError(nullptr);
  std::string fix;
  if (status == ncclSystemError || status == ncclRemoteError) {
    fix = ". Fix: check the network between ranks and rerun with NCCL_DEBUG=INFO for details";
  } else if (status == ncclUnhandledCudaError) {
    fix = ". Fix: a CUDA call inside NCCL failed; rerun with NCCL_DEBUG=WARN";
  }
  throw Error(fmt::format("NCCL call {} failed at {}:{}: {} (status {}){}{}{}", call, file, line, ncclGetErrorString(status),
                          static_cast<int>(status), detail != nullptr && *detail != '\0' ? ": " : "", detail != nullptr ? detail : "", fix));
}

}  // namespace dstrain::detail
