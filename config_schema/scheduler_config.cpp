#include "config_schema/scheduler_config.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

namespace {

const std::vector<std::string> kTorchSchedulers = {"LambdaLR",
                                                   "MultiplicativeLR",
                                                   "StepLR",
                                                   "MultiStepLR",
                                                   "ConstantLR",
                                                   "LinearLR",
                                                   "ExponentialLR",
                                                   "SequentialLR",
                                                   "CosineAnnealingLR",
                                                   "ChainedScheduler",
                                                   "ReduceLROnPlateau",
                                                   "CyclicLR",
                                                   "CosineAnnealingWarmRestarts",
                                                   "OneCycleLR",
                                                   "PolynomialLR"};

std::vector<std::string> params_for(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::warmup_lr:
      return {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
    case SchedulerKind::warmup_decay_lr:
      return {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"};
    case SchedulerKind::warmup_cosine_lr:
      return {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"};
    case SchedulerKind::one_cycle:
      return {"cycle_min_lr",
              "cycle_max_lr",
              "decay_lr_rate",
              "cycle_first_step_size",
              "cycle_second_step_size",
              "cycle_first_stair_count",
              "cycle_second_stair_count",
              "decay_step_size",
              "cycle_momentum",
              "cycle_min_mom",
              "cycle_max_mom",
              "decay_mom_rate",
              "last_batch_iteration"};
    case SchedulerKind::lr_range_test:
      return {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate", "lr_range_test_staircase", "last_batch_iteration"};
    default:
      return {};
  }
}

}  // namespace

SectionSpec scheduler_section_spec() {
  return make_section("scheduler", Regime::dict_lookup, "The learning-rate schedule.",
                      {
                          string_field("type", nullptr,
                                       "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or "
                                       "LRRangeTest (case-sensitive)."),
                          object_field("params", "Constructor arguments of the schedule (required)."),
                      });
}

SectionSpec scheduler_params_section_spec() {
  return make_section("scheduler.params", Regime::dict_lookup, "Schedule arguments; which ones are valid depends on scheduler.type.",
                      {
                          number_field("warmup_min_lr", 0.0, "Warm-up start lr (WarmupLR, WarmupDecayLR)."),
                          number_field("warmup_max_lr", nullptr, "Warm-up end lr; null = the optimizer lr for WarmupLR, 0.001 for WarmupDecayLR."),
                          int_field("warmup_num_steps", 1000, "Warm-up steps; a positive integer (a JSON 1e3 is rejected).").min(1),
                          string_field("warmup_type", "log", "Warm-up curve: log or linear.").one_of({"log", "linear"}),
                          int_field("last_batch_iteration", -1, "Iteration to resume from; -1 = start."),
                          int_field("total_num_steps", nullptr, "Total optimizer steps (required by WarmupDecayLR/WarmupCosineLR).").min(1),
                          number_field("warmup_min_ratio", 0.0, "WarmupCosineLR: start ratio of the base lr."),
                          number_field("cos_min_ratio", 0.0001, "WarmupCosineLR: final ratio of the base lr."),
                          number_field("cycle_min_lr", nullptr, "OneCycle: lowest lr (required)."),
                          number_field("cycle_max_lr", nullptr, "OneCycle: highest lr (required)."),
                          number_field("decay_lr_rate", 0.0, "OneCycle: lr decay rate after the cycle."),
                          int_field("cycle_first_step_size", 2000, "OneCycle: steps of the rising half (> 0).").min(1),
                          int_field("cycle_second_step_size", nullptr, "OneCycle: steps of the falling half; null = first.").min(0),
                          int_field("cycle_first_stair_count", 0, "OneCycle: stairs in the rising half."),
                          int_field("cycle_second_stair_count", nullptr, "OneCycle: stairs in the falling half; null = first."),
                          int_field("decay_step_size", 0, "OneCycle: steps per decay interval."),
                          bool_field("cycle_momentum", true, "OneCycle: cycle beta1 (forces beta2 = 0.99)."),
                          number_field("cycle_min_mom", 0.8, "OneCycle: lowest beta1."),
                          number_field("cycle_max_mom", 0.9, "OneCycle: highest beta1."),
                          number_field("decay_mom_rate", 0.0, "OneCycle: momentum decay rate."),
                          number_field("lr_range_test_min_lr", 1e-3, "LRRangeTest: start lr."),
                          int_field("lr_range_test_step_size", 2000, "LRRangeTest: steps per increase (positive).").min(1),
                          number_field("lr_range_test_step_rate", 1.0, "LRRangeTest: increase rate."),
                          bool_field("lr_range_test_staircase", false, "LRRangeTest: staircase increase."),
                      });
}

SchedulerConfig parse_scheduler_config(const Json* value, std::optional<double> optimizer_lr, ParseContext& ctx, Json& resolved) {
  SchedulerConfig c;
  if (value == nullptr || value->is_null()) {
    resolved = nullptr;
    return c;
  }
  Json head = read_section(*value, scheduler_section_spec(), ctx);
  if (head["type"].is_null()) fail("scheduler.type is missing: name the schedule, e.g. \"type\": \"WarmupLR\"");
  c.type = head["type"].get<std::string>();
  if (c.type == "WarmupLR")
    c.kind = SchedulerKind::warmup_lr;
  else if (c.type == "WarmupDecayLR")
    c.kind = SchedulerKind::warmup_decay_lr;
  else if (c.type == "WarmupCosineLR")
    c.kind = SchedulerKind::warmup_cosine_lr;
  else if (c.type == "OneCycle")
    c.kind = SchedulerKind::one_cycle;
  else if (c.type == "LRRangeTest")
    c.kind = SchedulerKind::lr_range_test;
  else if (std::find(kTorchSchedulers.begin(), kTorchSchedulers.end(), c.type) != kTorchSchedulers.end())
    c.kind = SchedulerKind::unsupported;
  else {
    const std::string guess = closest_key(c.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
    fail(
        "scheduler.type is \"{}\": DeepSpeed does not recognize LR scheduler {}{}; valid: WarmupLR, WarmupDecayLR, "
        "WarmupCosineLR, OneCycle, LRRangeTest (case-sensitive)",
        c.type, c.type, guess.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", guess));
  }
  if (head["params"].is_null())
    fail(
        "scheduler.params is missing: DeepSpeed constructs {}(optimizer, **params) and fails without it; add "
        "\"params\": {{}} to use the defaults",
        c.type);
  const Json& raw = head["params"];
  c.raw_params = raw;
  resolved = Json{{"type", c.type}, {"params", raw}};
  if (c.kind == SchedulerKind::unsupported) {
    ctx.warn("scheduler.type", fmt::format("dstrain does not provide the torch scheduler {}; the scheduler section is "
                                           "kept as given but not applied. Use WarmupLR, WarmupDecayLR, "
                                           "WarmupCosineLR, OneCycle or LRRangeTest",
                                           c.type));
    return c;
  }
  const std::vector<std::string> valid = params_for(c.kind);
  for (const auto& [key, v] : raw.items()) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) continue;
    const std::string guess = closest_key(key, valid);
    fail(
        "scheduler.params.{}: {} does not take a parameter named \"{}\" (DeepSpeed fails with \"unexpected keyword "
        "argument\"){}; valid parameters: {}",
        key, c.type, key, guess.empty() ? "" : fmt::format("; did you mean \"{}\"?", guess), fmt::format("{}", fmt::join(valid, ", ")));
  }
  // warmup_num_steps must be a positive int since v0.19.3: a JSON 1e3 (a float) is rejected, unlike
  // other integer keys in this section.
  if (raw.contains("warmup_num_steps") && raw["warmup_num_steps"].is_number_float())
    fail(
        "scheduler.params.warmup_num_steps is {}: it must be a positive integer written without a decimal point or "
        "exponent (DeepSpeed v0.19.3+ rejects floats such as 1e3); write {}",
        show(raw["warmup_num_steps"]), fmt::format("{:.0f}", raw["warmup_num_steps"].get<double>()));
  // LRRangeTest checks isinstance(lr_range_test_step_size, int) too (ValueError at construction).
  if (raw.contains("lr_range_test_step_size") && raw["lr_range_test_step_size"].is_number_float())
    fail(
        "scheduler.params.lr_range_test_step_size is {}: lr_range_test_step_size must be a positive integer, got {} (DeepSpeed's "
        "ValueError: a float such as 1e3 or 1000.0 is not an int); write it without a decimal point or exponent",
        show(raw["lr_range_test_step_size"]), show(raw["lr_range_test_step_size"]));
  Json all = read_section(raw, scheduler_params_section_spec(), ctx);
  auto& p = c.params;
  p.warmup_min_lr = all["warmup_min_lr"].get<double>();
  p.warmup_num_steps = all["warmup_num_steps"].get<std::int64_t>();
  p.warmup_type = all["warmup_type"].get<std::string>();
  p.last_batch_iteration = all["last_batch_iteration"].get<std::int64_t>();
  if (!all["total_num_steps"].is_null()) p.total_num_steps = all["total_num_steps"].get<std::int64_t>();
  p.warmup_min_ratio = all["warmup_min_ratio"].get<double>();
  p.cos_min_ratio = all["cos_min_ratio"].get<double>();
  p.decay_lr_rate = all["decay_lr_rate"].get<double>();
  p.cycle_first_step_size = all["cycle_first_step_size"].get<std::int64_t>();
  p.cycle_second_step_size = all["cycle_second_step_size"].is_null() ? p.cycle_first_step_size : all["cycle_second_step_size"].get<std::int64_t>();
  p.cycle_first_stair_count = all["cycle_first_stair_count"].get<std::int64_t>();
  p.cycle_second_stair_count =
      all["cycle_second_stair_count"].is_null() ? p.cycle_first_stair_count : all["cycle_second_stair_count"].get<std::int64_t>();
  p.decay_step_size = all["decay_step_size"].get<std::int64_t>();
  p.cycle_momentum = all["cycle_momentum"].get<bool>();
  p.cycle_min_mom = all["cycle_min_mom"].get<double>();
  p.cycle_max_mom = all["cycle_max_mom"].get<double>();
  p.decay_mom_rate = all["decay_mom_rate"].get<double>();
  p.lr_range_test_min_lr = all["lr_range_test_min_lr"].get<double>();
  p.lr_range_test_step_size = all["lr_range_test_step_size"].get<std::int64_t>();
  p.lr_range_test_step_rate = all["lr_range_test_step_rate"].get<double>();
  p.lr_range_test_staircase = all["lr_range_test_staircase"].get<bool>();

  // warmup_max_lr: WarmupLR inherits the optimizer lr (v0.17.2+); WarmupDecayLR keeps 0.001.
  if (!all["warmup_max_lr"].is_null()) {
    p.warmup_max_lr = all["warmup_max_lr"].get<double>();
  } else if (c.kind == SchedulerKind::warmup_lr) {
    p.warmup_max_lr = optimizer_lr.value_or(1e-3);
  } else {
    p.warmup_max_lr = 1e-3;
  }
  all["warmup_max_lr"] = p.warmup_max_lr;
  all["cycle_second_step_size"] = p.cycle_second_step_size;
  all["cycle_second_stair_count"] = p.cycle_second_stair_count;

  const bool needs_total = c.kind == SchedulerKind::warmup_decay_lr || c.kind == SchedulerKind::warmup_cosine_lr;
  if (needs_total && !p.total_num_steps)
    fail("scheduler.params.total_num_steps is missing: {} requires it (the number of optimizer steps of the run)", c.type);
  if (needs_total && *p.total_num_steps < p.warmup_num_steps)
    ctx.warn("scheduler.params.total_num_steps",
             fmt::format("total_num_steps {} is less than warmup_num_steps {}", *p.total_num_steps, p.warmup_num_steps));
  if (c.kind == SchedulerKind::one_cycle) {
    if (all["cycle_min_lr"].is_null() || all["cycle_max_lr"].is_null())
      fail("scheduler.params: OneCycle requires cycle_min_lr and cycle_max_lr (missing: {})",
           all["cycle_min_lr"].is_null() ? "cycle_min_lr" : "cycle_max_lr");
    p.cycle_min_lr = all["cycle_min_lr"].get<double>();
    p.cycle_max_lr = all["cycle_max_lr"].get<double>();
  }
  if (c.kind == SchedulerKind::one_cycle && p.decay_step_size < 0) fail("scheduler.params.decay_step_size is {}: it must be >= 0", p.decay_step_size);

  Json out = Json::object();
  for (const auto& k : valid) out[k] = all[k];
  resolved["params"] = out;
  return c;
}

}  // namespace dstrain::config
