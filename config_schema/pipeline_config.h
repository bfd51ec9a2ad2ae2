// pipeline: DeepSpeed's pipeline-parallel section (docs/config.md §8.6), read as DeepSpeed 0.19's
// get_pipeline_config reads it (deepspeed/runtime/config.py: a dict of defaults that the user's keys
// overlay, unknown keys kept — regime A) and as PipelineEngine checks it (pipe_partitioned and
// grad_partitioned must be booleans).
//
//   "pipeline": {"stages": 4, "partition": "parameters", "activation_checkpoint_interval": 1}
//
// DeepSpeed itself takes the stage count from PipelineModule(num_stages=...) in the program, not
// from this section; dstrain has no program, so `stages` (an integer) or the CLI's
// --pipeline-stages N (ConfigOptions::pipeline_stages, which wins) gives it. "auto" (the default)
// without the flag is one stage, and a warning says so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

struct PipelineConfig {
  bool present = false;                             // the section is given (an object)
  std::int64_t stages = 0;                          // 0 = "auto" (DeepSpeed's default: num_stages from PipelineModule)
  std::string partition = "parameters";             // "parameters" ("best" is read as it), "uniform" or "type:<regex>"
  std::int64_t activation_checkpoint_interval = 0;  // >= 0; 0 = no checkpointing of layer groups
  bool seed_layers = false;                         // a distinct seed per layer (PipelineModule's seed_layers)
  bool pipe_partitioned = true;                     // activations between stages partitioned over the tensor-parallel ranks
  bool grad_partitioned = true;                     // gradients between stages partitioned likewise
  bool use_reentrant = true;                        // reentrant activation checkpointing (DeepSpeed sets True when unset)
};

// The partition methods DeepSpeed's PipelineModule takes, for messages.
inline constexpr const char* kPipelinePartitionChoices = "\"parameters\" (or \"best\"), \"uniform\" or \"type:<regex>\"";

SectionSpec pipeline_section_spec();

// Reads the section (`value` null or absent: not present, every default). `resolved` gets the
// canonical tree: every default filled, stages as given ("auto" or the integer), partition as given,
// unknown keys kept. Throws Error naming pipeline.<key>, the value and the fix.
PipelineConfig parse_pipeline_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
