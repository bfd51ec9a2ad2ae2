// checkpoint (docs/config.md §8.2) and activation_checkpointing (§8.3); both regime A.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

enum class TagValidation { ignore, warn, fail };
const char* to_string(TagValidation v);

struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::warn;  // case-insensitive Ignore/Warn/Fail
  bool load_universal = false;           // read latest_universal and load a universal checkpoint
  bool use_node_local_storage = false;   // writer decisions by local rank (node-local disks)
  bool parallel_write_pipeline_stage = false;  // checkpoint.parallel_write.pipeline_stage
  bool checkpoint_serialization = true;  // torch zip container format
  Json writer;                           // null or the fast-writer block (DeepSpeed's engines; not provided)
};

struct ActivationCheckpointingConfig {
  bool present = false;  // the config has an "activation_checkpointing" section (it only configures; it never switches on)
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;  // needs partition_activations and number_checkpoints
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

SectionSpec checkpoint_section_spec();
SectionSpec checkpoint_parallel_write_section_spec();
SectionSpec activation_checkpointing_section_spec();

CheckpointConfig parse_checkpoint_config(const Json* value, ParseContext& ctx, Json& resolved);
ActivationCheckpointingConfig parse_activation_checkpointing_config(const Json* value, ParseContext& ctx,
                                                                    Json& resolved);

}  // namespace dstrain::config
