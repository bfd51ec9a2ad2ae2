#include "zero/mpi_process.h"

#include "ops/error.h"

#if DSTRAIN_HAS_MPI
#include <mpi.h>

#include "zero/mpi_communicator.h"
#endif

namespace dstrain {
namespace {

#if DSTRAIN_HAS_MPI
bool started_here = false;  // init_mpi() called MPI_Init_thread: finalize_mpi() ends it

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "an unknown MPI thread level";
  }
}
#else
[[noreturn]] void no_mpi() {
  fail(
      "this dstrain was built without MPI, so it has no mpi backend. Fix: install an MPI (Debian: libopenmpi-dev openmpi-bin; "
      "scripts/setup.sh does) and configure again, or run the ranks as threads of one process with --num-ranks N");
}
#endif

}  // namespace

bool mpi_backend_built() {
#if DSTRAIN_HAS_MPI
  return true;
#else
  return false;
#endif
}

bool mpi_active() {
#if DSTRAIN_HAS_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
#else
  return false;
#endif
}

MpiWorld init_mpi() {
#if DSTRAIN_HAS_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  DSTRAIN_CHECK(!finalized, "MPI was finalized in this process and cannot start again: one process runs one MPI job. Fix: start a new process");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    const int status = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    DSTRAIN_CHECK(status == MPI_SUCCESS,
                  "MPI_Init_thread failed (status {}). Fix: check the MPI installation (mpirun --version) and that "
                  "the launcher started this process",
                  status);
    started_here = true;
    // Errors come back as status codes, which the MPI backend turns into Errors: the library
    // never lets MPI end the process.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);
  }
  MpiWorld world;
  MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world.world_size);
  world.threads_serialized = provided >= MPI_THREAD_SERIALIZED;
  world.thread_level = thread_level_name(provided);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(version, &length) == MPI_SUCCESS) {
    world.library.assign(version, static_cast<std::size_t>(length));
    world.library = world.library.substr(0, world.library.find_first_of("\n,"));
  }
  return world;
#else
  no_mpi();
#endif
}

std::unique_ptr<Communicator> join_mpi_world(std::chrono::milliseconds timeout) {
#if DSTRAIN_HAS_MPI
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout);
#else
  (void)timeout;
  no_mpi();
#endif
}

void finalize_mpi() noexcept {
#if DSTRAIN_HAS_MPI
  if (started_here && mpi_active()) MPI_Finalize();
#endif
}

void abort_mpi_job(int code) noexcept {
#if DSTRAIN_HAS_MPI
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

}  // namespace dstrain
