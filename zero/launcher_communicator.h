// The communicator of a process started by a launcher (torchrun, the deepspeed launcher, mpirun,
// srun) as one rank of several processes: NCCL over the launcher's ranks, in the CUDA build.
//
// Why not in nccl_communicator.h: callers above zero (the CLI, embedding programs) ask for "the
// launcher's group" without including CUDA or NCCL headers, and get an Error that names the fix
// in a build without them.
#pragma once

#include <memory>

#include "ops/device.h"
#include "zero/communicator.h"
#include "zero/launch_env.h"

namespace dstrain {

// True when this build has the NCCL backend.
bool nccl_backend_built();

// Joins the launcher's group: an NcclCommunicator for rank env.rank of env.world_size on GPU
// `device` (a cuda device; cuda:LOCAL_RANK is the usual choice). Blocks until every rank joined
// or fails after the timeout (zero/nccl_communicator.h). Error for a cpu device (the processes
// have no host transport) and in a build without NCCL.
std::unique_ptr<Communicator> join_launcher_group(const LaunchEnv& env, Device device);

}  // namespace dstrain
