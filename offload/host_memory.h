// The host memory an engine keeps apart from its training device: the offloaded optimizer
// partition (offload_optimizer.device "cpu", docs/training_state.md §3) and cpu_checkpointing's
// kept activations. Chosen once, from the device and offload_optimizer.pin_memory.
#pragma once

#include <memory>

#include "ops/allocator.h"
#include "ops/device.h"

namespace dstrain {

// What the allocator is, for the run's log: "page-locked (cudaHostAlloc)", "page-aligned, mlock",
// "page-aligned" or "pageable".
struct HostMemoryChoice {
  std::unique_ptr<Allocator> allocator;
  const char* kind = "";
};

// `training_device`: where the engine trains. `offloads`: the optimizer partition will live in this
// memory. `pin`: offload_optimizer.pin_memory.
//   - next to a GPU (CUDA builds): page-locked memory from cudaHostAlloc (ops/cuda/pinned_allocator.h)
//     when `pin` or nothing is offloaded, so copies run asynchronously at PCIe speed;
//   - on the CPU with offload: PinnedHostAllocator (page-aligned; mlock when `pin`), counted apart
//     from the training allocator;
//   - otherwise CpuAllocator.
HostMemoryChoice make_host_memory(Device training_device, bool offloads, bool pin);

}  // namespace dstrain
