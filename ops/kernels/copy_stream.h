// CopyStream: copies between a training device and host memory on a stream of their own, ordered
// with events, so that they overlap compute. Its users: activation checkpointing's
// cpu_checkpointing (kept activations to the host and back) and ZeRO's offload (an offloaded
// optimizer sub-group's gradients to the host, its updated parameters back; an offloaded parameter
// shard to the device for its all-gather). docs/offload.md §12.
//
// The overlap is written once, above the backends:
//   - CUDA (ops/cuda/copy_stream.h, CudaCopyStream, in builds with the CUDA backend): to_host /
//     to_device are a cudaMemcpyAsync on a side stream that first waits on an event of the compute
//     stream (the source is written, the destination's last reader is done), then records an event;
//     wait(ticket) makes the compute stream wait on that event (the host never blocks);
//     wait_host(ticket) blocks the host on it; synchronize() is cudaDeviceSynchronize. Host memory
//     should be pinned (cudaHostAlloc), or the copies are synchronous and nothing overlaps.
//   - CPU (CpuCopyStream, ops/cpu/copy_stream.cpp): device and host memory are the same RAM and
//     there is one stream of work, so a copy is a real memcpy done at once (a copy, not an alias:
//     the bytes really travel through the host buffer and back), the waits have nothing left to
//     wait for, and synchronize() is a no-op hook because there is no asynchronous device work.
// Counters record what was moved and how often the device was synchronized, so tests and the
// profile can check the traffic against a formula.
#pragma once

#include <cstdint>
#include <memory>

#include "ops/device.h"
#include "ops/tensor.h"

namespace dstrain {

class CopyStream {
 public:
  using Ticket = std::uint64_t;  // 0: no copy (waiting on it is a no-op); tickets grow in issue order

  virtual ~CopyStream() = default;
  CopyStream() = default;
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // dst (host) = src (device); same dtype and element count. Returns the copy's ticket.
  virtual Ticket to_host(const Tensor& dst, const Tensor& src) = 0;
  // dst (device) = src (host).
  virtual Ticket to_device(const Tensor& dst, const Tensor& src) = 0;
  // Device work issued after this call (kernels, collectives ordered after compute, later copies)
  // sees the copy finished: its source may be overwritten, its destination read. The host does not
  // wait.
  virtual void wait(Ticket ticket) = 0;
  // The host blocks until the copy (and every copy issued before it: the stream is in order) is
  // finished: host code may then read a to_host destination or overwrite a to_device source.
  virtual void wait_host(Ticket ticket) = 0;
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

// The CPU backend's copy stream (see the top of this file).
class CpuCopyStream final : public CopyStream {
 public:
  Ticket to_host(const Tensor& dst, const Tensor& src) override;
  Ticket to_device(const Tensor& dst, const Tensor& src) override;
  void wait(Ticket) override {}                         // every copy is already done
  void wait_host(Ticket) override {}                    // ditto
  void synchronize() override { ++synchronizations_; }  // no-op on the CPU: nothing runs asynchronously

 private:
  Ticket next_ = 0;
};

// The copy stream between `device` and host memory. `user` names who asks, for the error a build
// without the CUDA backend gives for a cuda device ("activation checkpointing", "offload").
std::unique_ptr<CopyStream> make_copy_stream(Device device, const char* user);

}  // namespace dstrain
