#include "check_config_command.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <dstrain/dstrain.h>
#include <fmt/format.h>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

struct CheckConfigArgs {
  std::string config;
  std::int64_t world_size = 1;
  std::optional<std::int64_t> pipeline_stages;  // --pipeline-stages: replaces pipeline.stages, as in `train`
  bool json = false;
  // Values that resolve "auto", named as the HF Trainer arguments they stand for.
  AutoValueArgs autos;
  std::optional<std::int64_t> total_steps, warmup_steps;
};

void run_check_config(const CheckConfigArgs& args) {
  ConfigText text = load_config_argument(args.config);

  config::ConfigOptions options;
  options.world_size = args.world_size;
  options.autos = to_auto_values(args.autos);
  options.autos.total_num_steps = args.total_steps;
  options.autos.warmup_num_steps = args.warmup_steps;
  options.pipeline_stages = args.pipeline_stages;

  config::DsConfig cfg = config::parse_ds_config(text.tree, options);
  // What DeepSpeed accepts but this build's engine does not train is refused as `train` refuses it.
  check_engine_trains(cfg);
  // What a pipeline asks of the rest of the config (ZeRO stage, optimizer, micro-batches), as `train`
  // checks it with the default schedule (train/pipeline_plan.h).
  {
    std::vector<std::string> pipeline_warnings;
    (void)check_pipeline_config(cfg, 1, "", pipeline_warnings);
    for (std::string& w : pipeline_warnings) cfg.warnings.push_back({"", std::move(w)});
  }
  // What the config asks of the machine (an nvme_path here) is no fault of the config: it is often
  // checked on a login node for compute nodes that have the drive. Reported, exit 0; train refuses
  // it before step 1 on a machine where it holds.
  const std::vector<std::string> findings = machine_findings(cfg);
  for (const std::string& f : findings) std::fprintf(stderr, "on this machine: %s\n", f.c_str());

  for (const config::Warning& w : cfg.warnings) {
    if (w.path.empty())
      std::fprintf(stderr, "warning: %s\n", w.message.c_str());
    else
      std::fprintf(stderr, "warning: %s: %s\n", w.path.c_str(), w.message.c_str());
  }
  for (const std::string& r : cfg.resolved_autos) std::fprintf(stderr, "auto: %s\n", r.c_str());

  if (args.json) {
    std::string out = cfg.to_json().dump(2);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::string out =
        fmt::format("{} ({}) is valid for a world size of {}.\n\n{}", args.config.size() > 80 ? args.config.substr(0, 77) + "..." : args.config,
                    text.origin, args.world_size, cfg.summary());
    if (!out.empty() && out.back() != '\n') out += '\n';
    if (!findings.empty()) {
      out += fmt::format(
          "\nOn this machine, {} finding{} (above, \"on this machine:\"): `dstrain train` refuses to start here until {} fixed; "
          "on a machine where the paths hold, it trains.\n",
          findings.size(), findings.size() == 1 ? "" : "s", findings.size() == 1 ? "it is" : "they are");
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
}

}  // namespace

void add_check_config_command(CLI::App& app) {
  auto args = std::make_shared<CheckConfigArgs>();
  CLI::App* cmd = app.add_subcommand("check-config",
                                     "Validate a DeepSpeed config as DeepSpeed 0.19 reads it and print it resolved "
                                     "(exit 0 when valid, 2 when invalid; what this machine lacks, such as an nvme_path, is reported, exit 0)");
  cmd->add_option("config", args->config, "ds_config file, JSON string, or base64 of one (as the deepspeed launcher passes)")->required();
  cmd->add_option("--world-size", args->world_size,
                  "Number of ranks = data-parallel x sequence-parallel (sequence_parallel_size) x tensor-parallel "
                  "(tensor_parallel.autotp_size); the batch keys count data-parallel ranks")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--pipeline-stages", args->pipeline_stages,
                  "Pipeline stages, as `train --pipeline-stages` gives them (replaces pipeline.stages); data-parallel = world / (stages x "
                  "tensor-parallel x sequence-parallel)")
      ->check(whole_number_at_least(1));
  cmd->add_flag("--json", args->json, "Print the resolved config as JSON on stdout (canonical key names)");

  add_auto_value_options(cmd, args->autos);
  const char* auto_group = "Values for \"auto\" keys (as the HF Trainer fills them)";
  cmd->add_option("--steps", args->total_steps, "scheduler total_num_steps (optimizer steps of the run)")
      ->group(auto_group)
      ->check(whole_number_at_least(1));
  cmd->add_option("--warmup-steps", args->warmup_steps, "scheduler warmup_num_steps")->group(auto_group)->check(whole_number_at_least(1));

  cmd->callback([args] { run_check_config(*args); });
}

}  // namespace dstrain::cli
