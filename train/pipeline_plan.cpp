#include "train/pipeline_plan.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include <fmt/format.h>

#include "models/stage_partition.h"
#include "ops/error.h"
#include "train/memory_estimate.h"
#include "train/progress.h"

namespace dstrain {
namespace {

// Where the stage count came from, for messages.
std::string stages_flag(const TrainerOptions& options) { return options.pipeline_stages > 0 ? "--pipeline-stages" : "pipeline.stages"; }

std::string schedule_title(const std::string& s) {
  return s == "interleaved" ? "interleaved 1F1B" : s == "gpipe" ? "GPipe: all forwards, then all backwards" : "1F1B";
}

// "21.3M", "1.24B"; exact (grouped) below a million, so small models read as their hand count.
std::string parameters_figure(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  return format_count(n);
}

// "h.3" -> ("h.", 3); nullopt for a name without a trailing number.
std::optional<std::pair<std::string, long long>> numbered(const std::string& name) {
  std::size_t i = name.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(name[i - 1]))) --i;
  if (i == name.size() || name.size() - i > 15) return std::nullopt;
  return std::make_pair(name.substr(0, i), std::stoll(name.substr(i)));
}

// "embedding, h.0-h.2, head": runs of consecutively numbered names folded.
std::string layer_names(const std::vector<std::unique_ptr<Layer>>& layers, std::size_t begin, std::size_t end) {
  std::string out;
  std::size_t i = begin;
  while (i < end) {
    std::size_t j = i + 1;
    const auto first = numbered(layers[i]->name());
    if (first) {
      while (j < end) {
        const auto next = numbered(layers[j]->name());
        if (!next || next->first != first->first || next->second != first->second + static_cast<long long>(j - i)) break;
        ++j;
      }
    }
    out += out.empty() ? "" : ", ";
    out += j - i > 1 ? fmt::format("{}-{}", layers[i]->name(), layers[j - 1]->name()) : layers[i]->name();
    i = j;
  }
  return out;
}

std::string layer_range(std::size_t begin, std::size_t end) {
  return end - begin == 1 ? fmt::format("layer {}", begin) : fmt::format("layers {}-{}", begin, end - 1);
}

// The layer count without building every block where the family can copy its shape with one block.
std::size_t layer_count(const Architecture& model) {
  if (const auto one = model.with_n_layer(1)) return one->make_layers().size() + static_cast<std::size_t>(model.n_layer() - 1);
  return model.make_layers().size();
}

}  // namespace

PipelineSchedule check_pipeline_config(const config::DsConfig& cfg, int virtual_stages, const std::string& schedule,
                                       std::vector<std::string>& warnings) {
  const std::int64_t P = cfg.pipeline_parallel_size, M = cfg.gradient_accumulation_steps;
  const int V = virtual_stages;
  if (V < 1) fail("--pipeline-virtual-stages {}: must be >= 1 (1: one chunk of the model per stage; V > 1: Megatron's interleaved 1F1B)", V);
  if (!schedule.empty() && schedule != "1f1b" && schedule != "interleaved" && schedule != "gpipe")
    fail("--pipeline-schedule {}: must be 1f1b, interleaved (with --pipeline-virtual-stages V > 1) or gpipe", schedule);
  PipelineSchedule s;
  s.virtual_stages = V;
  s.schedule = !schedule.empty() ? schedule : V > 1 ? "interleaved" : "1f1b";
  if (V > 1 && s.schedule != "interleaved")
    fail(
        "--pipeline-schedule {} with --pipeline-virtual-stages {}: virtual stages need the interleaved 1F1B schedule (each rank runs {} "
        "chunks of the model); give --pipeline-schedule interleaved (or leave it out), or --pipeline-virtual-stages 1 for {}",
        s.schedule, V, V, s.schedule);
  if (V == 1 && s.schedule == "interleaved")
    fail(
        "--pipeline-schedule interleaved with --pipeline-virtual-stages 1: the interleaved schedule runs V >= 2 chunks of the model per rank "
        "(with one it is 1F1B); give --pipeline-virtual-stages 2 (or more), or --pipeline-schedule 1f1b");
  if (P <= 1) {
    if (V > 1)
      fail(
          "--pipeline-virtual-stages {} without pipeline stages: virtual stages split each pipeline stage's layers into chunks; give "
          "--pipeline-stages N (N >= 2, or pipeline.stages), or drop --pipeline-virtual-stages",
          V);
    if (!schedule.empty())
      warnings.push_back(fmt::format("--pipeline-schedule {} has no effect without pipeline stages; give --pipeline-stages N (N >= 2)", schedule));
    return s;
  }
  if (V > 1 && M % P != 0)
    fail(
        "--pipeline-virtual-stages {} with gradient_accumulation_steps {} (the micro-batches per step) and {} pipeline stages: the interleaved "
        "schedule runs the micro-batches in groups of one per stage, so their number must be a multiple of the stage count (Megatron's "
        "requirement); set gradient_accumulation_steps to {} (or another multiple of {}), or --pipeline-virtual-stages 1",
        V, M, P, (M / P + 1) * P, P);
  if (cfg.zero_optimization.stage >= 3)
    fail(
        "zero_optimization.stage 3 with {} pipeline stages: ZeRO-3 would gather each stage's parameters for every micro-batch's forward and "
        "again for its backward, 2 x gradient_accumulation_steps = {} all-gathers of the stage's parameters per step instead of once (which is "
        "why DeepSpeed's PipelineEngine refuses ZeRO-2 and ZeRO-3 with pipelines); dstrain runs ZeRO stages 0-2 with a pipeline. Fix: set "
        "zero_optimization.stage to 0, 1 or 2",
        P, 2 * M);
  if (cfg.zero_optimization.stage == 2)
    warnings.push_back(fmt::format(
        "zero_optimization.stage 2 with {} pipeline stages: DeepSpeed's PipelineEngine asserts ZeRO stage < 2 with a pipeline, so this config "
        "does not run under DeepSpeed; dstrain trains it",
        P));
  if (M < P) {
    const double bubble = static_cast<double>(P - 1) / static_cast<double>(M + P - 1);
    warnings.push_back(fmt::format(
        "gradient_accumulation_steps {} is the micro-batches per step, fewer than the {} pipeline stages: the bubble dominates: (P-1)/(M+P-1) = "
        "{}/{} = {:.0f}% of each step idle; raise gradient_accumulation_steps (to {} or more: at 4 x P the bubble is under 20%)",
        M, P, P - 1, M + P - 1, 100.0 * bubble, 4 * P));
  }
  return s;
}

std::vector<std::string> plan_pipeline(TrainingPlan& plan, const TrainerOptions& options) {
  std::vector<std::string> warnings;
  const config::DsConfig& cfg = plan.config;
  const PipelineSchedule s = check_pipeline_config(cfg, options.pipeline_virtual_stages, options.pipeline_schedule, warnings);
  plan.pipeline_virtual_stages = s.virtual_stages;
  plan.pipeline_schedule = s.schedule;
  plan.pipeline_partition = cfg.pipeline.partition;
  plan.pipeline_checkpoint_interval = cfg.pipeline.activation_checkpoint_interval;
  const Architecture& model = *plan.model;
  const int P = plan.mesh.pp;
  if (P <= 1) {
    plan.stage_parts = {0, layer_count(model)};
    return warnings;
  }
  // The partition builds every layer: a descriptor of absurd depth is refused by its count first (the
  // engine's dropout keys address at most 65536 layers), before anything is built.
  if (const std::size_t count = layer_count(model); count > 65536) {
    fail("{} has {} layers; the engine trains at most 65536 (its dropout keys address them), with or without a pipeline. Fix: a model with "
         "fewer blocks",
         plan.model_spec, count);
  }
  const std::vector<std::unique_ptr<Layer>> layers = model.make_layers();
  const std::size_t pieces = static_cast<std::size_t>(P) * static_cast<std::size_t>(s.virtual_stages);
  if (pieces > layers.size()) {
    fail(
        "{} {}{} = {} pieces of the model, but {} has {} layers ({}): every stage needs at least one layer; give at most {} pipeline "
        "stages{}, or a model with more blocks",
        stages_flag(options), P, s.virtual_stages > 1 ? fmt::format(" x --pipeline-virtual-stages {}", s.virtual_stages) : std::string(), pieces,
        plan.model_spec, layers.size(), layer_names(layers, 0, layers.size()), layers.size() / static_cast<std::size_t>(s.virtual_stages),
        s.virtual_stages > 1 ? " x virtual stages in all" : "");
  }
  try {
    plan.stage_parts = partition_layers(layers, pieces, plan.pipeline_partition);
  } catch (const Error& e) {
    throw Error(fmt::format("pipeline.partition \"{}\": {}; give pipeline.partition one of {}", plan.pipeline_partition, e.what(),
                            config::kPipelinePartitionChoices));
  }
  return warnings;
}

std::vector<std::string> describe_pipeline_partition(const TrainingPlan& plan) {
  const int P = plan.mesh.pp, V = plan.pipeline_virtual_stages;
  if (P <= 1 || plan.stage_parts.size() < 2) return {};
  const std::vector<std::unique_ptr<Layer>> layers = plan.model->make_layers();
  std::vector<std::string> lines;
  lines.push_back(fmt::format("pipeline: {} stages{} ({}), partition \"{}\" over {} layers", P,
                              V > 1 ? fmt::format(" x {} virtual stages", V) : std::string(), schedule_title(plan.pipeline_schedule),
                              plan.pipeline_partition, layers.size()));
  std::vector<double> experts;
  const std::vector<double> params = pipeline_stage_parameters(*plan.model, plan.config, plan.stage_parts, P, &experts);
  const std::size_t pieces = plan.stage_parts.size() - 1;
  for (int stage = 0; stage < P; ++stage) {
    const double n = params[static_cast<std::size_t>(stage)];
    const std::string figures =
        fmt::format("{} parameters, ~{}", parameters_figure(n), format_estimate_bytes(estimate_state_memory(n, plan.config, experts[static_cast<std::size_t>(stage)]).per_rank()));
    if (V == 1) {
      const std::size_t b = plan.stage_parts[static_cast<std::size_t>(stage)], e = plan.stage_parts[static_cast<std::size_t>(stage) + 1];
      lines.push_back(fmt::format("stage {}: {} ({}; {})", stage, layer_range(b, e), layer_names(layers, b, e), figures));
      continue;
    }
    std::string chunks;
    for (std::size_t v = static_cast<std::size_t>(stage), chunk = 0; v < pieces; v += static_cast<std::size_t>(P), ++chunk) {
      const std::size_t b = plan.stage_parts[v], e = plan.stage_parts[v + 1];
      chunks += fmt::format("{}chunk {} {} ({})", chunks.empty() ? "" : ", ", chunk, layer_range(b, e), layer_names(layers, b, e));
    }
    lines.push_back(fmt::format("stage {}: {}; {}", stage, chunks, figures));
  }
  return lines;
}

}  // namespace dstrain
