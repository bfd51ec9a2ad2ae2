// dstrain: the command-line runner. Each subcommand lives in its own file and registers itself here.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

#include "check_config_command.h"
#include "cli_options.h"
#include "consolidate_command.h"
#include "export_command.h"
#include "estimate_memory_command.h"
#include "io_bench_command.h"
#include "prepare_data_command.h"
#include "train_command.h"

namespace {

// libgomp reads OMP_WAIT_POLICY once, when it loads, and by default its idle threads spin. The CPU
// kernels use two thread pools (OpenMP, and Debian's pthread OpenBLAS for sgemm), so spinning
// OpenMP threads steal the cores OpenBLAS computes on: 4-25x slower steps were measured on a shared
// 2-core machine (ops/kernels/README.md). Unless the user chose a policy, run again with "passive"
// before any OpenMP code has started; the cost is a futex wake per parallel region, microseconds
// against milliseconds of work.
// The program is executed again by its real path, not by /proc/self/exe: the kernel names a
// process after the file it executes, and "exe" is what pgrep, top and ps would show.
void prefer_passive_openmp_threads(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  std::vector<char> self(4096);
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0 || static_cast<std::size_t>(n) >= self.size() - 1) return;  // unknown: go on with the default policy
  self[static_cast<std::size_t>(n)] = '\0';
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv(self.data(), argv);  // returns only on failure: then go on with the default policy
}

// " (MPI rank 1 of 4)" when this process is one of several MPI processes: which rank's error it is.
std::string mpi_rank_tag() {
  if (!dstrain::mpi_active()) return {};
  const dstrain::MpiWorld w = dstrain::init_mpi();  // running already: only asks
  return w.world_size > 1 ? " (MPI rank " + std::to_string(w.rank) + " of " + std::to_string(w.world_size) + ")" : std::string();
}

// After an error in one of several MPI processes: the others may wait for this one in a collective
// (until their timeout) or have failed alike; MPI_Abort ends them all now, with a non-zero status
// from the launcher, and leaves no process behind.
void end_mpi_job(int status) {
  if (!dstrain::mpi_active()) return;
  if (dstrain::init_mpi().world_size > 1) {
    std::fflush(stderr);
    std::fflush(stdout);
    dstrain::abort_mpi_job(status);
  }
}

}  // namespace

int main(int argc, char** argv) {
  prefer_passive_openmp_threads(argv);
  // A file size limit (ulimit -f) would otherwise kill the process with SIGXFSZ in the middle of a
  // write, leaving a temporary file; ignored, the write fails with EFBIG and the writer reports it
  // (naming the file and the limit) and removes its temporary file.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"dstrain: train transformer language models from DeepSpeed configs", "dstrain"};
  app.set_version_flag("--version", std::string("dstrain ") + dstrain::kVersion);
  app.require_subcommand(1);
  dstrain::cli::add_check_config_command(app);
  dstrain::add_prepare_data_command(app);
  dstrain::cli::add_train_command(app);
  dstrain::cli::add_consolidate_command(app);
  dstrain::cli::add_export_command(app);
  dstrain::cli::add_io_bench_command(app);
  dstrain::cli::add_estimate_memory_command(app);
  // Under MPI (dstrain train --comm mpi) every process ends MPI before it exits; after an error the
  // whole job ends (ends_job) so that no rank waits for one that failed.
  int status = 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version: CLI11 prints them and succeeds.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    // A command-line mistake is bad input like any other: exit 2, with the option and the fix.
    std::string where = "dstrain";
    for (const CLI::App* sub : app.get_subcommands()) where += " " + sub->get_name();
    const std::optional<std::string> reworded = dstrain::cli::reworded_parse_error(app, e);
    std::fprintf(stderr, "dstrain: error: %s\nRun `%s --help` for the options.\n", reworded ? reworded->c_str() : e.what(), where.c_str());
    return 2;
  } catch (const dstrain::cli::ExitStatus& e) {
    return e.code;  // the command said why on its own lines
  } catch (const dstrain::Error& e) {
    // Invalid input (config, file, value): the message names the cause and the fix.
    std::fprintf(stderr, "dstrain: error%s: %s\n", mpi_rank_tag().c_str(), e.what());
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: internal error (please report it)%s: %s\n", mpi_rank_tag().c_str(), e.what());
    status = 3;
  }
  if (status != 0) end_mpi_job(status);
  dstrain::finalize_mpi();
  return status;
}
