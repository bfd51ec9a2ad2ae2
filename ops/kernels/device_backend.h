// The backend of a device, for code above ops that must not include CUDA headers (the engine, the
// CLI): its allocator and its host synchronisation. A cuda device in a build without the CUDA
// backend, or on a machine without a usable GPU, is an Error naming the fix.
#pragma once

#include <memory>

#include "ops/allocator.h"
#include "ops/device.h"

namespace dstrain {

// A new allocator for `device`: CpuAllocator for the cpu; for cuda:N the caching CudaAllocator of
// GPU N (require_cuda_device first: no driver, a driver too old, no such GPU are Errors).
std::unique_ptr<Allocator> make_device_allocator(Device device);

// Blocks the host until every piece of work queued on `device` has finished (cudaDeviceSynchronize,
// errors of earlier asynchronous work surface here as an Error); nothing to do for the cpu. Used
// where the host reads a clock around device work.
void synchronize_device(Device device);

// The CPU's compute resources: the threads of one OpenMP team (what one rank's kernels use) and the
// cores this process may run on (its affinity mask). MFU's peak for a job of several local ranks
// counts the cores their teams can occupy together.
int cpu_team_threads();
int cpu_usable_cores();

}  // namespace dstrain
