#include "config_schema/monitor_config.h"

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {
const Json& obj_or_empty(const Json* v) {
  static const Json empty = Json::object();
  return (v == nullptr || v->is_null()) ? empty : *v;
}
std::optional<std::string> opt_string(const Json& v) {
  if (v.is_null()) return std::nullopt;
  return v.get<std::string>();
}
SectionSpec file_monitor_spec(const std::string& key, const std::string& what) {
  return make_section(key, Regime::validated, what,
                      {
                          bool_field("enabled", false, "Write the monitor's events."),
                          string_field("output_path", "", "Folder for the event files; \"\" = current folder."),
                          string_field("job_name", "DeepSpeedJobName", "Sub-folder / run name."),
                      });
}
}  // namespace

SectionSpec tensorboard_section_spec() { return file_monitor_spec("tensorboard", "TensorBoard event files."); }
SectionSpec csv_monitor_section_spec() { return file_monitor_spec("csv_monitor", "CSV files of the monitored values."); }

SectionSpec wandb_section_spec() {
  return make_section("wandb", Regime::validated, "Weights & Biases; not provided by dstrain.",
                      {
                          bool_field("enabled", false, "Log to Weights & Biases."),
                          string_field("group", nullptr, "Run group."),
                          string_field("team", nullptr, "Team (entity)."),
                          string_field("project", "deepspeed", "Project name."),
                      });
}

SectionSpec comet_section_spec() {
  return make_section("comet", Regime::validated, "Comet ML; not provided by dstrain.",
                      {
                          bool_field("enabled", false, "Log to Comet."),
                          int_field("samples_log_interval", 100, "Samples between logged points."),
                          string_field("project", nullptr, "Project."),
                          string_field("workspace", nullptr, "Workspace."),
                          string_field("api_key", nullptr, "API key."),
                          string_field("experiment_name", nullptr, "Experiment name."),
                          string_field("experiment_key", nullptr, "Experiment key."),
                          bool_field("online", false, "Online mode.").default_none(),
                          string_field("mode", nullptr, "Comet mode."),
                      });
}

SectionSpec comms_logger_section_spec() {
  return make_section("comms_logger", Regime::validated, "Logging of collective communication calls.",
                      {
                          bool_field("enabled", false, "Log communication operations."),
                          bool_field("verbose", false, "Log every operation."),
                          bool_field("prof_all", true, "Profile all operations."),
                          bool_field("debug", false, "Include the caller in the log."),
                          array_field("prof_ops", Json::array(), "Operations to profile when prof_all is false."),
                      });
}

SectionSpec flops_profiler_section_spec() {
  return make_section("flops_profiler", Regime::dict_lookup, "FLOPs profiler of one training step.",
                      {
                          bool_field("enabled", false, "Profile one step (forces wall_clock_breakdown)."),
                          number_field("recompute_fwd_factor", 0.0, "Share of the forward recomputed in backward."),
                          int_field("profile_step", 1, "Step to profile."),
                          int_field("module_depth", -1, "Depth of the per-module report; -1 = all."),
                          int_field("top_modules", 1, "Top modules listed in the report."),
                          bool_field("detailed", true, "Detailed per-module report."),
                          string_field("output_file", nullptr, "Report file; null = stdout."),
                      });
}

SectionSpec timers_section_spec() {
  return make_section("timers", Regime::validated, "Engine timers.", {object_field("throughput", "Throughput timer {enabled, synchronized}.")});
}

SectionSpec timers_throughput_section_spec() {
  return make_section("timers.throughput", Regime::validated, "Throughput timer.",
                      {
                          bool_field("enabled", true, "Measure samples per second."),
                          bool_field("synchronized", true, "Synchronise the device before reading the timer."),
                      });
}

FileMonitorConfig parse_file_monitor_config(const std::string& key, const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), file_monitor_spec(key, ""), ctx);
  FileMonitorConfig c;
  c.enabled = resolved["enabled"].get<bool>();
  c.output_path = resolved["output_path"].get<std::string>();
  c.job_name = resolved["job_name"].get<std::string>();
  return c;
}

WandbConfig parse_wandb_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), wandb_section_spec(), ctx);
  WandbConfig c;
  c.enabled = resolved["enabled"].get<bool>();
  c.group = opt_string(resolved["group"]);
  c.team = opt_string(resolved["team"]);
  c.project = resolved["project"].get<std::string>();
  if (c.enabled)
    ctx.warn("wandb",
             "dstrain does not provide Weights & Biases logging; the `wandb` section is ignored. Use "
             "tensorboard or csv_monitor");
  return c;
}

CometConfig parse_comet_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), comet_section_spec(), ctx);
  CometConfig c;
  c.enabled = resolved["enabled"].get<bool>();
  c.samples_log_interval = resolved["samples_log_interval"].get<std::int64_t>();
  c.project = opt_string(resolved["project"]);
  c.workspace = opt_string(resolved["workspace"]);
  c.api_key = opt_string(resolved["api_key"]);
  c.experiment_name = opt_string(resolved["experiment_name"]);
  c.experiment_key = opt_string(resolved["experiment_key"]);
  c.mode = opt_string(resolved["mode"]);
  if (!resolved["online"].is_null()) c.online = resolved["online"].get<bool>();
  if (c.enabled)
    ctx.warn("comet",
             "dstrain does not provide Comet logging; the `comet` section is ignored. Use tensorboard or "
             "csv_monitor");
  return c;
}

CommsLoggerConfig parse_comms_logger_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), comms_logger_section_spec(), ctx);
  CommsLoggerConfig c;
  c.configured = value != nullptr;
  c.enabled = resolved["enabled"].get<bool>();
  c.verbose = resolved["verbose"].get<bool>();
  c.prof_all = resolved["prof_all"].get<bool>();
  c.debug = resolved["debug"].get<bool>();
  for (const auto& op : resolved["prof_ops"]) {
    if (!op.is_string()) fail("comms_logger.prof_ops contains {}: expected a list of operation names such as \"all_reduce\"", show(op));
    c.prof_ops.push_back(op.get<std::string>());
  }
  return c;
}

FlopsProfilerConfig parse_flops_profiler_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), flops_profiler_section_spec(), ctx);
  FlopsProfilerConfig c;
  c.enabled = resolved["enabled"].get<bool>();
  c.recompute_fwd_factor = resolved["recompute_fwd_factor"].get<double>();
  c.profile_step = resolved["profile_step"].get<std::int64_t>();
  c.module_depth = resolved["module_depth"].get<std::int64_t>();
  c.top_modules = resolved["top_modules"].get<std::int64_t>();
  c.detailed = resolved["detailed"].get<bool>();
  c.output_file = opt_string(resolved["output_file"]);
  return c;
}

TimersConfig parse_timers_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(obj_or_empty(value), timers_section_spec(), ctx);
  const Json& t = resolved["throughput"];
  Json sub = read_section(t.is_null() ? Json::object() : t, timers_throughput_section_spec(), ctx);
  resolved["throughput"] = sub;
  TimersConfig c;
  c.throughput_enabled = sub["enabled"].get<bool>();
  c.throughput_synchronized = sub["synchronized"].get<bool>();
  if (!c.throughput_synchronized) {
    ctx.warn("timers.throughput.synchronized",
             "timers.throughput.synchronized false has no effect: dstrain times a step once it has finished on the device (its loss is "
             "read back), so there is no unsynchronized throughput to report");
  }
  return c;
}

}  // namespace dstrain::config
