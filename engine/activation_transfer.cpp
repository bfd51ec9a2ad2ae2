#include "engine/activation_transfer.h"

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

#if defined(DSTRAIN_HAS_CUDA)
#include "engine/activation_transfer_cuda.h"
#endif

namespace dstrain {

ActivationTransfer::Ticket CpuActivationTransfer::to_host(const Tensor& dst, const Tensor& src) {
  copy_tensor(dst, src);
  bytes_to_host_ += src.nbytes();
  return ++next_;
}

ActivationTransfer::Ticket CpuActivationTransfer::to_device(const Tensor& dst, const Tensor& src) {
  copy_tensor(dst, src);
  bytes_to_device_ += src.nbytes();
  return ++next_;
}

std::unique_ptr<ActivationTransfer> make_activation_transfer(Device device) {
  if (device.is_cpu()) return std::make_unique<CpuActivationTransfer>();
#if defined(DSTRAIN_HAS_CUDA)
  if (device.is_cuda()) return std::make_unique<CudaActivationTransfer>(device.index);
#endif
  fail("activation checkpointing: no activation transfer for device {} in this build (it was built without the CUDA backend); "
       "rebuild with -DDSTRAIN_CUDA=ON, train on the CPU, or turn checkpointing off",
       device.str());
}

}  // namespace dstrain
