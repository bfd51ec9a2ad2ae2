// The typed ds_config: DeepSpeed's JSON config parsed exactly as DeepSpeed 0.19 parses it, with
// errors that name the key path, the value and the fix, and warnings wherever DeepSpeed would
// silently ignore or misread something.
//
//   auto cfg = dstrain::config::parse_ds_config(json, {.world_size = 8});
//   cfg.zero_optimization.stage, cfg.train_micro_batch_size_per_gpu, cfg.warnings, ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/aio_config.h"
#include "config_schema/auto_values.h"
#include "config_schema/batch_size.h"
#include "config_schema/checkpoint_config.h"
#include "config_schema/elasticity_config.h"
#include "config_schema/expert_parallel_config.h"
#include "config_schema/field_spec.h"
#include "config_schema/state_placement.h"
#include "config_schema/tensor_parallel_config.h"
#include "config_schema/monitor_config.h"
#include "config_schema/pipeline_config.h"
#include "config_schema/optimizer_config.h"
#include "config_schema/precision_config.h"
#include "config_schema/scheduler_config.h"
#include "config_schema/unsupported_sections.h"
#include "config_schema/warning.h"
#include "config_schema/zero_config.h"

namespace dstrain::config {

struct ConfigOptions {
  std::int64_t world_size = 1;  // total ranks; the data-parallel size is derived (pipeline stages, sequence_parallel_size, tensor_parallel)
  // The pipeline's stage count from the command line (dstrain train / check-config --pipeline-stages N,
  // DeepSpeed's PipelineModule(num_stages=N)): it replaces pipeline.stages. nullopt: pipeline.stages,
  // 1 when that is "auto" or the section is absent.
  std::optional<std::int64_t> pipeline_stages;
  AutoValues autos;
  // The optimizer a program passes to deepspeed.initialize (DeepSpeed's client optimizer), as an
  // "optimizer" block ({"type": ..., "params": {...}}) read like the config's: it replaces the
  // config's block (DeepSpeed builds the client's and ignores the block; a warning says so).
  std::optional<Json> client_optimizer;
  // The optimizer for a config with no "optimizer" block and no client_optimizer: `dstrain train`
  // passes AdamW with the HF Trainer's defaults (default_optimizer_block). nullopt: none, as
  // DeepSpeed (check-config reports the config as it is).
  std::optional<Json> default_optimizer;
};

// Where DsConfig::optimizer came from.
enum class OptimizerSource { config, client, default_adamw };

enum class Precision { fp32, fp16, bf16 };
const char* to_string(Precision p);

struct DsConfig {
  // --- batch (resolved, docs/batch.md) ---
  std::int64_t train_batch_size = 0;
  std::int64_t train_micro_batch_size_per_gpu = 0;
  std::int64_t gradient_accumulation_steps = 0;
  // The device mesh (docs/batch.md §1): world_size = pipeline x data-parallel x sequence-parallel x
  // tensor-parallel, tensor-parallel innermost (ranks r and r+1 share a tensor-parallel group),
  // then sequence-parallel, then data-parallel, pipeline stages outermost. Every batch key counts
  // data-parallel ranks only (DeepSpeed's PipelineEngine passes its grid as the mpu, so its batch
  // arithmetic does the same).
  std::int64_t world_size = 1;                    // ConfigOptions::world_size
  std::int64_t data_parallel_world_size = 1;      // world_size / (pipeline_parallel_size * sequence_parallel_world_size * tensor_parallel_size)
  std::int64_t pipeline_parallel_size = 1;        // ConfigOptions::pipeline_stages, else pipeline.stages; 1 for "auto" or no section
  std::int64_t sequence_parallel_world_size = 1;  // sequence_parallel_size, 1 when absent
  std::int64_t tensor_parallel_size = 1;          // tensor_parallel.autotp_size when > 1, else 1 (TensorParallelConfig::size)

  // --- top-level scalars (docs/config.md §7) ---
  bool managed_gradient_accumulation = true;
  std::optional<std::int64_t> steps_per_print;  // None = never print (default since v0.15.2)
  bool wall_clock_breakdown = false;            // forced on by flops_profiler.enabled
  bool memory_breakdown = false;
  bool dump_state = false;
  double gradient_clipping = 1.0;  // max global L2 norm; <= 0 disables (default 1.0 since v0.19.3)
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::string gradient_allreduce_op = "mean";          // "mean" | "sum" (lower-cased)
  std::optional<std::string> communication_data_type;  // "fp32" | "fp16" | "bf16"; nullopt = model dtype
  // "fp32" | "fp16" | "bf16" (lower-cased); nullopt = given as null (the model dtype). With more than
  // one sequence-parallel rank DeepSpeed reduces gradients in this dtype instead of
  // communication_data_type: see gradient_communication_data_type().
  std::optional<std::string> seq_parallel_communication_data_type = "fp32";
  bool sparse_gradients = false;
  bool disable_allgather = false;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  bool graph_harvesting = false;
  bool dataloader_drop_last = false;
  std::optional<std::int64_t> vocabulary_size;
  bool use_data_before_expert_parallelism = false;
  std::optional<std::string> log_level;
  std::optional<std::int64_t> sequence_parallel_size;  // as given (DeepSpeed tests its presence)
  std::optional<std::int64_t> data_parallel_size;      // as given; checked against the mesh with sequence_parallel_size
  std::int64_t allgather_size = 500'000'000;           // only used by the legacy "zero_optimization": true

  // --- sections ---
  OptimizerConfig optimizer;
  OptimizerSource optimizer_source = OptimizerSource::config;  // config also when there is none
  SchedulerConfig scheduler;
  Fp16Config fp16;
  Bf16Config bf16;
  AmpConfig amp;
  TorchAutocastConfig torch_autocast;
  DataTypesConfig data_types;
  ZeroConfig zero_optimization;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  CheckpointConfig checkpoint;
  TensorboardConfig tensorboard;
  CsvMonitorConfig csv_monitor;
  WandbConfig wandb;
  CometConfig comet;
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  TimersConfig timers;
  ElasticityConfig elasticity;                   // when enabled, it produced the batch triple
  TensorParallelConfig tensor_parallel;          // AutoTP; its size() is tensor_parallel_size
  PipelineConfig pipeline;                       // pipeline parallelism; the stage count is pipeline_parallel_size
  ExpertParallelConfig expert_parallel;          // AutoEP; its ep_size() splits the data-parallel ranks (MeshShape::ep)
  std::vector<IgnoredSection> ignored_sections;  // features dstrain does not provide (warned)

  // --- diagnostics ---
  std::vector<Warning> warnings;
  std::vector<std::string> resolved_autos;  // "train_micro_batch_size_per_gpu: auto -> 4 (from --micro-batch-size)"

  // The canonical tree built at parse time: every default filled, batch triple resolved, deprecated
  // names mapped, "auto" replaced, and one spelling per key. The spelling is DeepSpeed's pydantic
  // *field name* (e.g. "prefetch_bucket_size", not its alias "stage3_prefetch_bucket_size"),
  // because that is what DeepSpeed itself reports (model_dump) and it is accepted by every
  // DeepSpeed release that has the alias. Unknown top-level keys are dropped (they were warned);
  // unsupported sections are kept as given.
  Json resolved;

  // The dtype gradients are reduced in, as DeepSpeed's engine chooses it: with more than one
  // sequence-parallel rank, seq_parallel_communication_data_type replaces communication_data_type
  // (engine.py: self.communication_data_type = seq_parallel_communication_data_type). nullopt = the
  // model dtype (fp16 / bf16 / fp32).
  std::optional<std::string> gradient_communication_data_type() const {
    return sequence_parallel_world_size > 1 ? seq_parallel_communication_data_type : communication_data_type;
  }
  // "world size 8 = data-parallel 2 x sequence-parallel 2 x tensor-parallel 2", with
  // "pipeline 2 x " first when there are pipeline stages, and " (expert-parallel 2 x
  // expert-data-parallel 1)" after the data-parallel size when expert_parallel is enabled with
  // autoep_size > 1.
  std::string mesh_description() const;

  Precision precision() const { return fp16.enabled ? Precision::fp16 : bf16.enabled ? Precision::bf16 : Precision::fp32; }
  // Where the training state lives (config_schema/state_placement.h): the stage's and offload
  // sections' homes, masters and pinning, as every layer that places state reads them.
  StatePlacement placement() const { return state_placement(zero_optimization, precision() != Precision::fp32); }

  // The fully resolved config (see `resolved`); parse_ds_config(to_json()) gives the same config.
  Json to_json() const;
  // A readable multi-line summary for `dstrain check-config`.
  std::string summary() const;
};

// Parses a ds_config tree (already read from text, e.g. by the hjson reader). Throws dstrain::Error.
DsConfig parse_ds_config(const Json& root, const ConfigOptions& options);

// The top-level scalar keys (docs/config.md §7).
SectionSpec top_level_section_spec();

// Top-level keys that hold sections (optimizer, zero_optimization, pipeline, ...), including the
// sections dstrain does not provide.
std::vector<std::string> top_level_section_keys();

}  // namespace dstrain::config
