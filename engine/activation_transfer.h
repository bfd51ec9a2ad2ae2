// ActivationTransfer: moves kept activations between device and host memory (cpu_checkpointing)
// and is the device synchronize of synchronize_checkpoint_boundary.
//
// Activation checkpointing issues its copies and waits only through this interface, so the overlap
// is written once for every backend:
//   - CUDA (engine/activation_transfer_cuda.h, CudaActivationTransfer, in builds with DSTRAIN_CUDA):
//     to_host / to_device are a cudaMemcpyAsync on a side stream that first waits on an event of
//     the compute stream (the source is ready), then records an event; wait(ticket) makes the
//     compute stream wait on that event (the host never blocks); synchronize() is
//     cudaDeviceSynchronize. Host memory is then pinned, so the copies run at PCIe speed.
//   - CPU (this file's CpuActivationTransfer): device and host memory are the same RAM and there is
//     one stream of work, so a copy is a real memcpy done at once (a copy, not an alias: the kept
//     bytes really travel through the host buffer and back), wait() has nothing left to wait for,
//     and synchronize() is a no-op hook because there is no asynchronous device work to drain.
// Counters record what was moved and how often the device was synchronized, so tests and the
// profile can check the traffic against a formula.
#pragma once

#include <cstdint>
#include <memory>

#include "ops/device.h"
#include "ops/tensor.h"

namespace dstrain {

class ActivationTransfer {
 public:
  using Ticket = std::uint64_t;  // 0: no copy (waiting on it is a no-op)

  virtual ~ActivationTransfer() = default;
  ActivationTransfer() = default;
  ActivationTransfer(const ActivationTransfer&) = delete;
  ActivationTransfer& operator=(const ActivationTransfer&) = delete;

  // dst (host) = src (device); same dtype and element count. Returns the copy's ticket.
  virtual Ticket to_host(const Tensor& dst, const Tensor& src) = 0;
  // dst (device) = src (host).
  virtual Ticket to_device(const Tensor& dst, const Tensor& src) = 0;
  // Work issued after this call sees the copy finished (its source may be overwritten, its
  // destination read). On a GPU "work" is device work (kernels, later copies): host code that
  // reads a to_host destination or overwrites a to_device source calls synchronize() first.
  virtual void wait(Ticket ticket) = 0;
  // A full device synchronize (DeepSpeed's get_accelerator().synchronize()).
  virtual void synchronize() = 0;

  std::uint64_t bytes_to_host() const { return bytes_to_host_; }
  std::uint64_t bytes_to_device() const { return bytes_to_device_; }
  std::uint64_t synchronizations() const { return synchronizations_; }

 protected:
  std::uint64_t bytes_to_host_ = 0;
  std::uint64_t bytes_to_device_ = 0;
  std::uint64_t synchronizations_ = 0;
};

// The CPU backend's transfer (see the top of this file).
class CpuActivationTransfer final : public ActivationTransfer {
 public:
  Ticket to_host(const Tensor& dst, const Tensor& src) override;
  Ticket to_device(const Tensor& dst, const Tensor& src) override;
  void wait(Ticket) override {}           // every copy is already done
  void synchronize() override { ++synchronizations_; }  // no-op on the CPU: nothing runs asynchronously

 private:
  Ticket next_ = 0;
};

// The transfer for activations on `device`. Error for a device this build has no transfer for.
std::unique_ptr<ActivationTransfer> make_activation_transfer(Device device);

}  // namespace dstrain
