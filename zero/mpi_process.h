// MPI in this process, for callers that include no MPI header (the trainer, the CLI, embedding
// programs): start it, ask its world, join it as a Communicator, and end it. In a build without MPI
// (CMake found none) every function but mpi_backend_built() and mpi_active() throws an Error naming
// the fix. docs/mpi.md says how runs use it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "zero/communicator.h"

namespace dstrain {

// True when this build has the MPI backend (zero/mpi_communicator.h).
bool mpi_backend_built();

// This process's place in MPI_COMM_WORLD.
struct MpiWorld {
  int rank = 0;
  int world_size = 1;
  // The thread level MPI provides; overlap_comm (a worker thread issuing the collectives) needs
  // MPI_THREAD_SERIALIZED or more.
  bool threads_serialized = false;
  std::string thread_level;  // "MPI_THREAD_SERIALIZED", ...
  std::string library;       // MPI_Get_library_version's first line ("Open MPI v4.1.4, ...")
};

// Starts MPI in this process unless it is running already (the program called MPI_Init_thread
// itself): MPI_Init_thread asking for MPI_THREAD_SERIALIZED, MPI_COMM_WORLD's errors returned
// rather than fatal. Idempotent. Error when MPI was finalized, or in a build without MPI.
MpiWorld init_mpi();

// True between init_mpi() (or the program's own MPI_Init) and MPI_Finalize.
bool mpi_active();

// Joins MPI_COMM_WORLD as a Communicator (an MpiCommunicator; init_mpi() first). Collective.
std::unique_ptr<Communicator> join_mpi_world(std::chrono::milliseconds timeout = default_comm_timeout());

// MPI_Finalize, when init_mpi() started MPI and it is still running; a no-op otherwise. Call it
// once at the end of the program, after every communicator is gone. Never throws.
void finalize_mpi() noexcept;

// For a program's top-level error handler only, never the library: ends every process of the job
// (MPI_Abort on MPI_COMM_WORLD with `code`), so that no rank waits for one that failed. Returns
// only when MPI is not running.
void abort_mpi_job(int code) noexcept;

}  // namespace dstrain
