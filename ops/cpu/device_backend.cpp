#include "ops/kernels/device_backend.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "ops/error.h"

#if DSTRAIN_HAS_CUDA_KERNELS
#include <cuda_runtime_api.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_allocator.h"
#endif

namespace dstrain {

std::unique_ptr<Allocator> make_device_allocator(Device device) {
  if (device.is_cpu()) return std::make_unique<CpuAllocator>();
#if DSTRAIN_HAS_CUDA_KERNELS
  return std::make_unique<CudaAllocator>(device.index);  // checks the driver and the ordinal
#else
  fail(
      "device {}: this dstrain was built without the CUDA backend (nvcc was not found, or -DDSTRAIN_CUDA=OFF); rebuild on a machine with the "
      "CUDA toolkit, or train on the cpu",
      device.str());
#endif
}

void synchronize_device(Device device) {
  if (device.is_cpu()) return;
#if DSTRAIN_HAS_CUDA_KERNELS
  int current = -1;
  DSTRAIN_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index) DSTRAIN_CUDA_CHECK(cudaSetDevice(device.index));
  DSTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
#else
  fail("synchronize_device({}): this dstrain was built without the CUDA backend", device.str());
#endif
}

int cpu_team_threads() { return std::max(1, omp_get_max_threads()); }

int cpu_usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace dstrain
