// TrainingPlan: a training run resolved before its first step — the pre-flight of
// train/trainer.h. plan_training() reads and checks every input and settles everything the ranks
// share (the world, the config resolved for it, the model's shape, T, the number of steps), so a
// mistake is an Error here, before any rank allocates a model or trains a step, never after hours
// of training.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/config_source.h"
#include "config_schema/ds_config.h"
#include "zero/device_mesh.h"
#include "train/memory_estimate.h"
#include "train/trainer_checkpoints.h"
#include "train/trainer_options.h"
#include "ops/device.h"
#include "models/model_family.h"
#include "models/stage_partition.h"
#include "zero/launch_env.h"
#include "zero/mpi_process.h"

namespace dstrain {

struct TrainingPlan {
  std::string model_spec;                     // as the user wrote it (printed at the top of the run)
  std::shared_ptr<const Architecture> model;  // its architecture and shape, read once (a config.json is not read per rank)
  config::DsConfig config;                    // resolved for `world` ranks, "auto" values filled
  Device device = Device::cpu();              // where every rank trains (under a launcher: this process's GPU)
  LaunchEnv launch;                           // the launcher's environment ("none": no launcher)
  // True when this process is one rank of a launcher's group (a GPU per process, NCCL): the ranks
  // are processes; otherwise they are options.num_ranks threads of this process.
  bool launcher_group = false;
  // The communicator backend the ranks use: "local" (threads of this process, or a single rank),
  // "mpi" (this process is rank launch.rank of MPI_COMM_WORLD's launch.world_size processes) or
  // "nccl" (launcher_group). comm_note says which and why, for the start of the run.
  std::string comm = "local";
  std::string comm_note;
  MpiWorld mpi;                        // comm "mpi": this process's place and MPI's thread level
  int world = 1;                       // ranks of the run (every rank of the device mesh)
  // The device mesh (zero/device_mesh.h, docs/parallelism.md): world = pp x dp x sp x tp, from the
  // pipeline stages (--pipeline-stages, pipeline.stages), the config's tensor_parallel and
  // sequence_parallel_size; the data loaders read for mesh.dp ranks.
  MeshShape mesh;
  // Pipeline parallelism (mesh.pp > 1): the whole model's layers in mesh.pp x pipeline_virtual_stages contiguous
  // pieces (models/stage_partition.h; virtual stage v = chunk * mesh.pp + stage, Megatron's layout), the schedule
  // ("1f1b", "interleaved", "gpipe") and pipeline.activation_checkpoint_interval.
  int pipeline_virtual_stages = 1;
  std::string pipeline_schedule = "1f1b";
  std::string pipeline_partition = "parameters";
  StageParts stage_parts;  // mesh.pp * pipeline_virtual_stages + 1 layer indices; {0, L} without a pipeline
  std::int64_t pipeline_checkpoint_interval = 0;
  std::int64_t sequence_length = 0;    // T
  std::int64_t window_count = 0;       // training windows of T + 1 tokens in the data file
  std::int64_t epoch_steps = 0;        // steps of one pass over them (at least 1)
  std::int64_t val_batches = 0;        // batches per evaluation over all ranks (0: no val data)
  std::int64_t steps = 0;              // the run's optimizer steps
  bool steps_from_epoch = false;       // `steps` was not given: one epoch
  std::int64_t print_every = 10;       // steps between progress lines (steps_per_print; 10 unset)
  bool print_every_defaulted = false;  // steps_per_print was unset
  // The checkpoint the run continues from (--resume), checked before step 1; nullopt: fresh.
  std::optional<ResumePoint> resume;
  // The peak MFU is read against (the progress line, the summary, the flops profiler): --peak-flops
  // (the job's), else measured at start — on the CPU by one process training alone (its GEMM path
  // in the run's dtype: bench/bench_gemm_peak_cpu measures the same path in full), on a GPU when
  // the flops profiler asks. 0: unknown (processes of a multi-process CPU job: give --peak-flops).
  double peak_flops = 0.0;
  bool peak_measured = false;
  std::string peak_source;  // what the peak is, for the start line and the summary
};

// The pre-flight, everything that can be checked before step 1 (README "dstrain train"): the option
// values; the launcher and the device; every input file read (the config, the model's config.json,
// both token files scanned whole against the vocabulary); every output (--save-weights,
// --summary-json, flops_profiler.output_file) proven writable, never one of the inputs; the config
// resolved for the world size (its warnings go to options.warn, its resolved "auto" values to
// options.print); the model's shape against T, the tokenizer and the memory there is; what the end
// of the run will need (stage 3 weights gathered for --save-weights). Throws Error naming the
// option, key or file and the fix.
TrainingPlan plan_training(const ConfigText& config, const std::string& model_spec, const TrainerOptions& options);

// The pre-flight's memory check (train/memory_estimate.h): the lower bound for one rank of the
// plan's mesh (its model, config and T), times the `ranks_here` ranks this process runs, against
// `limit` (plan_training: host_memory_limit()) — on the cpu all of it, on a GPU what offload keeps
// in host memory (and the device's share against a bound no device reaches). Error with the
// figures and the fix when it does not fit.
void check_plan_memory(const TrainingPlan& plan, int ranks_here, const std::optional<HostMemoryLimit>& limit);

// options.print / options.warn, or their defaults (stdout; stderr with "warning: ").
void trainer_print(const TrainerOptions& options, std::string_view line);
void trainer_warn(const TrainerOptions& options, std::string_view text);

}  // namespace dstrain
