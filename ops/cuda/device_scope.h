// CudaDeviceScope: makes `ordinal` the current device for one scope and restores the caller's.
// cudaMalloc, cudaFree, stream and event calls act on the current device, and callers must not
// find it changed behind their back.
#pragma once

#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_check.h"

namespace dstrain {

class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int ordinal) {
    DSTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal)
      DSTRAIN_CUDA_CHECK(cudaSetDevice(ordinal));
    else
      previous_ = -1;
  }
  ~CudaDeviceScope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace dstrain
