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

// checkpoint.writer, with DeepSpeed's keys and defaults (deepspeed/runtime/model_checkpointing/
// constants.py; docs/checkpoints.md "Writers"). DeepSpeed's "mock" type writes nothing and is refused.
enum class CheckpointWriterType { python, fast };
const char* to_string(CheckpointWriterType t);

inline constexpr std::int64_t kCheckpointIoAlignment = 4096;  // O_DIRECT's offset / size / address unit

struct CheckpointWriterConfig {
  bool present = false;                                    // a "writer" block was given (without one the engine picks the writer)
  CheckpointWriterType type = CheckpointWriterType::fast;  // DeepSpeed's default once a block is given
  bool decoupled = false;
  std::int64_t io_buffer_size = 64 * 1024 * 1024;  // the staging memory in all, split in two when io_buffer_double
  bool io_buffer_double = true;
  bool show_statistics = false;  // log each save's bytes, seconds and GB/s
};

struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::warn;  // case-insensitive Ignore/Warn/Fail
  bool load_universal = false;                         // read latest_universal and load a universal checkpoint
  bool use_node_local_storage = false;                 // writer decisions by local rank (node-local disks)
  bool parallel_write_pipeline_stage = false;          // checkpoint.parallel_write.pipeline_stage
  bool checkpoint_serialization = true;                // torch zip container format
  Json writer;                                         // null or the writer block as given
  CheckpointWriterConfig writer_options;               // that block, checked and typed
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

// Error naming the key for a bad type, io_buffer_size (not whole 4096-byte blocks per buffer) or
// boolean; keys DeepSpeed's writer has but dstrain has no use for are warned about.
CheckpointWriterConfig parse_checkpoint_writer(const Json& writer, ParseContext& ctx);
CheckpointConfig parse_checkpoint_config(const Json* value, ParseContext& ctx, Json& resolved);
ActivationCheckpointingConfig parse_activation_checkpointing_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
