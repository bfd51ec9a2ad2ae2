// CudaCopyStream: the CUDA backend of ops/kernels/copy_stream.h — copies between one GPU and host
// memory on a side stream, ordered with events. Built only with the CUDA backend.
//
// Streams: the compute stream is the legacy default stream of the device, where every dstrain
// kernel runs (ops/cuda/README.md). Copies run on one side stream of this object, created
// cudaStreamNonBlocking so that it does not serialise with the compute stream:
//   to_host / to_device: record an event on the compute stream (everything enqueued so far, which
//       includes the kernel that wrote the source and the last reader of the destination), make
//       the side stream wait on it, cudaMemcpyAsync on the side stream, record the ticket's event.
//   wait(ticket): cudaStreamWaitEvent(compute stream, the ticket's event): kernels enqueued after
//       it run after the copy; the host never blocks.
//   wait_host(ticket): cudaEventSynchronize(the ticket's event): the host blocks until the copy
//       (and every earlier one: the side stream is in order) is done.
//   synchronize(): cudaDeviceSynchronize.
// Ticket events come from a ring of kEvents; a ticket older than that waits on the newer copy
// that reused its event, which finishes later on the same in-order stream: still correct, never
// too early.
//
// Host memory should be pinned (CudaPinnedAllocator): with pageable memory the copies are correct
// but a device-to-host copy blocks the host until it is done and nothing overlaps.
#pragma once

#include <array>
#include <cstddef>

#include <cuda_runtime_api.h>

#include "ops/kernels/copy_stream.h"

namespace dstrain {

class CudaCopyStream final : public CopyStream {
 public:
  // Enough that an optimizer sub-group's copies (one per segment: a layer's run of the partition)
  // do not wrap the ring before the host waits on them; a wrapped ticket is still correct (above).
  static constexpr std::size_t kEvents = 256;

  // Creates the side stream and events on GPU `ordinal`; Error (naming the fix) when it cannot be
  // used.
  explicit CudaCopyStream(int ordinal);
  // Waits for the side stream's copies (their buffers may be freed next), then destroys it.
  ~CudaCopyStream() override;

  // dst (host) = src (device on this transfer's GPU); same dtype and element count. A copy of no
  // bytes returns ticket 0.
  Ticket to_host(const Tensor& dst, const Tensor& src) override;
  // dst (device on this transfer's GPU) = src (host).
  Ticket to_device(const Tensor& dst, const Tensor& src) override;
  void wait(Ticket ticket) override;
  void wait_host(Ticket ticket) override;
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
