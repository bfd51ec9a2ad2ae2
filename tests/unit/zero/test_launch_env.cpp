// LaunchEnv: each launcher's variable set, precedence between launchers, and the error cases.
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "zero/launch_env.h"

using namespace dstrain;
using ::testing::HasSubstr;

namespace {

LaunchEnv detect(const std::map<std::string, std::string>& vars) {
  return detect_launch_env([&](std::string_view name) -> std::optional<std::string> {
    const auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    detect(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(LaunchEnv, NoLauncherIsOneProcess) {
  const LaunchEnv e = detect({});
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.master_addr, "");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, Torchrun) {
  const LaunchEnv e = detect(
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29611"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 29611);
  EXPECT_EQ(e.note, "");
  EXPECT_EQ(e.str(), "rank 5 of 8 (local rank 1) via torchrun, master 10.1.2.3:29611");
}

TEST(LaunchEnv, TorchrunWithoutLocalRankAssumesOneNode) {
  const LaunchEnv e = detect({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}});
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_THAT(e.note, HasSubstr("LOCAL_RANK is not set"));
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, Mpirun) {
  const LaunchEnv e = detect({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "6"}});
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 16);
  EXPECT_EQ(e.local_rank, 6);
  EXPECT_EQ(e.master_addr, "");  // mpirun says nothing about rank 0's address
  const LaunchEnv m = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                              {"MASTER_ADDR", "node7"},
                              {"MASTER_PORT", "1234"}});
  EXPECT_EQ(m.master_addr, "node7");
  EXPECT_EQ(m.master_port, 1234);
}

// MPICH's and Intel MPI's mpiexec (Hydra): PMI_RANK / PMI_SIZE / MPI_LOCALRANKID. Without this
// entry each process was rank 0 of 1. Inside a Slurm allocation Hydra's ranks also carry their
// proxy's SLURM_PROCID, which must not win; PMI_RANK without PMI_SIZE (srun --mpi=pmi2) is srun's.
TEST(LaunchEnv, MpiexecOfMpichAndIntelMpi) {
  const LaunchEnv e = detect({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}});
  EXPECT_EQ(e.launcher, "mpiexec");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  const LaunchEnv in_slurm = detect({{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(in_slurm.launcher, "mpiexec");
  EXPECT_EQ(in_slurm.rank, 5);
  EXPECT_EQ(in_slurm.world_size, 8);
  const LaunchEnv pmi2 = detect({{"PMI_RANK", "1"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(pmi2.launcher, "srun");
  EXPECT_EQ(pmi2.rank, 1);
  EXPECT_THAT(error_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "x"}}), HasSubstr("PMI_SIZE=x"));
}

TEST(LaunchEnv, Srun) {
  const LaunchEnv e = detect({{"SLURM_PROCID", "9"},
                              {"SLURM_NTASKS", "12"},
                              {"SLURM_LOCALID", "1"},
                              {"SLURM_LAUNCH_NODE_IPADDR", "192.168.0.4"},
                              {"SLURM_NODELIST", "gpu[01-03]"}});
  EXPECT_EQ(e.launcher, "srun");
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.world_size, 12);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "192.168.0.4");
  // Without the launch node's address: the first node of the list.
  EXPECT_EQ(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODELIST", "gpu[01-03]"}}).master_addr, "gpu01");
  EXPECT_EQ(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_NODELIST", "a1,b2"}}).master_addr, "a1");
  // MASTER_ADDR wins over what Slurm implies.
  EXPECT_EQ(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "x"}, {"MASTER_ADDR", "y"}}).master_addr, "y");
}

TEST(LaunchEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node[03-05,7],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("node[7,9]"), "node7");
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_EQ(first_slurm_host("rack[1-2]-gpu,x"), "rack1-gpu");
  EXPECT_EQ(first_slurm_host(""), "");
}

TEST(LaunchEnv, TorchrunVariablesTakePrecedence) {
  // srun starting one torchrun per node: SLURM_PROCID is the node, RANK the process.
  const LaunchEnv e = detect({{"RANK", "7"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "3"},
                              {"MASTER_ADDR", "n0"},
                              {"SLURM_PROCID", "1"},
                              {"SLURM_NTASKS", "2"},
                              {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 7);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 3);
  // mpirun before srun.
  const LaunchEnv m = detect({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(m.launcher, "mpirun");
  EXPECT_EQ(m.rank, 2);
}

TEST(LaunchEnv, ErrorsNameTheVariables) {
  EXPECT_THAT(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), HasSubstr("RANK=4 but WORLD_SIZE=4"));
  EXPECT_THAT(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), HasSubstr("RANK=-1 but WORLD_SIZE=4"));
  EXPECT_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "9"}, {"OMPI_COMM_WORLD_SIZE", "8"}}),
              HasSubstr("OMPI_COMM_WORLD_RANK=9 but OMPI_COMM_WORLD_SIZE=8"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}}), HasSubstr("SLURM_PROCID=2 but SLURM_NTASKS=2"));
  EXPECT_THAT(error_of({{"RANK", "0"}}), HasSubstr("RANK=0 is set but WORLD_SIZE is not"));
  EXPECT_THAT(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), HasSubstr("RANK=one (set by torchrun) is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2 "}}), HasSubstr("WORLD_SIZE=2  (set by torchrun) is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), HasSubstr("WORLD_SIZE=0 (set by torchrun): the world size must be at least 1"));
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}), HasSubstr("LOCAL_RANK=2 but WORLD_SIZE=2"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "x"}}),
              HasSubstr("SLURM_LOCALID=x (set by srun) is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}), HasSubstr("MASTER_PORT=70000 is not a TCP port"));
  EXPECT_THAT(error_of({{"MASTER_PORT", "http"}}), HasSubstr("MASTER_PORT=http"));
}

// The local world size (processes on this node) each launcher gives: dstrain train's node layout
// (rank r on node r / local_world_size) when --ranks-per-node is not given.
TEST(LaunchEnv, LocalWorldSizeOfEachLauncher) {
  EXPECT_EQ(detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}}).local_world_size, 4);
  EXPECT_EQ(detect({{"OMPI_COMM_WORLD_RANK", "6"}, {"OMPI_COMM_WORLD_SIZE", "16"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "6"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}})
                .local_world_size,
            8);
  EXPECT_EQ(detect({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}}).local_world_size, 2);
  EXPECT_EQ(detect({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "3"}}).local_world_size, 3);
  // Unset: unknown.
  EXPECT_EQ(detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}}).local_world_size, 0);
  EXPECT_EQ(detect({}).local_world_size, 0);
  // Another launcher's variable does not count: torchrun wins, and its LOCAL_WORLD_SIZE is unset.
  EXPECT_EQ(detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}).local_world_size, 0);
}

TEST(LaunchEnv, SlurmUnevenTasksPerNodeLeavesTheLocalWorldSizeUnknown) {
  const LaunchEnv e = detect({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  EXPECT_EQ(e.local_world_size, 0);
  EXPECT_THAT(e.note, HasSubstr("SLURM_NTASKS_PER_NODE=4(x2)"));
  const LaunchEnv u = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS_PER_NODE", "4,3"}});
  EXPECT_EQ(u.local_world_size, 0);
  EXPECT_THAT(u.note, HasSubstr("SLURM_NTASKS_PER_NODE=4,3"));
}

TEST(LaunchEnv, LocalWorldSizeErrorsNameTheVariables) {
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "two"}}),
              HasSubstr("LOCAL_WORLD_SIZE=two (set by torchrun) is not an integer"));
  EXPECT_THAT(error_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "0"}}),
              HasSubstr("LOCAL_WORLD_SIZE=0 but WORLD_SIZE=4: a local world size must be in 1..4"));
  EXPECT_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "5"}}),
              HasSubstr("OMPI_COMM_WORLD_LOCAL_SIZE=5 but OMPI_COMM_WORLD_SIZE=4"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "x"}}),
              HasSubstr("SLURM_NTASKS_PER_NODE=x (set by srun) is not an integer"));
}
