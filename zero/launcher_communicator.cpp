#include "zero/launcher_communicator.h"

#include "ops/error.h"

#if DSTRAIN_HAS_GLOO
#include "zero/gloo_communicator.h"
#endif
#if DSTRAIN_HAS_NCCL
#include <cuda_runtime_api.h>

#include "zero/nccl_communicator.h"
#endif

namespace dstrain {

std::unique_ptr<Communicator> join_launcher_group(const LaunchEnv& env, Device device) {
  if (device.is_cpu()) {
#if DSTRAIN_HAS_GLOO
    return std::make_unique<GlooCommunicator>(env);
#else
    fail(
        "{}: processes started by a launcher on the cpu communicate over Gloo, and this dstrain was built without it; install it (Debian: "
        "libgloo-dev) and rebuild, start the processes with mpirun and --comm mpi, or start one process without the launcher and give "
        "--num-ranks {} to run the ranks as threads",
        env.str(), env.world_size);
#endif
  }
  DSTRAIN_CHECK(device.is_cuda(), "{}: a launcher's processes train on the cpu (Gloo) or on GPUs (NCCL), not on {}", env.str(), device.str());
#if DSTRAIN_HAS_NCCL
  NcclOptions options;
  options.device = device.index;
  return std::make_unique<NcclCommunicator>(env, options);
#else
  fail("{}: this dstrain was built without the CUDA backend, so it has no NCCL; rebuild on a machine with the CUDA toolkit and NCCL", env.str());
#endif
}

bool gloo_backend_built() {
#if DSTRAIN_HAS_GLOO
  return true;
#else
  return false;
#endif
}

Device launcher_device(const LaunchEnv& env) {
#if DSTRAIN_HAS_NCCL
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices == 1) return Device::cuda(0);
  (void)cudaGetLastError();  // no driver / no GPU: not sticky, and not this function's error to report
#endif
  return Device::cuda(env.local_rank);
}

}  // namespace dstrain
