#include "offload/host_memory.h"

#include "offload/pinned_host_allocator.h"
#if defined(DSTRAIN_HAS_CUDA)
#include "ops/cuda/pinned_allocator.h"
#endif

namespace dstrain {

HostMemoryChoice make_host_memory(Device training_device, bool offloads, bool pin) {
  HostMemoryChoice c;
#if defined(DSTRAIN_HAS_CUDA)
  if (training_device.is_cuda() && (pin || !offloads)) {
    c.allocator = std::make_unique<CudaPinnedAllocator>(training_device.index);
    c.kind = "page-locked (cudaHostAlloc)";
    return c;
  }
#endif
  (void)training_device;
  if (offloads) {
    c.allocator = std::make_unique<PinnedHostAllocator>(pin);
    c.kind = pin ? "page-aligned, mlock" : "page-aligned";
    return c;
  }
  c.allocator = std::make_unique<CpuAllocator>();
  c.kind = "pageable";
  return c;
}

}  // namespace dstrain
