// LaunchEnv: who this process is (rank, world size, local rank) and where rank 0 listens (master
// address and port), read from the environment the launcher sets.
//
// Launchers, in order of precedence (the first whose rank variable is set wins, and all of its
// values come from that launcher; nothing is mixed between launchers, so a stale variable of
// another one cannot change the rank):
//   1. torchrun / the deepspeed launcher / torch.distributed.launch:
//        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. LOCAL_RANK unset:
//        0 for a single process, else RANK (one node assumed), said in `note`.
//   2. mpirun (Open MPI): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//      OMPI_COMM_WORLD_LOCAL_SIZE.
//   3. mpiexec (MPICH, Intel MPI: Hydra's PMI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//      MPI_LOCALNRANKS (chosen only when PMI_SIZE is set too; PMI_RANK alone, as srun --mpi=pmi2
//      may leave it, goes on to srun).
//   4. srun (Slurm): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE (only a plain
//      integer: Slurm's uneven form "4(x2),3" leaves local_world_size unknown, said in `note`);
//      master address from
//      SLURM_LAUNCH_NODE_IPADDR, else the first host of SLURM_NODELIST / SLURM_JOB_NODELIST
//      ("node[03-05,7]" -> "node03", "a,b" -> "a").
//   5. none of them: a single process, rank 0 of 1. (PMIx launchers put PMIX_RANK but no world
//      size in the environment; MPI itself tells those processes their place.)
// MASTER_ADDR and MASTER_PORT, when set, override what mpirun/srun imply (they are how a user
// points those launchers at rank 0); without them, mpirun gives no address (empty), srun the node
// above, and the port defaults to 29500 (torch's default).
//
// Errors (dstrain::Error naming the variables and values): a rank variable set without its size
// variable, values that are not integers, world size < 1, rank outside [0, world size), local rank
// outside [0, world size), local world size outside [1, world size], port outside 1..65535.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Processes of this job on this node (the launcher's local world size variable above); 0:
  // unknown. dstrain train puts ranks r on node r / local_world_size (docs/parallelism.md "Nodes").
  int local_world_size = 0;
  std::string master_addr;  // empty: unknown (single process, or mpirun without MASTER_ADDR)
  int master_port = 29500;
  std::string launcher;  // "torchrun", "mpirun", "mpiexec", "srun" or "none"
  std::string note;      // assumptions made (e.g. LOCAL_RANK defaulted), empty if none

  // "rank 3 of 8 (local rank 3) via torchrun, master 10.0.0.1:29500"
  std::string str() const;
};

// Reads the process environment.
LaunchEnv detect_launch_env();

// Same, from `getenv` (returns nullopt for an unset variable): for tests, and for callers that
// carry their own environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
LaunchEnv detect_launch_env(const EnvLookup& getenv);

// First host of a Slurm node list: "node[03-05,7],gpu1" -> "node03"; "a,b" -> "a"; "x" -> "x".
std::string first_slurm_host(std::string_view nodelist);

}  // namespace dstrain
