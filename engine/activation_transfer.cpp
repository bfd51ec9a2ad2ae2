#include "engine/activation_transfer.h"

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

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
  if (!device.is_cpu()) {
    fail("activation checkpointing: no activation transfer for device {} in this build (the CUDA side-stream copy is not built yet); "
         "train on the CPU or turn checkpointing off",
         device.str());
  }
  return std::make_unique<CpuActivationTransfer>();
}

}  // namespace dstrain
