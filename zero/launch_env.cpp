#include "zero/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

// The variable names one launcher uses.
struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

// MPICH's and Intel MPI's mpiexec (Hydra) come before srun: Hydra starts its proxies with srun
// inside a Slurm allocation, so its ranks inherit the proxy's SLURM_PROCID as well.
constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"mpiexec", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

// A strict decimal integer: the whole value, no sign games, no trailing text ("3 " and "3x" fail).
int parse_int(const char* launcher, const char* var, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  DSTRAIN_CHECK(!value.empty() && errno == 0 && end != value.c_str() && *end == '\0' && v >= std::numeric_limits<int>::min() &&
                    v <= std::numeric_limits<int>::max(),
                "{}={} (set by {}) is not an integer. Fix: the launcher sets it; check that no script overrides it", var,
                value.empty() ? "''" : value, launcher);
  return static_cast<int>(v);
}

}  // namespace

std::string first_slurm_host(std::string_view list) {
  // Cut at the first top-level comma (a comma inside brackets separates ranges, not hosts).
  std::string host;
  std::size_t i = 0;
  for (; i < list.size() && list[i] != ',' && list[i] != '['; ++i) host += list[i];
  if (i < list.size() && list[i] == '[') {
    ++i;
    // The first item of the bracket: "03-05" or "7": its first number, zero padding kept.
    for (; i < list.size() && list[i] != '-' && list[i] != ',' && list[i] != ']'; ++i) host += list[i];
    while (i < list.size() && list[i] != ']') ++i;
    if (i < list.size()) ++i;                                                          // past ']'
    for (; i < list.size() && list[i] != ',' && list[i] != '['; ++i) host += list[i];  // a suffix
  }
  return host;
}

std::string LaunchEnv::str() const {
  return fmt::format("rank {} of {} (local rank {}) via {}, master {}:{}", rank, world_size, local_rank, launcher,
                     master_addr.empty() ? "(unknown)" : master_addr, master_port);
}

LaunchEnv detect_launch_env(const EnvLookup& getenv) {
  LaunchEnv env;
  env.launcher = "none";
  const Launcher* chosen = nullptr;
  for (const Launcher& l : kLaunchers) {
    // PMI_RANK alone (srun --mpi=pmi2 may set it without PMI_SIZE) leaves the choice to srun.
    if (getenv(l.rank) && (std::string_view(l.name) != "mpiexec" || getenv(l.size))) {
      chosen = &l;
      break;
    }
  }

  if (chosen != nullptr) {
    const Launcher& l = *chosen;
    env.launcher = l.name;
    const std::string rank_text = *getenv(l.rank);
    const auto size_text = getenv(l.size);
    DSTRAIN_CHECK(size_text.has_value(),
                  "{}={} is set but {} is not: the world size is unknown. Fix: launch with {} "
                  "(which sets both), or set {} too",
                  l.rank, rank_text, l.size, l.name, l.size);
    env.rank = parse_int(l.name, l.rank, rank_text);
    env.world_size = parse_int(l.name, l.size, *size_text);
    DSTRAIN_CHECK(env.world_size >= 1, "{}={} (set by {}): the world size must be at least 1", l.size, *size_text, l.name);
    DSTRAIN_CHECK(env.rank >= 0 && env.rank < env.world_size,
                  "{}={} but {}={}: the rank must be in 0..{}. Fix: a script probably exported {} for every process; "
                  "let the launcher set it",
                  l.rank, env.rank, l.size, env.world_size, env.world_size - 1, l.rank);
    if (const auto local = getenv(l.local_rank)) {
      env.local_rank = parse_int(l.name, l.local_rank, *local);
      DSTRAIN_CHECK(env.local_rank >= 0 && env.local_rank < env.world_size,
                    "{}={} but {}={}: a local rank must be in 0..{} (it indexes this node's processes)", l.local_rank, env.local_rank, l.size,
                    env.world_size, env.world_size - 1);
    } else {
      env.local_rank = env.world_size == 1 ? 0 : env.rank;
      if (env.world_size > 1) env.note = fmt::format("{} is not set; assuming one node, local rank = {} = {}", l.local_rank, l.rank, env.rank);
    }
    if (const auto local_size = getenv(l.local_size); local_size && !local_size->empty()) {
      const bool slurm_form = std::string_view(l.name) == "srun" && local_size->find_first_not_of("0123456789") != std::string::npos &&
                              local_size->find_first_of("(,") != std::string::npos;
      if (slurm_form) {
        // "4(x2),3": tasks per node differ between nodes; no single local world size.
        const std::string text = fmt::format("{}={} is not one number (nodes run different task counts); the node layout is unknown", l.local_size,
                                             *local_size);
        env.note = env.note.empty() ? text : env.note + "; " + text;
      } else {
        env.local_world_size = parse_int(l.name, l.local_size, *local_size);
        DSTRAIN_CHECK(env.local_world_size >= 1 && env.local_world_size <= env.world_size,
                      "{}={} but {}={}: a local world size must be in 1..{} (this node's processes, at most the world's)", l.local_size,
                      env.local_world_size, l.size, env.world_size, env.world_size);
      }
    }
    if (std::string_view(l.name) == "srun") {
      if (const auto ip = getenv("SLURM_LAUNCH_NODE_IPADDR"); ip && !ip->empty()) {
        env.master_addr = *ip;
      } else if (const auto nodes = getenv("SLURM_NODELIST"); nodes && !nodes->empty()) {
        env.master_addr = first_slurm_host(*nodes);
      } else if (const auto job_nodes = getenv("SLURM_JOB_NODELIST"); job_nodes && !job_nodes->empty()) {
        env.master_addr = first_slurm_host(*job_nodes);
      }
    }
  }

  if (const auto addr = getenv("MASTER_ADDR"); addr && !addr->empty()) env.master_addr = *addr;
  if (const auto port = getenv("MASTER_PORT"); port && !port->empty()) {
    env.master_port = parse_int(chosen != nullptr ? chosen->name : "the user", "MASTER_PORT", *port);
    DSTRAIN_CHECK(env.master_port >= 1 && env.master_port <= 65535, "MASTER_PORT={} is not a TCP port (1..65535)", env.master_port);
  }
  return env;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace dstrain
