// The pipeline side of the pre-flight (train/training_plan.h): how the model's layers split into
// pipeline stages and which schedule runs them, checked before step 1, and the lines that say so at
// the start of a run (docs/parallelism.md "Pipeline parallelism").
//
// The stage count P is the config's (config::DsConfig::pipeline_parallel_size: --pipeline-stages,
// else pipeline.stages); the layers go into P x V contiguous pieces by pipeline.partition
// (models/stage_partition.h), piece v on stage v % P (Megatron's interleaved layout; V = 1: piece s
// on stage s), and a step runs M = gradient_accumulation_steps micro-batches through them.
#pragma once

#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "train/trainer_options.h"
#include "train/training_plan.h"

namespace dstrain {

struct PipelineSchedule {
  int virtual_stages = 1;         // V
  std::string schedule = "1f1b";  // "1f1b", "interleaved" or "gpipe"
};

// --pipeline-virtual-stages V and --pipeline-schedule S ("" = the default: "interleaved" when V > 1,
// else "1f1b") for the config's pipeline_parallel_size P, against each other and against what the
// config asks of a pipeline. Errors (naming the flag or key, the values and the fix): V < 1; an
// unknown schedule; V > 1 with "1f1b" or "gpipe" named; "interleaved" with V = 1; V > 1 without
// pipeline stages; V > 1 with gradient_accumulation_steps not a multiple of P (Megatron's interleaved
// schedule runs the micro-batches in groups of P); with P > 1, ZeRO stage 3 and the 1-bit optimizers.
// Warnings appended to `warnings`: M < P (the bubble dominates), ZeRO stage 2 (DeepSpeed refuses it
// with a pipeline), a schedule named without pipeline stages.
PipelineSchedule check_pipeline_config(const config::DsConfig& cfg, int virtual_stages, const std::string& schedule,
                                       std::vector<std::string>& warnings);

// Fills plan.pipeline_virtual_stages, pipeline_schedule, pipeline_partition, stage_parts and
// pipeline_checkpoint_interval from plan.config, plan.model and options (check_pipeline_config,
// then partition_layers over the whole model's layers: more pieces than layers, or a type: regex that
// finds no layer, is an Error naming the flag or key). Without pipeline stages stage_parts is
// {0, L}. Returns the warnings.
std::vector<std::string> plan_pipeline(TrainingPlan& plan, const TrainerOptions& options);

// The partition, for the start of a run and check-config: a header line
//   pipeline: 4 stages x 2 virtual stages (interleaved 1F1B), partition "parameters" over 14 layers
// and one line per stage, its layers (by Layer::name()), its parameters (tied ones counted in every
// stage that holds them: DeepSpeed keeps a real copy there) and its ranks' model states as the
// config's precision, optimizer and ZeRO stage place them over the stage's data group:
//   stage 0: layers 0-3 (embedding, h.0-h.2; 21.3M parameters, ~412 MiB)
// With virtual stages each stage lists its chunks. Empty without pipeline stages.
std::vector<std::string> describe_pipeline_partition(const TrainingPlan& plan);

}  // namespace dstrain
