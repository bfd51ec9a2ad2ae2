// CudaActivationTransfer: cpu_checkpointing's copies between a GPU and host memory, overlapped
// with compute (the CUDA backend of engine/activation_transfer.h). Built only with DSTRAIN_CUDA.
//
// Streams: the compute stream is the legacy default stream of the device, where every dstrain
// kernel runs (ops/cuda/README.md). Copies run on one side stream of this transfer, created
// cudaStreamNonBlocking so that it does not serialise with the compute stream:
//   to_host / to_device: record an event on the compute stream (everything enqueued so far, which
//       includes the kernel that wrote the source and the last reader of the destination), make
//       the side stream wait on it, cudaMemcpyAsync on the side stream, record the ticket's event.
//   wait(ticket): cudaStreamWaitEvent(compute stream, the ticket's event): kernels enqueued after
//       it run after the copy; the host never blocks.
//   synchronize(): cudaDeviceSynchronize.
// Ticket events come from a ring of kEvents; a ticket older than that waits on the newer copy
// that reused its event, which finishes later on the same in-order stream: still correct, never
// too early.
//
// What the contract's "work issued after wait()" covers: device work (kernels on the compute
// stream; later copies of this transfer, which are ordered on its stream anyway). Host code that
// reads the host destination of to_host, or overwrites the host source of to_device, must call
// synchronize() first. ActivationCheckpointing touches its host buffers only through this
// transfer, so it never needs that. Host memory should be pinned (CudaPinnedAllocator, the
// default host allocator of cpu_checkpointing on a GPU): with pageable memory the copies are
// correct but a device-to-host copy blocks the host until it is done and nothing overlaps.
#pragma once

#include <array>
#include <cstddef>

#include <cuda_runtime_api.h>

#include "engine/activation_transfer.h"

namespace dstrain {

class CudaActivationTransfer final : public ActivationTransfer {
 public:
  static constexpr std::size_t kEvents = 32;

  // Creates the side stream and events on GPU `ordinal`; Error (naming the fix) when it cannot be
  // used.
  explicit CudaActivationTransfer(int ordinal);
  // Waits for the side stream's copies (their buffers may be freed next), then destroys it.
  ~CudaActivationTransfer() override;

  // dst (host) = src (device on this transfer's GPU); same dtype and element count. A copy of no
  // bytes returns ticket 0.
  Ticket to_host(const Tensor& dst, const Tensor& src) override;
  // dst (device on this transfer's GPU) = src (host).
  Ticket to_device(const Tensor& dst, const Tensor& src) override;
  void wait(Ticket ticket) override;
  void synchronize() override;


 private:
  Ticket copy(const Tensor& dst, const Tensor& src, bool to_host_direction);
  void destroy() noexcept;

  int ordinal_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  std::array<cudaEvent_t, kEvents> done_{};
  Ticket next_ = 0;
};

}  // namespace dstrain
