// The communicator of a process started by a launcher (torchrun, the deepspeed launcher, mpirun,
// srun) as one rank of several processes: Gloo over the launcher's ranks on the cpu (when built
// with libgloo-dev), NCCL on GPUs (in the CUDA build).
//
// Why not in nccl_communicator.h / gloo_communicator.h: callers above zero (the CLI, embedding
// programs) ask for "the launcher's group" without including CUDA, NCCL or Gloo headers, and get an
// Error that names the fix in a build without them.
#pragma once

#include <memory>

#include "ops/device.h"
#include "zero/communicator.h"
#include "zero/launch_env.h"

namespace dstrain {

// Joins the launcher's group as rank env.rank of env.world_size: on the cpu a GlooCommunicator
// (rendezvous at MASTER_ADDR:MASTER_PORT, zero/gloo_communicator.h), on a cuda `device`
// (cuda:LOCAL_RANK is the usual choice) an NcclCommunicator. Blocks until every rank joined or
// fails after the timeout. Error naming the fix in a build without the backend the device needs.
// gloo_backend_built(): whether the cpu case works in this build.
std::unique_ptr<Communicator> join_launcher_group(const LaunchEnv& env, Device device);

// The GPU of this process when the user names none (`--device cuda`): cuda:LOCAL_RANK, except
// when the process sees exactly one GPU (srun --gpus-per-task=1, one container per rank, a
// CUDA_VISIBLE_DEVICES per process): then its own GPU is cuda:0 whatever its local rank, as
// NcclOptions::device = -1 chooses. cuda:LOCAL_RANK in a build without NCCL or when the GPUs
// cannot be counted (the allocator then reports the problem).
Device launcher_device(const LaunchEnv& env);
bool gloo_backend_built();

}  // namespace dstrain
