#include "ops/kernels/copy_stream.h"

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

#if DSTRAIN_HAS_CUDA_KERNELS
#include "ops/cuda/copy_stream.h"
#endif

namespace dstrain {

CopyStream::Ticket CpuCopyStream::to_host(const Tensor& dst, const Tensor& src) {
  copy_tensor(dst, src);
  bytes_to_host_ += src.nbytes();
  return ++next_;
}

CopyStream::Ticket CpuCopyStream::to_device(const Tensor& dst, const Tensor& src) {
  copy_tensor(dst, src);
  bytes_to_device_ += src.nbytes();
  return ++next_;
}

std::unique_ptr<CopyStream> make_copy_stream(Device device, const char* user) {
  if (device.is_cpu()) return std::make_unique<CpuCopyStream>();
#if DSTRAIN_HAS_CUDA_KERNELS
  if (device.is_cuda()) return std::make_unique<CudaCopyStream>(device.index);
#endif
  fail(
      "{}: no copy stream between device {} and host memory in this build (it was built without the CUDA backend); rebuild with "
      "-DDSTRAIN_CUDA=ON, or train on the cpu",
      user, device.str());
}

}  // namespace dstrain
