// Device copies of the kernel tests' host buffers (tests/unit/kernels/kernel_test_util.h's Buf),
// made through the engine's own path: a caching CudaAllocator on cuda:0 and copy_tensor, so the
// tests that use it also exercise host <-> device copies. Buffers live as long as the object.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "ops/buffer.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/tensor_ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace dstrain::test {

class DeviceTensors {
 public:
  DeviceTensors() : alloc_(make_device_allocator(Device::cuda(0))) {}
  // A device tensor of shape s holding host's values.
  Tensor put(Buf& host, Shape s) {
    bufs_.emplace_back(*alloc_, std::max<std::size_t>(static_cast<std::size_t>(host.size()) * dtype_size(host.dtype()), 1), MemoryPurpose::buffers);
    const Tensor d = bufs_.back().tensor(host.dtype(), s);
    copy_tensor(d, host.tensor(s));
    return d;
  }
  Tensor zeros(DType t, Shape s) {
    Buf z(t, s.numel());
    return put(z, s);
  }
  // The device tensor's values on the host.
  static Buf get(const Tensor& d) {
    Buf b(d.dtype, d.numel());
    copy_tensor(b.tensor(d.shape), d);
    return b;
  }

 private:
  std::unique_ptr<Allocator> alloc_;
  std::vector<Buffer> bufs_;
};

}  // namespace dstrain::test
