#include "config_schema/checkpoint_config.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

const char* to_string(TagValidation v) {
  switch (v) {
    case TagValidation::ignore:
      return "Ignore";
    case TagValidation::warn:
      return "Warn";
    case TagValidation::fail:
      return "Fail";
  }
  return "Warn";
}

const char* to_string(CheckpointWriterType t) { return t == CheckpointWriterType::python ? "python" : "fast"; }

namespace {
const Json& obj_or_empty(const Json* v) {
  static const Json empty = Json::object();
  return (v == nullptr || v->is_null()) ? empty : *v;
}
}  // namespace

SectionSpec checkpoint_section_spec() {
  return make_section("checkpoint", Regime::dict_lookup, "Checkpoint saving and loading.",
                      {
                          string_field("tag_validation", "Warn", "Check that the tag is the same on all ranks: Ignore, Warn or Fail.")
                              .one_of({"Ignore", "Warn", "Fail"}, true),
                          bool_field("load_universal", false, "Load a universal checkpoint (reads latest_universal)."),
                          bool_field("use_node_local_storage", false, "Writer decisions by local rank, for node-local disks."),
                          object_field("parallel_write", "{pipeline_stage: bool}: spread pipeline layer files over DP ranks."),
                          bool_field("checkpoint_serialization", true, "torch.save zip container format."),
                          object_field("writer",
                                       "Checkpoint writer {type: python|fast, decoupled, io_buffer_size, io_buffer_double, show_statistics}."),
                      });
}

SectionSpec checkpoint_parallel_write_section_spec() {
  return make_section("checkpoint.parallel_write", Regime::dict_lookup, "Parallel checkpoint writing.",
                      {bool_field("pipeline_stage", false, "Spread pipeline layer files across data-parallel ranks.")});
}

SectionSpec activation_checkpointing_section_spec() {
  return make_section("activation_checkpointing", Regime::dict_lookup, "Activation checkpointing (recompute in backward).",
                      {
                          bool_field("partition_activations", false, "Split checkpointed activations across model-parallel ranks."),
                          bool_field("cpu_checkpointing", false, "Keep checkpointed activations in host memory."),
                          bool_field("contiguous_memory_optimization", false,
                                     "Copy checkpoints into one contiguous buffer; needs partition_activations and number_checkpoints."),
                          int_field("number_checkpoints", nullptr, "Number of checkpoints (sizes the contiguous buffer)."),
                          bool_field("synchronize_checkpoint_boundary", false, "Synchronise the device at each checkpoint boundary."),
                          bool_field("profile", false, "Log forward/backward time per checkpoint."),
                      });
}

namespace {

bool writer_bool(const Json& v, const std::string& key) {
  if (!v.is_boolean()) fail("checkpoint.writer.{}: {} — give true or false", key, v.dump());
  return v.get<bool>();
}

}  // namespace

// DeepSpeed's keys and defaults (deepspeed/runtime/model_checkpointing/config.py): the type is
// upper-cased and one of MOCK / PYTHON / FAST, FAST when absent.
CheckpointWriterConfig parse_checkpoint_writer(const Json& w, ParseContext& ctx) {
  CheckpointWriterConfig c;
  c.present = true;
  for (const auto& [key, v] : w.items()) {
    if (key == "type") {
      std::string up = v.is_string() ? v.get<std::string>() : v.dump();
      for (auto& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      if (!v.is_string() || (up != "FAST" && up != "PYTHON" && up != "MOCK")) {
        fail(
            "checkpoint.writer.type: {} — give \"fast\" (O_DIRECT from aligned staging buffers) or \"python\" (buffered writes through "
            "the page cache), any case",
            v.dump());
      }
      if (up == "MOCK") {
        fail(
            "checkpoint.writer.type: \"mock\" is DeepSpeed's writer that writes nothing; a checkpoint that is not written cannot be "
            "resumed — give \"fast\" or \"python\"");
      }
      c.type = up == "FAST" ? CheckpointWriterType::fast : CheckpointWriterType::python;
    } else if (key == "decoupled") {
      c.decoupled = writer_bool(v, key);
    } else if (key == "io_buffer_double") {
      c.io_buffer_double = writer_bool(v, key);
    } else if (key == "show_statistics") {
      c.show_statistics = writer_bool(v, key);
    } else if (key == "io_buffer_size") {
      // A JSON number such as 64e6 is accepted when it is a whole number, as Python's int() would.
      if (!v.is_number() || (v.is_number_float() && (v.get<double>() != std::floor(v.get<double>()) || v.get<double>() > 9.0e15))) {
        fail("checkpoint.writer.io_buffer_size: {} — give a whole number of bytes, a multiple of {}", v.dump(), kCheckpointIoAlignment);
      }
      c.io_buffer_size = v.is_number_float() ? static_cast<std::int64_t>(v.get<double>()) : v.get<std::int64_t>();
    } else {
      ctx.warn("checkpoint.writer." + key, key == "data_parallel" || key == "io_multiplier"
                                               ? "DeepSpeed's split of one file over several data-parallel writers; every dstrain rank "
                                                 "writes its own file already, so it is not used"
                                               : "not a key of DeepSpeed's checkpoint writer; ignored");
    }
  }
  // Each staging buffer is one O_DIRECT request: a whole number of 4096-byte blocks (DeepSpeed's
  // Double_IO_Buffer asserts the same of its halves).
  const std::int64_t buffers = c.io_buffer_double ? 2 : 1;
  if (c.io_buffer_size < buffers * kCheckpointIoAlignment || c.io_buffer_size % (buffers * kCheckpointIoAlignment) != 0) {
    fail(
        "checkpoint.writer.io_buffer_size: {} bytes cannot be split into {} staging buffer(s) of whole {}-byte blocks; give a multiple of {} "
        "(at least {}; DeepSpeed's default is {} = 64 MiB)",
        c.io_buffer_size, buffers, kCheckpointIoAlignment, buffers * kCheckpointIoAlignment, buffers * kCheckpointIoAlignment,
        CheckpointWriterConfig{}.io_buffer_size);
  }
  return c;
}

CheckpointConfig parse_checkpoint_config(const Json* value, ParseContext& ctx, Json& resolved) {
  const Json& obj = obj_or_empty(value);
  // DeepSpeed's own message for a bad tag_validation (it upper-cases the value first).
  if (obj.is_object() && obj.contains("tag_validation")) {
    const Json& t = obj["tag_validation"];
    std::string up = t.is_string() ? t.get<std::string>() : t.dump();
    for (auto& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (!t.is_string() || (up != "WARN" && up != "IGNORE" && up != "FAIL"))
      fail(
          "checkpoint.tag_validation: Checkpoint config contains invalid tag_validation value of {}, expecting one of "
          "['WARN', 'IGNORE', 'FAIL'] (any case)",
          t.is_string() ? t.get<std::string>() : t.dump());
  }
  // DeepSpeed accepts what Python's `value in [True, False]` accepts: the booleans, and the numbers
  // equal to them (1, 0, 1.0, 0.0), which then act as true / false.
  Json patched;
  const Json* src = &obj;
  if (obj.is_object() && obj.contains("parallel_write") && obj["parallel_write"].is_object() && obj["parallel_write"].contains("pipeline_stage") &&
      !obj["parallel_write"]["pipeline_stage"].is_boolean()) {
    const Json& v = obj["parallel_write"]["pipeline_stage"];
    if (!v.is_number() || (v.get<double>() != 0.0 && v.get<double>() != 1.0))
      fail(
          "checkpoint.parallel_write.pipeline_stage: checkpoint::parallel_write::pipeline_stage value of '{}' is invalid, expecting: "
          "true or false (1 and 0 are accepted too, as in DeepSpeed)",
          show(v));
    patched = obj;
    patched["parallel_write"]["pipeline_stage"] = v.get<double>() == 1.0;
    src = &patched;
  }
  resolved = read_section(*src, checkpoint_section_spec(), ctx);
  CheckpointConfig c;
  const std::string tv = resolved["tag_validation"].get<std::string>();
  c.tag_validation = tv == "Ignore" ? TagValidation::ignore : tv == "Fail" ? TagValidation::fail : TagValidation::warn;
  c.load_universal = resolved["load_universal"].get<bool>();
  c.use_node_local_storage = resolved["use_node_local_storage"].get<bool>();
  const Json& pw = resolved["parallel_write"];
  Json pw_resolved = read_section(pw.is_null() ? Json::object() : pw, checkpoint_parallel_write_section_spec(), ctx);
  resolved["parallel_write"] = pw_resolved;
  c.parallel_write_pipeline_stage = pw_resolved["pipeline_stage"].get<bool>();
  c.checkpoint_serialization = resolved["checkpoint_serialization"].get<bool>();
  c.writer = resolved["writer"];
  if (c.writer.is_object()) {
    c.writer_options = parse_checkpoint_writer(c.writer, ctx);
  } else if (!c.writer.is_null()) {
    fail("checkpoint.writer: {} — give an object such as {{\"type\": \"fast\", \"decoupled\": true}}", c.writer.dump());
  }
  return c;
}

ActivationCheckpointingConfig parse_activation_checkpointing_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), activation_checkpointing_section_spec(), ctx);
  ActivationCheckpointingConfig c;
  c.present = value != nullptr && !value->is_null();
  c.partition_activations = resolved["partition_activations"].get<bool>();
  c.cpu_checkpointing = resolved["cpu_checkpointing"].get<bool>();
  c.contiguous_memory_optimization = resolved["contiguous_memory_optimization"].get<bool>();
  if (!resolved["number_checkpoints"].is_null()) c.number_checkpoints = resolved["number_checkpoints"].get<std::int64_t>();
  c.synchronize_checkpoint_boundary = resolved["synchronize_checkpoint_boundary"].get<bool>();
  c.profile = resolved["profile"].get<bool>();
  // DeepSpeed asserts these two only inside checkpointing.configure(), whose explicit arguments
  // override the JSON (Megatron passes num_checkpoints there), so DeepSpeed's own test configs omit
  // them. We cannot know what the program would pass: warn, and leave the decision to the engine.
  if (c.contiguous_memory_optimization && !c.partition_activations)
    ctx.warn("activation_checkpointing.contiguous_memory_optimization",
             "contiguous_memory_optimization is true but partition_activations is false: DeepSpeed asserts "
             "\"Contiguous Checkpointing is only available with partitioned activations\" when checkpointing is "
             "configured from this section; set activation_checkpointing.partition_activations to true");
  if (c.contiguous_memory_optimization && !c.number_checkpoints)
    ctx.warn("activation_checkpointing.number_checkpoints",
             "contiguous_memory_optimization is true but number_checkpoints is not set: DeepSpeed asserts \"Must "
             "specify the number of layers with contiguous memory checkpointing\" unless the program passes it; set "
             "activation_checkpointing.number_checkpoints");
  return c;
}

}  // namespace dstrain::config
