// A device copy of a communicator test's HostBuf (tests/unit/zero/comm_test_util.h), shared by
// the GPU tests of both communicators: cudaMalloc'd on the current device, freed on scope exit.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_check.h"
#include "ops/tensor.h"
#include "tests/unit/zero/comm_test_util.h"

namespace dstrain::testing_comm {

// A device buffer (allocated and freed by the thread that owns it).
struct DeviceBuf {
  void* ptr = nullptr;
  DType dtype = DType::fp32;
  std::int64_t n = 0;
  DeviceBuf(DType d, std::int64_t count) : dtype(d), n(count) { DSTRAIN_CUDA_CHECK(cudaMalloc(&ptr, bytes() == 0 ? 4 : bytes())); }
  explicit DeviceBuf(const HostBuf& h) : DeviceBuf(h.dtype, h.n) {
    if (bytes() > 0) DSTRAIN_CUDA_CHECK(cudaMemcpy(ptr, h.mem.data(), bytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuf() { (void)cudaFree(ptr); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  std::size_t bytes() const { return static_cast<std::size_t>(n) * dtype_size(dtype); }
  Tensor tensor() const { return Tensor(ptr, dtype, Shape{n}, Device::cuda(0)); }
  HostBuf to_host() const {
    HostBuf h(dtype, n);
    if (bytes() > 0) DSTRAIN_CUDA_CHECK(cudaMemcpy(h.mem.data(), ptr, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace dstrain::testing_comm
