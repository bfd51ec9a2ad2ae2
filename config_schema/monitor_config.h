// Monitoring, logging and profiling sections (docs/monitoring.md): tensorboard, csv_monitor, wandb,
// comet, comms_logger, timers (regime B) and flops_profiler (regime A).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

// tensorboard and csv_monitor share DeepSpeed's field set.
struct FileMonitorConfig {
  bool enabled = false;
  std::string output_path;  // "" = current directory
  std::string job_name = "DeepSpeedJobName";
};
using TensorboardConfig = FileMonitorConfig;
using CsvMonitorConfig = FileMonitorConfig;

// wandb: not provided by dstrain (warned when enabled).
struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project = "deepspeed";
};

// comet: not provided by dstrain (warned when enabled).
struct CometConfig {
  bool enabled = false;
  std::int64_t samples_log_interval = 100;
  std::optional<std::string> project, workspace, api_key, experiment_name, experiment_key, mode;
  std::optional<bool> online;
};

struct CommsLoggerConfig {
  bool configured = false;  // DeepSpeed: the section's presence alone marks it configured
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
  std::vector<std::string> prof_ops;
};

struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  std::int64_t profile_step = 1;
  std::int64_t module_depth = -1;
  std::int64_t top_modules = 1;
  bool detailed = true;
  std::optional<std::string> output_file;
};

struct TimersConfig {
  bool throughput_enabled = true;
  bool throughput_synchronized = true;
};

SectionSpec tensorboard_section_spec();
SectionSpec csv_monitor_section_spec();
SectionSpec wandb_section_spec();
SectionSpec comet_section_spec();
SectionSpec comms_logger_section_spec();
SectionSpec flops_profiler_section_spec();
SectionSpec timers_section_spec();
SectionSpec timers_throughput_section_spec();

FileMonitorConfig parse_file_monitor_config(const std::string& key, const Json* value, ParseContext& ctx, Json& resolved);
WandbConfig parse_wandb_config(const Json* value, ParseContext& ctx, Json& resolved);
CometConfig parse_comet_config(const Json* value, ParseContext& ctx, Json& resolved);
CommsLoggerConfig parse_comms_logger_config(const Json* value, ParseContext& ctx, Json& resolved);
FlopsProfilerConfig parse_flops_profiler_config(const Json* value, ParseContext& ctx, Json& resolved);
TimersConfig parse_timers_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
