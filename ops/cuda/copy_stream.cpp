#include "ops/cuda/copy_stream.h"

#include "ops/cuda/compute_stream.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_runtime_info.h"
#include "ops/cuda/device_scope.h"
#include "ops/error.h"

namespace dstrain {

CudaCopyStream::CudaCopyStream(int ordinal) : ordinal_(ordinal) {
  require_cuda_device(ordinal);
  try {
    CudaDeviceScope scope(ordinal);
    DSTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    for (cudaEvent_t& e : done_) DSTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    destroy();
    throw;
  }
}

CudaCopyStream::~CudaCopyStream() { destroy(); }

void CudaCopyStream::destroy() noexcept {
  try {
    CudaDeviceScope scope(ordinal_);
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t& e : done_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
      e = nullptr;
    }
    if (compute_ready_ != nullptr) (void)cudaEventDestroy(compute_ready_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();  // a failure here (e.g. the runtime unloading at exit) is not the next caller's
  } catch (...) {              // the device could not even be selected: nothing to release on it
  }
  compute_ready_ = nullptr;
  stream_ = nullptr;
}

CopyStream::Ticket CudaCopyStream::copy(const Tensor& dst, const Tensor& src, bool to_host_direction) {
  const char* what = to_host_direction ? "to_host" : "to_device";
  const Tensor& dev = to_host_direction ? src : dst;
  const Tensor& host = to_host_direction ? dst : src;
  DSTRAIN_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(),
                "copy stream {}: destination {} {} and source {} {} differ in dtype or element count; pass views of the same "
                "shape and dtype",
                what, dtype_name(dst.dtype), dst.shape.str(), dtype_name(src.dtype), src.shape.str());
  DSTRAIN_CHECK(dev.device == Device::cuda(ordinal_) && host.device.is_cpu(),
                "copy stream {} on cuda:{}: the device side is on {} and the host side on {}; the device tensor must be on "
                "cuda:{} and the host tensor on the cpu",
                what, ordinal_, dev.device.str(), host.device.str(), ordinal_);
  const std::size_t bytes = src.nbytes();
  if (bytes == 0) return 0;
  DSTRAIN_CHECK(dst.data != nullptr && src.data != nullptr, "copy stream {}: a tensor of {} bytes has no data pointer", what, bytes);

  CudaDeviceScope scope(ordinal_);
  // The source was written, and the destination last read, by work already on the compute stream.
  DSTRAIN_CUDA_CHECK(cudaEventRecord(compute_ready_, cuda::compute_stream()));
  DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, bytes, to_host_direction ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream_));
  const Ticket ticket = next_ + 1;
  DSTRAIN_CUDA_CHECK(cudaEventRecord(done_[ticket % kEvents], stream_));
  next_ = ticket;
  (to_host_direction ? bytes_to_host_ : bytes_to_device_) += bytes;
  return ticket;
}

CopyStream::Ticket CudaCopyStream::to_host(const Tensor& dst, const Tensor& src) { return copy(dst, src, true); }

CopyStream::Ticket CudaCopyStream::to_device(const Tensor& dst, const Tensor& src) { return copy(dst, src, false); }

void CudaCopyStream::wait(Ticket ticket) {
  if (ticket == 0) return;
  DSTRAIN_CHECK(ticket <= next_,
                "copy stream wait: ticket {} was never issued (the last is {}); wait only on tickets that "
                "to_host / to_device returned",
                ticket, next_);
  CudaDeviceScope scope(ordinal_);
  DSTRAIN_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done_[ticket % kEvents], 0));
}

void CudaCopyStream::wait_host(Ticket ticket) {
  if (ticket == 0) return;
  DSTRAIN_CHECK(ticket <= next_,
                "copy stream wait_host: ticket {} was never issued (the last is {}); wait only on tickets that "
                "to_host / to_device returned",
                ticket, next_);
  CudaDeviceScope scope(ordinal_);
  // A ticket older than the ring is covered by the newer copy that reused its event (in order).
  DSTRAIN_CUDA_CHECK(cudaEventSynchronize(done_[ticket % kEvents]));
}

void CudaCopyStream::synchronize() {
  CudaDeviceScope scope(ordinal_);
  DSTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  ++synchronizations_;
}

}  // namespace dstrain
