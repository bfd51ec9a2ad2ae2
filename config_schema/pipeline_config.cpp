#include "config_schema/pipeline_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// "auto" or a whole number >= 1 (hjson reads 4.0 as a float; DeepSpeed compares it as a number).
std::int64_t read_stages(const Json& v) {
  if (v.is_string() && v.get<std::string>() == "auto") return 0;
  std::optional<std::int64_t> n;
  if (v.is_number_integer()) n = v.get<std::int64_t>();
  if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 0x1p62)
    n = static_cast<std::int64_t>(v.get<double>());
  if (!n)
    fail(
        "pipeline.stages is {}: it must be \"auto\" (the stage count comes from --pipeline-stages, as DeepSpeed takes it from "
        "PipelineModule(num_stages=...)) or a whole number of stages >= 1, e.g. \"stages\": 2",
        show(v));
  if (*n < 1) fail("pipeline.stages is {}: a pipeline has at least 1 stage (1: no pipeline parallelism); give a number >= 1 or \"auto\"", *n);
  return *n;
}

// The partition method as PipelineModule._partition_layers reads it (lower-cased; "best" is
// "parameters", as dstrain's default); the regex of type:<regex> is compiled here so that a bad one
// is an Error now, naming the key.
std::string read_partition(const Json& v) {
  if (!v.is_string()) fail("pipeline.partition is {}: it must be a string, one of {}", show(v), kPipelinePartitionChoices);
  const std::string given = v.get<std::string>();
  const std::string method = lower(given);
  if (method == "parameters" || method == "best") return "parameters";
  if (method == "uniform") return "uniform";
  if (method.rfind("type:", 0) == 0) {
    const std::string pattern = given.substr(5);
    if (pattern.empty())
      fail("pipeline.partition is \"{}\": type: needs a regular expression over the layers' class names, e.g. \"type:GPT2Block\"", given);
    try {
      (void)std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      fail("pipeline.partition is \"{}\": '{}' is not a valid regular expression ({}); give e.g. \"type:GPT2Block\"", given, pattern, e.what());
    }
    return "type:" + pattern;
  }
  fail("pipeline.partition is \"{}\": not a partition method DeepSpeed's PipelineModule knows; use one of {}", given, kPipelinePartitionChoices);
}

}  // namespace

SectionSpec pipeline_section_spec() {
  Json stages_default = "auto";
  FieldSpec stages{.key = "stages", .kind = FieldKind::any, .default_value = stages_default};
  stages.description = "Pipeline stages: \"auto\" (from --pipeline-stages, else 1) or a number >= 1; --pipeline-stages overrides it.";
  return make_section("pipeline", Regime::dict_lookup, "Pipeline parallelism (DeepSpeed's get_pipeline_config; unknown keys kept).",
                      {
                          std::move(stages),
                          string_field("partition", "best",
                                       "Layers into stages: \"parameters\" (\"best\" reads as it), \"uniform\" or \"type:<regex>\"."),
                          bool_field("seed_layers", false, "A distinct random seed per layer."),
                          int_field("activation_checkpoint_interval", 0, "Layers per activation-checkpointed group; 0 = none.").min(0),
                          bool_field("pipe_partitioned", true, "Activations between stages split over the tensor-parallel ranks."),
                          bool_field("grad_partitioned", true, "Gradients between stages split over the tensor-parallel ranks."),
                          bool_field("use_reentrant", true, "Reentrant activation checkpointing (DeepSpeed sets True when unset)."),
                      });
}

PipelineConfig parse_pipeline_config(const Json* value, ParseContext& ctx, Json& resolved) {
  PipelineConfig c;
  const SectionSpec spec = pipeline_section_spec();
  if (value == nullptr || value->is_null()) {
    resolved = Json::object();
    for (const FieldSpec& f : spec.fields) resolved[f.key] = f.default_value;
    return c;
  }
  if (!value->is_object()) fail("pipeline must be an object such as {{\"stages\": 2, \"partition\": \"parameters\"}}, got {}", show(*value));
  c.present = true;
  const Json& v = *value;
  // PipelineEngine asserts these two are bool (no 1 / 0, no strings).
  for (const char* k : {"pipe_partitioned", "grad_partitioned"})
    if (v.contains(k) && !v[k].is_boolean()) fail("pipeline.{} is {}: it must be a boolean (true or false without quotes)", k, show(v[k]));
  // stages and partition hold strings DeepSpeed reads itself ("auto", "best"): read here, not as typed fields.
  SectionSpec typed = spec;
  std::erase_if(typed.fields, [](const FieldSpec& f) { return f.key == "stages" || f.key == "partition"; });
  resolved = read_section(v, typed, ctx, {"stages", "partition"});
  resolved["stages"] = v.contains("stages") ? v["stages"] : spec.fields[0].default_value;
  resolved["partition"] = v.contains("partition") ? v["partition"] : Json("best");
  c.stages = read_stages(resolved["stages"]);
  c.partition = read_partition(resolved["partition"]);
  c.activation_checkpoint_interval = resolved["activation_checkpoint_interval"].get<std::int64_t>();
  c.seed_layers = resolved["seed_layers"].get<bool>();
  c.pipe_partitioned = resolved["pipe_partitioned"].get<bool>();
  c.grad_partitioned = resolved["grad_partitioned"].get<bool>();
  c.use_reentrant = resolved["use_reentrant"].get<bool>();
  // DeepSpeed keeps the keys it does not know in the dict (they were warned about by read_section).
  for (const auto& [key, x] : v.items())
    if (!resolved.contains(key)) resolved[key] = x;
  // Ordered as the section table, then the unknown keys: stages and partition first as DeepSpeed's defaults list them.
  Json ordered = Json::object();
  for (const FieldSpec& f : spec.fields) ordered[f.key] = resolved[f.key];
  for (const auto& [key, x] : resolved.items())
    if (!ordered.contains(key)) ordered[key] = x;
  resolved = std::move(ordered);
  return c;
}

}  // namespace dstrain::config
