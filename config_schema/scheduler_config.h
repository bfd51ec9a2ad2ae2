// scheduler: docs/lr_schedules.md. Regime A; params are constructor kwargs, so for the schedulers dstrain
// implements an unknown parameter name is an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

enum class SchedulerKind { none, warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, lr_range_test, unsupported };

// Typed scheduler parameters with DeepSpeed's defaults. W = max(2, warmup_num_steps) is applied by
// the scheduler itself, not here.
struct SchedulerParams {
  // WarmupLR / WarmupDecayLR / WarmupCosineLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;  // resolved: WarmupLR -> optimizer lr; WarmupDecayLR -> 0.001
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  std::int64_t last_batch_iteration = -1;
  std::optional<std::int64_t> total_num_steps;  // required by WarmupDecayLR / WarmupCosineLR
  double warmup_min_ratio = 0.0;                // WarmupCosineLR
  double cos_min_ratio = 0.0001;                // WarmupCosineLR
  // OneCycle
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::int64_t cycle_second_step_size = 2000;  // resolved: null -> cycle_first_step_size
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = 0;  // resolved: null -> cycle_first_stair_count
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 1e-3;
  std::int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

struct SchedulerConfig {
  SchedulerKind kind = SchedulerKind::none;
  std::string type;  // as written
  SchedulerParams params;
  Json raw_params = Json::object();

  bool present() const { return kind != SchedulerKind::none; }
};

SectionSpec scheduler_section_spec();
SectionSpec scheduler_params_section_spec();  // union of the five DeepSpeed schedulers' params

// `optimizer_lr` is the optimizer's lr (WarmupLR's warmup_max_lr default since v0.17.2); nullopt
// when no optimizer is configured.
SchedulerConfig parse_scheduler_config(const Json* value, std::optional<double> optimizer_lr, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
