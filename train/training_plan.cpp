#include "train/training_plan.h"

#include "engine/config_checks.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "data/byte_tokenizer.h"
#include "data/cache_dir.h"
#include "data/data_loader.h"
#include "data/eval_loader.h"
#include "data/gpt2_tokenizer.h"
#include "data/run_files.h"
#include "data/tokenizer.h"
#include "train/flops_report.h"
#include "train/memory_estimate.h"
#include "train/pipeline_plan.h"
#include "train/progress.h"
#include "train/tensor_parallel_plan.h"
#include "train/expert_parallel_plan.h"
#include "engine/expert_parallel.h"
#include "ops/error.h"
#include "ops/kernels/device_backend.h"
#include "formats/hf_weights_file.h"
#include "models/model_registry.h"
#include "zero/launcher_communicator.h"
#include "zero/mpi_process.h"

namespace dstrain {
namespace {

void require_file(const std::filesystem::path& path, const char* option) {
  std::error_code ec;
  if (const auto st = std::filesystem::status(path, ec); std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    // A FIFO, a device or a folder exists: "no such file" would send the user looking for it.
    fail("{} {}: not a regular file ({}); {} reads a file by its size and offsets: give the path of the file itself", option, path.string(),
         std::filesystem::is_directory(st) ? "a folder"
         : std::filesystem::is_fifo(st)    ? "a FIFO"
                                           : "a device or socket",
         option);
  }
  if (!std::filesystem::is_regular_file(path)) {
    const std::string_view o(option);
    fail("{} {}: no such file; {}", option, path.string(),
         o == "--data" || o == "--val-data"
             ? "make token files with `dstrain prepare-data` (scripts/setup.sh makes datasets/brown_train.bin and datasets/brown_val.bin)"
             : "give the path of an existing file");
  }
}

// The values of the options, each on its own (their combinations come later).
void check_option_values(const TrainerOptions& o) {
  if (o.num_ranks < 1) {
    fail("--num-ranks {}: must be >= 1 (the number of data-parallel ranks, run as threads of this process)", o.num_ranks);
  }
  if (o.steps && *o.steps < 0) fail("--steps {}: must be >= 0", *o.steps);
  if (o.warmup_steps && *o.warmup_steps < 1) fail("--warmup-steps {}: must be >= 1", *o.warmup_steps);
  if (o.val_interval < 0) fail("--val-interval {}: must be >= 0 (0: evaluate only at the end)", o.val_interval);
  if (o.val_batches < 0) fail("--val-batches {}: must be >= 0 (0: the whole val file)", o.val_batches);
  if (o.sample_tokens < 0) fail("--sample-tokens {}: must be >= 0 (0: no samples)", o.sample_tokens);
  if (o.sample_top_k < 0) fail("--sample-top-k {}: must be >= 0 (0: the whole vocabulary)", o.sample_top_k);
  // The sampler divides float logits by the temperature: it must be a finite float.
  if (!std::isfinite(o.sample_temperature) || o.sample_temperature < 0.0 || o.sample_temperature > static_cast<double>(FLT_MAX)) {
    fail("--sample-temperature {}: must be a finite number between 0 (greedy) and {:g}; 1 samples the model's own distribution", o.sample_temperature,
         static_cast<double>(FLT_MAX));
  }
  if (!std::isfinite(o.peak_flops) || o.peak_flops < 0.0) {
    fail("--peak-flops {}: must be a finite number of FLOP/s >= 0 (0: measure one GEMM)", o.peak_flops);
  }
  if (o.pipeline_stages < 0)
    fail("--pipeline-stages {}: must be >= 1 (the pipeline's stage count; 0 or unset: the config's pipeline.stages)", o.pipeline_stages);
  for (const std::int64_t s : o.inject_overflow) {
    if (s < 1) fail("--inject-overflow {}: optimizer steps count from 1", s);
  }
  if (!std::isfinite(o.straggler_factor) || o.straggler_factor < 0.0 || (o.straggler_factor > 0.0 && o.straggler_factor <= 1.0)) {
    fail("--straggler-factor {}: must be 0 (no straggler detection) or a number > 1 (a rank slower than the median step time by this factor)",
         o.straggler_factor);
  }
  if (o.straggler_steps < 1) fail("--straggler-steps {}: must be >= 1 (consecutive slow steps before a rank is named)", o.straggler_steps);
  if (o.inject_slow_rank && (o.inject_slow_rank->rank < 0 || o.inject_slow_rank->ms < 0)) {
    fail("--inject-slow-rank {}:{}: the rank and the milliseconds must be >= 0", o.inject_slow_rank->rank, o.inject_slow_rank->ms);
  }
  if (!std::isfinite(o.save_interval_minutes) || o.save_interval_minutes < 0.0) {
    fail("--save-interval-minutes {}: must be a number of minutes > 0", o.save_interval_minutes);
  }
  if (o.save_interval_minutes > 0.0 && o.save_dir.empty()) {
    fail("--save-interval-minutes {:g} needs --save-dir: the checkpoints it asks for go there", o.save_interval_minutes);
  }
}

// The launcher's environment: world size 1 (and launcher "none") when there is none. A process
// started as one of several ranks trains over NCCL (--device cuda) or Gloo (the cpu, when built).
LaunchEnv launcher_env(Device device) {
  LaunchEnv env;
  try {
    env = detect_launch_env();
  } catch (const Error& e) {
    fail(
        "the launcher's environment does not describe a rank ({}); start dstrain train without a launcher (--num-ranks N runs N ranks as "
        "threads of one process), or fix the launcher's variables",
        e.what());
  }
  if (env.world_size > 1 && device.is_cpu() && !gloo_backend_built()) {
    fail(
        "this process was started by a launcher as one of {} ranks ({}), but this dstrain was built without Gloo (Debian: libgloo-dev), "
        "which joins such processes on the cpu; {}give --device cuda (NCCL, one GPU per rank), or start one process without the launcher and "
        "give --num-ranks {}",
        env.world_size, env.str(),
        mpi_backend_built() ? "start the processes with mpirun / mpiexec / srun --mpi=pmix and --comm mpi (or auto), "
                            : "rebuild with MPI (libopenmpi-dev) to train over MPI processes, ",
        env.world_size);
  }
  return env;
}

// A PMIx launcher (prterun, srun --mpi=pmix) sets PMIX_RANK but no world size in the environment
// (zero/launch_env.h): with none of the launchers detect_launch_env knows, each such process would
// train alone as rank 0 of 1.
void refuse_unsized_launcher(const LaunchEnv& env) {
  if (env.launcher != "none") return;
  if (const char* pmix = std::getenv("PMIX_RANK")) {
    fail(
        "PMIX_RANK={} is set: a PMIx launcher (prterun, srun --mpi=pmix) started this process, but its environment gives no world size "
        "(no RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE or SLURM_* variables), so every process would train alone as rank 0 "
        "of 1. Fix: start it with torchrun, mpirun or srun, or export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each "
        "process; on one machine, one process with --num-ranks N",
        pmix);
  }
}

// The variable an MPI launcher sets in every process it starts ("OMPI_COMM_WORLD_SIZE=2"): Open
// MPI's mpirun, Hydra's mpiexec (MPICH, Intel MPI), PMIx launchers (prterun, srun --mpi=pmix);
// empty when none is set.
std::string mpi_launcher_variable() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return fmt::format("{}={}", name, v);
  }
  return {};
}

// --comm: the backend asked for, "auto" resolved (TrainerOptions::comm); `why` says why auto chose it.
std::string resolve_comm(const TrainerOptions& o, const Device& device, std::string& why) {
  const std::string& c = o.comm;
  if (c != "auto" && c != "local" && c != "mpi" && c != "gloo" && c != "nccl") {
    fail(
        "--comm {}: must be auto, local (--num-ranks threads of this process), mpi (the processes mpirun starts), gloo (the processes "
        "torchrun or srun starts, on the cpu) or nccl (a GPU per process)",
        c.empty() ? "''" : c);
  }
  if (c != "auto") {
    why = fmt::format("--comm {}", c);
    return c;
  }
  const std::string mpi_variable = mpi_launcher_variable();
  if (device.is_cpu() && !mpi_variable.empty() && o.num_ranks == 1 && mpi_backend_built()) {
    why = fmt::format("auto: an MPI launcher started this process ({}) on the cpu", mpi_variable);
    return "mpi";
  }
  why = "auto";
  return device.is_cuda() ? "nccl" : "local";  // nccl only under a launcher, local becomes gloo under one (plan_training)
}

// --ranks-per-node N: N >= 1 dividing the world (0: not given).
void check_ranks_per_node(std::int64_t n, int world) {
  if (n == 0 || (n >= 1 && world % n == 0)) return;
  std::string divisors;
  for (int d = 1; d <= world; ++d)
    if (world % d == 0) divisors += fmt::format("{}{}", divisors.empty() ? "" : ", ", d);
  fail("--ranks-per-node {}: {}; the world has {} rank{}, so give one of its divisors: {}", n,
       n < 1 ? "must be >= 1 (the ranks on each node)" : "does not divide the world size (every node must hold the same number of ranks)", world,
       world == 1 ? "" : "s", divisors);
}

// --comm mpi: this process is one rank of MPI_COMM_WORLD, whose rank and size MPI itself gives
// (after MPI_Init_thread); the launcher's variables only have to agree with them.
void plan_mpi_world(TrainingPlan& plan, const TrainerOptions& options) {
  if (options.num_ranks > 1) {
    fail("--comm mpi with --num-ranks {}: the MPI processes are the ranks; drop --num-ranks and start that many processes (mpirun -np {})",
         options.num_ranks, options.num_ranks);
  }
  if (!plan.device.is_cpu()) {
    fail("--comm mpi with --device {}: the MPI backend communicates host memory; give --device cpu, or --comm nccl for a GPU per process",
         plan.device.str());
  }
  LaunchEnv env;
  try {
    env = detect_launch_env();
  } catch (const Error&) {
    env = LaunchEnv{};  // MPI itself is the truth about the world; a malformed variable of another launcher does not matter
    env.launcher = "none";
  }
  // Read before MPI starts: a singleton Open MPI sets PMIX_RANK itself.
  const char* pmix_variable = std::getenv("PMIX_RANK");
  const std::optional<std::string> pmix_rank = pmix_variable != nullptr ? std::optional<std::string>(pmix_variable) : std::nullopt;
  plan.mpi = init_mpi();
  const char* fix =
      "under srun give --mpi=pmix or --mpi=pmi2; otherwise start dstrain with the mpirun / mpiexec of the MPI it was built "
      "with, or start one process without a launcher and give --num-ranks {} to run the ranks as threads";
  if (env.launcher != "none" && env.world_size != plan.mpi.world_size) {
    fail(
        "{} says this process is one of {} ranks, but MPI_COMM_WORLD has {} process{}: MPI did not get the launcher's world, and each "
        "process would train alone. Fix: {}",
        env.str(), env.world_size, plan.mpi.world_size, plan.mpi.world_size == 1 ? "" : "es", fmt::format(fmt::runtime(fix), env.world_size));
  }
  // A PMIx launcher gives no world size in the environment, but its rank must be MPI's.
  if (pmix_rank && *pmix_rank != std::to_string(plan.mpi.rank)) {
    fail(
        "PMIX_RANK={} is set, but MPI says this process is rank {} of {}: MPI did not get the PMIx launcher's world, and each process "
        "would train alone. Fix: {}",
        *pmix_rank, plan.mpi.rank, plan.mpi.world_size, fmt::format(fmt::runtime(fix), "N"));
  }
  plan.launch = env;
  plan.launch.rank = plan.mpi.rank;
  plan.launch.world_size = plan.mpi.world_size;
  if (env.launcher == "none") plan.launch.local_rank = 0;
  plan.world = plan.mpi.world_size;
}

// DeepSpeed's launcher appends --local_rank=N to the command and sets LOCAL_RANK=N: they must agree.
void check_local_rank_argument(const LaunchEnv& env, const std::optional<std::int64_t>& local_rank) {
  if (!local_rank) return;
  if (env.launcher == "none" && *local_rank != 0) {
    fail(
        "--local_rank={} is given but no launcher's environment is set (RANK and WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, "
        "SLURM_*): start dstrain through the launcher, or drop --local_rank",
        *local_rank);
  }
  if (env.launcher != "none" && *local_rank != env.local_rank) {
    fail(
        "--local_rank={} but the launcher's environment says local rank {} ({}): they must name the same rank; drop --local_rank or fix "
        "the launcher's variables",
        *local_rank, env.local_rank, env.str());
  }
}

// The Hugging Face config.json a model spec reads (empty for a family's own "<family>:" specs).
std::filesystem::path model_config_file(const std::string& spec) {
  if (const std::size_t colon = spec.find(':'); colon != std::string::npos) {
    for (const auto& f : model_families())
      if (spec.compare(0, colon, f->name()) == 0) return {};
  }
  const std::filesystem::path p(spec);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return p / "config.json";
  return p;
}

// A parameter count: grouped digits, or 3 significant digits when it is astronomical.
std::string parameter_figure(double value) { return value < 1e15 ? format_count(value) : fmt::format("{:.3g}", value); }

// Refuses a model that cannot fit before any layer is built (train/memory_estimate.h): on the
// cpu against what this process may still allocate, for every rank it runs; on a GPU against a
// bound no device reaches (the allocator reports a real shortage at the first allocation).
// offload_optimizer "nvme" at stage 3 keeps buffer_count sub-groups of every fp32 state in host
// memory; with DeepSpeed's default sub_group_size (1e9) that is 12 GB per buffer for Adam, so these
// buffers are often what does not fit (docs/offload.md §10.2, §11). `budget`: the bytes per rank left
// for them by everything else; the advice names the largest sub_group_size that fits, if any.
std::string nvme_optimizer_buffers_advice(const MemoryEstimate& e, const config::DsConfig& cfg, double budget) {
  if (e.optimizer_buffers <= 0.0 || e.optimizer_host <= 0.0) return "";
  const auto& z = cfg.zero_optimization;
  std::string advice = fmt::format(
      "; the NVMe optimizer store's host buffers take {} of it: zero_optimization.offload_optimizer.buffer_count {} buffers, each one sub-group "
      "of {} elements (zero_optimization.sub_group_size {}) x {:g} B of fp32 master and optimizer states — lower zero_optimization.sub_group_size",
      format_estimate_bytes(e.optimizer_host), z.offload_optimizer->buffer_count, parameter_figure(e.optimizer_buffer_elements), z.sub_group_size,
      e.optimizer_bytes_per_element);
  const double fits = budget / (e.optimizer_buffers * e.optimizer_bytes_per_element);
  if (fits >= 16.0) {
    // One significant digit, rounded down: a value a config would carry (5e7 rather than 53687091).
    const double scale = std::pow(10.0, std::floor(std::log10(fits)));
    advice += fmt::format(" (to {:.0f} or less: what fits beside the rest)", std::floor(fits / scale) * scale);
  }
  return advice + " or zero_optimization.offload_optimizer.buffer_count";
}

}  // namespace

void check_plan_memory(const TrainingPlan& plan, int ranks_here, const std::optional<HostMemoryLimit>& limit) {
  const std::string& model_spec = plan.model_spec;
  const MeshShape& m = plan.mesh;
  MemoryEstimate e;
  double needed = 0.0;
  std::string pieces;
  if (m.pp > 1 && plan.stage_parts.size() >= 2) {
    // With a pipeline a rank holds its stage's layers (train/memory_estimate.h
    // estimate_pipeline_stage_memory): the figures are the heaviest stage's rank; a process that runs
    // every rank of the world needs every stage's.
    std::vector<double> experts;
    const std::vector<double> params = pipeline_stage_parameters(*plan.model, plan.config, plan.stage_parts, m.pp, &experts);
    const bool gpipe = plan.pipeline_schedule == "gpipe";
    double all_stages = 0.0;
    int heaviest = 0;
    for (int s = 0; s < m.pp; ++s) {
      const MemoryEstimate stage = estimate_pipeline_stage_memory(*plan.model, plan.config, plan.sequence_length, params, s, gpipe, experts);
      all_stages += stage.per_rank() * static_cast<double>(m.stage_size());
      if (s == 0 || stage.per_rank() > e.per_rank()) {
        e = stage;
        heaviest = s;
      }
    }
    needed = ranks_here >= plan.world ? all_stages : e.per_rank() * static_cast<double>(ranks_here);
    pieces = fmt::format(" ({} in pipeline stage {} of {}, the heaviest rank{}{})", parameter_figure(e.rank_parameters), heaviest, m.pp,
                         m.tp > 1 ? ", its tensor-parallel pieces" : "", m.ep > 1 ? fmt::format(", its 1/{} of the experts", m.ep) : "");
  } else {
    e = estimate_rank_memory(*plan.model, plan.config, plan.sequence_length);
    needed = e.per_rank() * static_cast<double>(ranks_here);
    // Under tensor, sequence or expert parallelism the figures are one rank's of the mesh: its pieces
    // of the parameters and its experts, its tokens' logits, ZeRO over its data group (the experts
    // over its expert-data group).
    if (m.ep > 1)
      pieces = fmt::format(" ({} on rank 0{}: its 1/{} of the experts, {}, ZeRO-partitioned over the {} ranks holding the same experts)",
                           parameter_figure(e.rank_parameters), m.tp > 1 ? ", its tensor-parallel pieces" : "", m.ep,
                           parameter_figure(e.expert_parameters), e.expert_zero_ranks);
    else if (e.rank_parameters != e.parameters)
      pieces = fmt::format(" ({} on tensor-parallel rank 0: its pieces of the cut ones and the replicated ones whole)",
                           parameter_figure(e.rank_parameters));
  }
  const std::string mesh = m.tp > 1 || m.sp > 1 || m.pp > 1 || m.ep > 1 ? fmt::format(" of the mesh ({})", describe_mesh(m)) : "";
  const std::string figures =
      fmt::format("{} parameters{}; per rank{} at least params {} + grads {} + optimizer {} + activations {} = {}{}", parameter_figure(e.parameters),
                  pieces, mesh, format_estimate_bytes(e.params_device + e.params_host), format_estimate_bytes(e.grads),
                  format_estimate_bytes(e.optimizer_device + e.optimizer_host), format_estimate_bytes(e.activations),
                  format_estimate_bytes(e.per_rank()),
                  ranks_here <= 1 ? std::string()
                  : m.pp > 1 && ranks_here >= plan.world
                      ? fmt::format(", the {} ranks of all {} stages in this process = {}", ranks_here, m.pp, format_estimate_bytes(needed))
                      : fmt::format(", x {} ranks in this process = {}", ranks_here, format_estimate_bytes(needed)));
  // Offload (docs/offload.md §11): what is in host memory instead of the device, and in swap files.
  const std::string offloaded = e.host() > 0.0 || e.params_nvme + e.optimizer_nvme > 0.0
                                    ? fmt::format(" (of it offloaded to host memory: {}; in swap files, in no memory: {})",
                                                  format_estimate_bytes(e.host()), format_estimate_bytes(e.params_nvme + e.optimizer_nvme))
                                    : "";
  const char* fix =
      "give a smaller model (--model), a smaller micro-batch or sequence length, or partition the model states with a higher ZeRO "
      "stage";
  if (plan.device.is_cpu()) {
    if (limit && needed > limit->bytes) {
      const double budget = limit->bytes / static_cast<double>(ranks_here) - (e.per_rank() - e.optimizer_host);
      fail("the model {} does not fit in memory: {}{}, but {} is available ({}){}; {}", model_spec, figures, offloaded,
           format_estimate_bytes(limit->bytes), limit->source, nvme_optimizer_buffers_advice(e, plan.config, budget), fix);
    }
  } else {
    if (e.device() > 0x1p50) {  // 1 PiB
      fail("the model {} does not fit on any GPU: {}{}; {}", model_spec, figures, offloaded, fix);
    }
    // What offload puts in host memory must fit there, for every rank of this process.
    if (limit && e.host() * static_cast<double>(ranks_here) > limit->bytes) {
      const double budget = limit->bytes / static_cast<double>(ranks_here) - (e.host() - e.optimizer_host);
      fail(
          "the model {} does not fit in host memory with this offload: {}{}, but {} is available ({}){}; use offload_optimizer / "
          "offload_param device \"nvme\", or {}",
          model_spec, figures, offloaded, format_estimate_bytes(limit->bytes), limit->source, nvme_optimizer_buffers_advice(e, plan.config, budget),
          fix);
    }
  }
}

namespace {

// flops_profiler prints its profile at the step numbered profile_step; a step the run never takes
// (beyond --steps, or before the step a resumed run starts after) would print nothing without a word.
std::optional<std::string> unreached_profile_step(const TrainingPlan& plan) {
  const config::FlopsProfilerConfig& fp = plan.config.flops_profiler;
  if (!fp.enabled) return std::nullopt;
  const std::int64_t first = plan.resume ? plan.resume->global_steps + 1 : 1;
  const std::string steps = plan.steps_from_epoch ? fmt::format("one pass over --data: {} steps", plan.steps) : fmt::format("--steps {}", plan.steps);
  if (fp.profile_step > plan.steps) {
    return fmt::format(
        "flops_profiler.profile_step is {} but the run ends after step {} ({}): no flops profile is printed; set profile_step to at most {}, or "
        "train for more steps",
        fp.profile_step, plan.steps, steps, plan.steps);
  }
  if (fp.profile_step < first) {
    return fmt::format("flops_profiler.profile_step is {} but the run {}: no flops profile is printed; set profile_step to a step from {} to {}",
                       fp.profile_step, first == 1 ? "starts at step 1" : fmt::format("resumes after step {} (--resume)", first - 1), first,
                       plan.steps);
  }
  return std::nullopt;
}

// The bytes each output will write, against the free space of its file system and the file size
// limit (data/run_files.h), now rather than when the run ends: the checkpoints under --save-dir
// (as many as are kept at once), the --save-weights file (every parameter in fp32, the layout
// --save-weights writes), the summary JSON. Lower bounds: the writers still check every write.
void check_outputs_have_room(const TrainingPlan& plan, const TrainerOptions& options) {
  const Architecture& g = *plan.model;
  const auto folder_of = [](const std::filesystem::path& p) { return p.has_parent_path() ? p.parent_path() : std::filesystem::path("."); };
  std::vector<OutputSize> sizes;
  if (!options.save_dir.empty()) {
    const std::int64_t from = plan.resume ? plan.resume->global_steps : 0;
    const CheckpointSpace c = checkpoint_space(options, g, plan.config, plan.world, from, plan.steps);
    sizes.push_back({{options.save_dir, "--save-dir", true},
                     options.save_dir,
                     c.bytes,
                     c.largest_file,
                     fmt::format("{} checkpoint{} of {} kept at once, of the {} this run saves", c.at_once, c.at_once == 1 ? "" : "s",
                                 format_output_bytes(c.bytes_each), c.saves)});
  }
  if (!options.save_weights.empty()) {
    // One file holds at least the largest tensor (a family may shard the rest); the embedding's
    // padded rows are not written.
    double largest = 0.0;
    for (const auto& layer : g.make_layers()) {
      for (const ParamSpec& ps : layer->params()) {
        if (ps.tied()) continue;
        double n = static_cast<double>(ps.shape.numel());
        if (ps.shape.rank > 0 && ps.shape[0] == g.padded_vocab_size())
          n = n / static_cast<double>(g.padded_vocab_size()) * static_cast<double>(g.vocab_size());
        largest = std::max(largest, n * 4.0);
      }
    }
    const double bytes = g.parameter_count() * 4.0;
    sizes.push_back({{options.save_weights, "--save-weights"},
                     folder_of(options.save_weights),
                     bytes,
                     std::min(bytes, largest),
                     fmt::format("{} parameters in fp32", parameter_figure(g.parameter_count()))});
  }
  if (!options.summary_json.empty()) {
    constexpr double kSummaryBytes = 256.0;  // the smallest summary a run writes is larger
    sizes.push_back({{options.summary_json, "--summary-json"}, folder_of(options.summary_json), kSummaryBytes, kSummaryBytes, "the run's figures"});
  }
  check_outputs_fit(sizes);
}

}  // namespace

void trainer_print(const TrainerOptions& options, std::string_view line) {
  if (options.print) {
    options.print(line);
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void trainer_warn(const TrainerOptions& options, std::string_view text) {
  if (options.warn) {
    options.warn(text);
    return;
  }
  std::fprintf(stderr, "warning: %.*s\n", static_cast<int>(text.size()), text.data());
}

// What the mesh asks of the run, refused before step 1 naming the key: the model's split across the
// tensor-parallel ranks, and what does not compose with tensor or sequence parallelism yet.
void check_mesh_trains(const TrainingPlan& plan, const TrainerOptions& options) {
  const MeshShape& m = plan.mesh;
  if (m.ep > 1) {
    // Expert parallelism: the experts divide by EP (DeepSpeed's validate_autoep_post_detection), and
    // the optimizer and the groups' backend can train them (engine/expert_parallel.h).
    plan.model->check_expert_parallel(m.ep);
    check_expert_parallel_engine(plan.config, plan.device, m.ep, plan.comm);
  }
  if (m.tp <= 1 && m.sp <= 1) return;
  if (m.tp > 1) {
    plan.model->check_tensor_parallel(m.tp);
    // The config's AutoTP rules (preset_model, partition_config) against the model's own cut.
    const std::vector<std::string> lines = check_tensor_parallel_partition(plan.config.tensor_parallel, *plan.model, m.tp);
    if (plan.launch.rank == 0)
      for (const std::string& line : lines) trainer_print(options, line);
  }
  check_tensor_parallel_engine(plan.config, plan.device, m.tp, plan.comm);
  if (m.sp > 1) {
    plan.model->check_sequence_parallel(m.sp, m.tp);
    if (plan.sequence_length % m.sp != 0) {
      fail("sequence_parallel_size {}: the sequence length {} does not divide by it (each sequence-parallel rank holds T / {} tokens); give "
           "--sequence-length {}",
           m.sp, plan.sequence_length, m.sp, plan.sequence_length / m.sp * m.sp > 0 ? plan.sequence_length / m.sp * m.sp : m.sp);
    }
    check_sequence_parallel_engine(plan.device, m.sp, plan.comm);
  }
}

TrainingPlan plan_training(const ConfigText& config_text, const std::string& model_spec, const TrainerOptions& options) {
  TrainingPlan plan;
  plan.model_spec = model_spec;
  check_option_values(options);

  // ---- the world: --device, the launcher ("cuda" alone means the launcher's local rank: cuda:0
  // without a launcher, and when the launcher shows each process only its own GPU) ----
  plan.device = parse_device(options.device);
  const bool explicit_ordinal = options.device.find(':') != std::string::npos;
  std::string why;
  plan.comm = resolve_comm(options, plan.device, why);
  if (plan.comm == "mpi") {
    plan_mpi_world(plan, options);
    check_local_rank_argument(plan.launch, options.local_rank);
    plan.comm_note = fmt::format("comm: mpi, {} process{} of MPI_COMM_WORLD, this one rank {} ({}; {}; {})", plan.world, plan.world == 1 ? "" : "es",
                                 plan.launch.rank, why, plan.mpi.library.empty() ? std::string("MPI") : plan.mpi.library, plan.mpi.thread_level);
  } else {
    if (plan.comm == "nccl" && !plan.device.is_cuda()) {
      fail("--comm nccl with --device {}: NCCL communicates GPU memory; give --device cuda, or --comm gloo / mpi / local on the cpu", plan.device.str());
    }
    if (plan.comm == "gloo" && !plan.device.is_cpu()) {
      fail("--comm gloo with --device {}: the Gloo backend communicates host memory; give --device cpu, or --comm nccl for a GPU per process",
           plan.device.str());
    }
    if (plan.comm == "gloo" && !gloo_backend_built()) {
      fail("--comm gloo: this dstrain was built without Gloo; install it (Debian: libgloo-dev) and rebuild, or use --comm mpi under mpirun");
    }
    plan.launch = launcher_env(plan.device);
    refuse_unsized_launcher(plan.launch);
    check_local_rank_argument(plan.launch, options.local_rank);
    if (plan.device.is_cuda() && !explicit_ordinal) plan.device = launcher_device(plan.launch);
    // A launcher with a GPU per process: NCCL over its ranks (also at world size 1); --comm nccl asks
    // for it without a launcher too (a group of one). On the cpu: Gloo over a launcher's processes
    // (auto, from world size 2), or when --comm gloo asks for it.
    plan.launcher_group = plan.device.is_cuda() ? plan.comm == "nccl" && (options.comm == "nccl" || plan.launch.launcher != "none")
                                                : plan.comm == "gloo" || (options.comm == "auto" && plan.launch.world_size > 1);
    if (plan.launcher_group && plan.device.is_cpu()) plan.comm = "gloo";
    if (plan.comm == "local" && plan.launch.world_size > 1) {
      fail(
          "--comm local but a launcher started this process as one of {} ranks ({}): each process would train alone; drop --comm local, "
          "or start one process with --num-ranks {}",
          plan.launch.world_size, plan.launch.str(), plan.launch.world_size);
    }
    if (!plan.launcher_group) plan.comm = "local";
    if (plan.launcher_group && options.num_ranks > 1) {
      fail("--num-ranks {} with a launcher ({}): the launcher's processes are the ranks; drop --num-ranks", options.num_ranks, plan.launch.str());
    }
    plan.world = plan.launcher_group ? plan.launch.world_size : static_cast<int>(options.num_ranks);
    plan.comm_note = plan.launcher_group ? fmt::format("comm: {}, {} process{}, this one rank {} on {} ({})", plan.comm, plan.world,
                                                       plan.world == 1 ? "" : "es", plan.launch.rank, plan.device.str(), plan.launch.str())
                     : plan.world > 1    ? fmt::format("comm: local, {} ranks as threads of this process (--num-ranks)", plan.world)
                                         : std::string("comm: none (1 rank)");
  }
  check_ranks_per_node(options.ranks_per_node, plan.world);
  const bool lead_process = plan.launch.rank == 0;  // prints the config's warnings and resolved values

  // ---- the inputs exist, the outputs spare them and can be written ----
  require_file(options.data, "--data");
  if (!options.val_data.empty()) require_file(options.val_data, "--val-data");
  // A folder stands for the checkpoint it holds (a Hugging Face model folder); its file is what must exist.
  const std::filesystem::path init_file = options.init_from.empty() ? options.init_from : hf_weights_file(options.init_from, "--init-from");
  if (!init_file.empty()) require_file(init_file, "--init-from");
  std::vector<RunFile> inputs{{options.data, "--data"},
                              {options.val_data, "--val-data"},
                              {init_file, "--init-from"},
                              {config_text.file, "the config file"},
                              {model_config_file(model_spec), "the model config (--model)"}};
  // The folders the run reads from: the model's when --model names one (a Hugging Face checkpoint
  // folder holds its weights beside config.json) and the checkpoints --resume continues; and the
  // one it saves into. No
  // output file may lie inside them: --save-weights W/latest would replace the checkpoint being
  // resumed, --summary-json X/latest the `latest` just committed under --save-dir X.
  if (std::error_code ec; std::filesystem::is_directory(model_spec, ec)) inputs.push_back({model_spec, "the model's folder (--model)", true});
  const std::string resume_dir = options.resume == "auto" ? options.save_dir.string() : options.resume;
  if (!resume_dir.empty()) inputs.push_back({resume_dir, "the checkpoints resumed (--resume)", true});
  if (!options.resume_deepspeed.empty()) inputs.push_back({options.resume_deepspeed, "the DeepSpeed checkpoint resumed (--resume-deepspeed)", true});
  std::vector<RunFile> outputs{
      {options.save_weights, "--save-weights"}, {options.summary_json, "--summary-json"}, {options.log_samples, "--log-samples"}};
  if (!options.save_dir.empty()) outputs.push_back({options.save_dir, "--save-dir", true});

  // ---- the model's shape, before the config: its hidden size fills the ZeRO bucket sizes' "auto" ----
  // (The model as the spec gives it; the config's expert_parallel routing may replace plan.model
  // below with a copy of other routing settings, of the same shape.)
  const std::shared_ptr<const Architecture> spec_model = model_architecture(model_spec);
  plan.model = spec_model;
  const Architecture& g = *spec_model;

  // ---- config: resolved for the world size (train_batch_size = micro x GAS x world); --steps
  // fills "auto" total_num_steps of a scheduler, --warmup-steps its warmup_num_steps, the model's
  // n_embd the hidden size (as the HF integration reads model.config.hidden_size) ----
  config::ConfigOptions config_options;
  config_options.world_size = plan.world;
  config_options.autos = options.autos;
  if (!config_options.autos.total_num_steps) config_options.autos.total_num_steps = options.steps;
  if (!config_options.autos.warmup_num_steps) config_options.autos.warmup_num_steps = options.warmup_steps;
  if (!config_options.autos.hidden_size) {
    config_options.autos.hidden_size = g.n_embd();
    config_options.autos.hidden_size_from_model = true;  // no --hidden-size to warn about when nothing uses it
  }
  // The optimizer: the program's, else the config's block, else the HF Trainer's default AdamW.
  config_options.client_optimizer = options.optimizer;
  // The stage count a program gives PipelineModule(num_stages=...): it replaces pipeline.stages.
  if (options.pipeline_stages > 0) config_options.pipeline_stages = options.pipeline_stages;
  const bool config_has_optimizer =
      config_text.tree.is_object() && config_text.tree.contains("optimizer") && !config_text.tree["optimizer"].is_null();
  if (!options.optimizer && !config_has_optimizer) config_options.default_optimizer = config::default_optimizer_block(config_options.autos);
  plan.config = config::parse_ds_config(config_text.tree, config_options);
  if (lead_process) {
    for (const config::Warning& w : plan.config.warnings) trainer_warn(options, fmt::format("{}{}{}", w.path, w.path.empty() ? "" : ": ", w.message));
    for (const std::string& r : plan.config.resolved_autos) trainer_print(options, fmt::format("auto: {}", r));
  }
  const config::DsConfig& cfg = plan.config;
  {
    // AutoEP's routing keys are the model's routing from here on (train/expert_parallel_plan.h).
    ExpertParallelPlan ep = plan_expert_parallel(plan.model, cfg.expert_parallel);
    plan.model = std::move(ep.model);
    if (lead_process)
      for (const std::string& line : ep.lines) trainer_print(options, line);
  }
  if (lead_process && cfg.optimizer_source == config::OptimizerSource::default_adamw) {
    const config::OptimizerParams& p = cfg.optimizer.params;
    trainer_print(options, fmt::format("optimizer: the config has no \"optimizer\" block, so AdamW with the Hugging Face Trainer's defaults: lr {} "
                                       "betas ({}, {}) eps {} weight_decay {} (--lr, --adam-beta1, --adam-beta2, --adam-eps, --weight-decay)",
                                       p.lr, p.betas.first, p.betas.second, p.eps, p.weight_decay));
  } else if (lead_process && cfg.optimizer_source == config::OptimizerSource::client) {
    trainer_print(options, fmt::format("optimizer: the program's own, {} (in place of the config's block, if any)", cfg.optimizer.type));
  }
  // overlap_comm issues the collectives from a worker thread (zero/comm_queue.h): MPI must allow
  // calls from any one thread at a time.
  if (plan.comm == "mpi" && cfg.zero_optimization.overlap_comm && !plan.mpi.threads_serialized) {
    fail(
        "zero_optimization.overlap_comm is true, which issues the collectives from a worker thread, but this MPI provides only {} "
        "(MPI_THREAD_SERIALIZED is needed); set \"overlap_comm\": false, or use an MPI built with thread support",
        plan.mpi.thread_level);
  }
  if (cfg.flops_profiler.enabled && cfg.flops_profiler.output_file && !cfg.flops_profiler.output_file->empty()) {
    outputs.push_back({*cfg.flops_profiler.output_file, "flops_profiler.output_file"});
  }
  check_outputs_spare_inputs(inputs, outputs);
  for (const RunFile& out : outputs) {
    // The --save-dir is a folder the checkpoint writer creates and checks itself (free space, links).
    if (!out.path.empty() && !out.folder) prove_writable(out);
  }

  // ---- the device mesh: the pipeline stages and the config's tensor- and sequence-parallel sizes
  // over the world (the config resolver has refused a stage count that does not divide it, naming
  // --pipeline-stages or pipeline.stages) ----
  plan.mesh = make_mesh_shape(plan.world, static_cast<int>(cfg.tensor_parallel_size), static_cast<int>(cfg.sequence_parallel_world_size),
                              static_cast<int>(cfg.pipeline_parallel_size), cfg.expert_parallel.ep_size());

  // ---- checkpoints: the save folder writable, the checkpoint to resume from found and of this
  // model (train/trainer_checkpoints.h) ----
  plan.resume = plan_resume(options, *plan.model, cfg);
  if (plan.resume) {
    // The same global batch at any world size (docs/elastic.md): elasticity's arithmetic, or GAS
    // following a fixed train_batch_size, keeps it; a config of micro-batch and GAS alone does not.
    const auto given = config_text.tree.find("train_batch_size");
    check_resume_batch(*plan.resume, cfg, plan.mesh.dp, plan.world / plan.mesh.dp,
                       given != config_text.tree.end() && given->is_number_integer());
  }

  // ---- the sequence length, the tokenizer, the memory the run needs ----
  const std::int64_t T = options.sequence_length ? *options.sequence_length : std::min<std::int64_t>(g.n_positions(), 1024);
  if (T < 1 || T > g.n_positions()) {
    fail("--sequence-length {}: must be between 1 and the model's {} = {} (give a model with more positions, e.g. a -T<n> descriptor)", T,
         g.n_positions_key(), g.n_positions());
  }
  g.check_sequence(T, plan.device);  // e.g. a sliding window the device's kernels do not compute is refused, naming the key
  plan.sequence_length = T;
  check_mesh_trains(plan, options);
  // ---- the pipeline: the schedule, the layers of each stage (train/pipeline_plan.h) ----
  for (const std::string& w : plan_pipeline(plan, options))
    if (lead_process) trainer_warn(options, w);
  if (lead_process)
    for (const std::string& line : describe_pipeline_partition(plan)) trainer_print(options, line);
  if (!options.tokenizer.empty()) {
    // gpt2 and bytes need no files for their size; a tokenizer.json is loaded (an unknown name fails
    // there, listing the accepted ones).
    const std::int64_t tv = options.tokenizer == "gpt2"    ? Gpt2Tokenizer::kVocabSize
                            : options.tokenizer == "bytes" ? ByteTokenizer().vocab_size()
                                                           : make_tokenizer(options.tokenizer, resolve_cache_dir())->vocab_size();
    if (g.vocab_size() < tv) {
      fail("--tokenizer {} has {} tokens but the model {} has a vocabulary of {}; give a model with -V{} (or more)", options.tokenizer, tv,
           model_spec, g.vocab_size(), tv);
    }
  }
  check_plan_memory(plan, plan.comm == "local" ? plan.world : 1, host_memory_limit());

  // ---- the data: the training file's windows give the length of an epoch; both files are read
  // whole once, every token checked against the vocabulary ----
  const auto vocab = static_cast<std::int32_t>(g.vocab_size());
  {
    DataLoaderOptions dlo;
    dlo.micro_batch_size = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
    dlo.sequence_length = static_cast<std::size_t>(T);
    dlo.gradient_accumulation_steps = static_cast<int>(cfg.gradient_accumulation_steps);
    dlo.world_size = plan.mesh.dp;
    dlo.rank = 0;
    const DataLoader loader = DataLoader::open(options.data, dlo);
    loader.validate(vocab);
    plan.window_count = static_cast<std::int64_t>(loader.window_count());
  }
  if (!options.val_data.empty()) {
    EvalLoaderOptions elo;
    elo.batch_size = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
    elo.sequence_length = static_cast<std::size_t>(T);
    elo.world_size = plan.mesh.dp;
    elo.max_batches = static_cast<std::size_t>(options.val_batches);
    const EvalLoader val = EvalLoader::open(options.val_data, elo);
    validate_token_file(TokenFile::open(options.val_data), vocab);
    plan.val_batches = static_cast<std::int64_t>(val.total_batches());
  }
  plan.epoch_steps = std::max<std::int64_t>(1, plan.window_count / cfg.train_batch_size);
  plan.steps_from_epoch = !options.steps.has_value();
  plan.steps = options.steps ? *options.steps : plan.epoch_steps;
  if (const std::optional<std::string> w = unreached_profile_step(plan); w && lead_process) trainer_warn(options, *w);

  // ---- a resumed run: what it does differently from its command line (train/trainer_checkpoints.h) ----
  if (plan.resume) {
    for (const std::string& w : check_resume_against_run(*plan.resume, options, g, T, plan.window_count))
      if (lead_process) trainer_warn(options, w);
  }
  // ---- every output fits where it goes ----
  check_outputs_have_room(plan, options);

  // ---- what the end of the run will ask, asked now ----
  if (!options.save_weights.empty() && cfg.zero_optimization.stage == 3 && !cfg.zero_optimization.gather_16bit_weights_on_model_save &&
      plan.world > 1) {
    fail(
        "--save-weights {}: ZeRO stage 3 partitions the weights across {} ranks and zero_optimization.stage3_gather_16bit_weights_on_model_save "
        "is false, so they would not be gathered for saving at the end of the run (DeepSpeed's save_16bit_model refuses likewise); set it to "
        "true, or drop --save-weights",
        options.save_weights.string(), plan.world);
  }

  if (cfg.steps_per_print && *cfg.steps_per_print > 0) {
    plan.print_every = *cfg.steps_per_print;
  } else {
    plan.print_every = 10;
    plan.print_every_defaulted = true;
  }

  // MFU's peak (TrainingPlan::peak_flops), measured once here rather than on rank 0 while the
  // others wait. A process of a multi-process CPU job measures nothing: the others would measure at
  // the same time on the same cores.
  plan.peak_flops = options.peak_flops;
  const bool one_process = plan.comm == "local";
  plan.peak_measured = plan.peak_flops <= 0.0 && (cfg.flops_profiler.enabled || (plan.device.is_cpu() && one_process));
  if (plan.peak_flops > 0.0) plan.peak_source = "--peak-flops";
  if (plan.peak_measured) {
    const DType gemm = cfg.fp16.enabled ? DType::fp16 : cfg.bf16.enabled ? DType::bf16 : DType::fp32;
    plan.peak_flops = measure_gemm_flops(plan.device, gemm);
    plan.peak_source = gemm_peak_description(plan.device, gemm);
    if (plan.device.is_cpu() && plan.world > 1) {
      // One rank's team was measured; the job's ranks run their teams side by side, on as many
      // cores as they can occupy together (MFU counts every rank's tokens).
      const int team = cpu_team_threads(), cores = cpu_usable_cores();
      const int busy = std::min(plan.world * team, std::max(cores, team));
      plan.peak_flops *= static_cast<double>(busy) / static_cast<double>(team);
      plan.peak_source += fmt::format(", x {:.3g}: {} ranks of {} thread{} on {} core{}", static_cast<double>(busy) / team, plan.world, team,
                                      team == 1 ? "" : "s", busy, busy == 1 ? "" : "s");
    }
  }
  return plan;
}

}  // namespace dstrain
