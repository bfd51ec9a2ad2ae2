#include "estimate_memory_command.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <dstrain/dstrain.h>
#include <fmt/format.h>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

struct EstimateMemoryArgs {
  std::string config;
  std::string model;
  std::int64_t num_ranks = 1;
  std::optional<std::int64_t> pipeline_stages;  // --pipeline-stages, as train's
  std::optional<std::int64_t> sequence_length;
  AutoValueArgs autos;
};

void run_estimate_memory(const EstimateMemoryArgs& args) {
  const ConfigText text = load_config_argument(args.config);
  std::shared_ptr<const Architecture> model = model_architecture(args.model);

  // The config as `train` resolves it for this world size: the model's width fills "auto" hidden
  // sizes, and a config without an optimizer block trains with the HF Trainer's AdamW.
  config::ConfigOptions options;
  options.world_size = args.num_ranks;
  options.pipeline_stages = args.pipeline_stages;
  options.autos = to_auto_values(args.autos);
  if (!options.autos.hidden_size) {
    options.autos.hidden_size = model->n_embd();
    options.autos.hidden_size_from_model = true;
  }
  const bool has_optimizer = text.tree.is_object() && text.tree.contains("optimizer") && !text.tree["optimizer"].is_null();
  if (!has_optimizer) options.default_optimizer = config::default_optimizer_block(options.autos);
  const config::DsConfig cfg = config::parse_ds_config(text.tree, options);
  for (const config::Warning& w : cfg.warnings)
    std::fprintf(stderr, "warning: %s%s%s\n", w.path.c_str(), w.path.empty() ? "" : ": ", w.message.c_str());

  // The config's expert_parallel routing keys against the model, as train reads them (refused here
  // what train refuses: a dense model, a preset of another model_type, ...; the shape is the same).
  std::vector<std::string> ep_lines;
  {
    ExpertParallelPlan ep = plan_expert_parallel(model, cfg.expert_parallel);
    model = std::move(ep.model);
    ep_lines = std::move(ep.lines);
  }

  const std::int64_t T = args.sequence_length ? *args.sequence_length : std::min<std::int64_t>(model->n_positions(), 1024);
  model->check_sequence(T, Device::cpu());
  // The device mesh of the config over --num-ranks (docs/parallelism.md §1): the figures are one
  // rank's of it, and what train refuses of the mesh is refused here too.
  const MeshShape mesh = make_mesh_shape(static_cast<int>(cfg.world_size), static_cast<int>(cfg.tensor_parallel_size),
                                         static_cast<int>(cfg.sequence_parallel_world_size), static_cast<int>(cfg.pipeline_parallel_size),
                                         cfg.expert_parallel.ep_size());
  if (mesh.ep > 1) model->check_expert_parallel(mesh.ep);
  if (mesh.tp > 1) model->check_tensor_parallel(mesh.tp);
  if (mesh.sp > 1) {
    model->check_sequence_parallel(mesh.sp, mesh.tp);
    if (T % mesh.sp != 0) {
      fail(
          "sequence_parallel_size {}: the sequence length {} does not divide by it (each sequence-parallel rank holds T / {} tokens); give "
          "--sequence-length {}",
          mesh.sp, T, mesh.sp, T / mesh.sp * mesh.sp > 0 ? T / mesh.sp * mesh.sp : mesh.sp);
    }
  }
  // With pipeline stages a rank holds its stage's layers: the figures are the heaviest stage's rank,
  // as train's pre-flight checks them (train/pipeline_plan.h; refused here what train refuses).
  MemoryEstimate e = estimate_rank_memory(*model, cfg, T);
  std::string pipeline_line;
  if (mesh.pp > 1) {
    std::vector<std::string> warnings;
    (void)check_pipeline_config(cfg, 1, "", warnings);
    for (const std::string& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    if (model->n_layer() > 65534) fail("{} has more than 65536 layers; the engine trains at most 65536", args.model);
    const StageParts parts = partition_layers(model->make_layers(), static_cast<std::size_t>(mesh.pp), cfg.pipeline.partition);
    std::vector<double> experts;
    const std::vector<double> params = pipeline_stage_parameters(*model, cfg, parts, mesh.pp, &experts);
    int heaviest = 0;
    for (int s = 0; s < mesh.pp; ++s) {
      const MemoryEstimate es = estimate_pipeline_stage_memory(*model, cfg, T, params, s, false, experts);
      if (s == 0 || es.device() + es.host() > e.device() + e.host()) {
        e = es;
        heaviest = s;
      }
    }
    pipeline_line = fmt::format("pipeline: {} stages (partition \"{}\", 1F1B); the figures are stage {}'s, the heaviest: {} parameters per rank\n",
                                mesh.pp, cfg.pipeline.partition, heaviest, format_count(params[static_cast<std::size_t>(heaviest)]));
  }
  const config::StatePlacement& placement = cfg.placement();

  std::string out = fmt::format("model {}: {}\n", args.model, model->describe());
  for (const std::string& line : ep_lines) out += line + "\n";
  out += fmt::format("config {}: ZeRO stage {}, {}, {} rank(s), micro-batch {} x T {}, optimizer {} (in {}), parameters in {}\n", text.origin,
                     cfg.zero_optimization.stage, config::to_string(cfg.precision()), cfg.world_size, cfg.train_micro_batch_size_per_gpu, T,
                     cfg.optimizer.type, state_home_name(placement.optimizer), state_home_name(placement.params));
  const bool meshed = mesh.tp > 1 || mesh.sp > 1 || mesh.pp > 1 || mesh.ep > 1;
  if (meshed) {
    out += fmt::format("mesh: {}; ZeRO partitions over the {} data-parallel x sequence-parallel ranks of a tensor-parallel index{}{}\n",
                       describe_mesh(mesh), mesh.dp * mesh.sp, mesh.pp > 1 ? " of a stage" : "",
                       mesh.ep > 1 ? fmt::format(", the experts over the {} ranks holding the same ones", mesh.edp() * mesh.sp) : std::string());
  }
  out += pipeline_line;
  if (mesh.ep > 1) {
    out += fmt::format("expert-parallel rank 0 stores 1/{} of the experts ({} parameters) and the rest whole{}: {} of the {} parameters\n",
                       mesh.ep, format_count(e.expert_parameters), mesh.tp > 1 ? " or its tensor-parallel pieces" : "",
                       format_count(e.rank_parameters), format_count(e.parameters));
  }
  if (mesh.tp > 1) {
    out += fmt::format(
        "tensor-parallel rank 0 (the largest) stores {} of the {} parameters: its pieces of the cut ones, the replicated ones "
        "whole\n",
        format_count(e.rank_parameters), format_count(e.parameters));
  }
  out +=
      fmt::format("\ndstrain's estimate per rank{} (the lower bound train's pre-flight checks against the memory there is; docs/offload.md §11):\n",
                  meshed ? " of the mesh" : "");
  const auto row = [&out](const char* purpose, double device, double host, double nvme) {
    out += fmt::format("  {:<12} {:>12} {:>12} {:>12}\n", purpose, format_estimate_bytes(device), format_estimate_bytes(host),
                       format_estimate_bytes(nvme));
  };
  out += fmt::format("  {:<12} {:>12} {:>12} {:>12}\n", "purpose", "device", "host", "nvme");
  row("params", e.params_device, e.params_host, e.params_nvme);
  row("grads", e.grads, 0.0, 0.0);
  row("optimizer", e.optimizer_device, e.optimizer_host, e.optimizer_nvme);
  row("activations", e.activations, 0.0, 0.0);
  row("total", e.device(), e.host(), e.params_nvme + e.optimizer_nvme);
  out +=
      "  (device: the training device's memory — on the CPU the same memory as host; nvme: swap files under nvme_path, in no memory;\n"
      "   optimizer: the fp32 masters kept apart from the params and the optimizer's states; activations: at least the logits of one "
      "micro-batch)\n";
  if (mesh.tp > 1 || mesh.sp > 1) {
    out += fmt::format("  (the logits: {}{}{})\n", mesh.sp > 1 ? fmt::format("the rank's T / {} tokens", mesh.sp) : std::string("T tokens"),
                       mesh.tp > 1 ? fmt::format(", the rank's vocabulary rows (padded vocabulary / {}, rounded up)", mesh.tp) : std::string(),
                       mesh.sp > 1 ? ", one tile of ALST's tiled loss (at most 64 MiB, at least one position)" : "");
  }

  // DeepSpeed's estimate for the same model: its total (the real vocabulary, tied weights once)
  // and largest module, on one node of num_ranks GPUs.
  const double total = model->parameter_count();
  const bool zero3 = cfg.zero_optimization.stage == 3;
  const double largest = static_cast<double>(largest_module_params(model->forward_flops(1, 1)));
  const auto rows = zero3 ? deepspeed_zero3_estimates(total, largest, cfg.world_size, 1) : deepspeed_zero2_estimates(total, cfg.world_size, 1);
  out += fmt::format(
      "\nDeepSpeed's estimate of the model states (params, gradients, optimizer states), as its\n"
      "estimate_zero{}_model_states_mem_needs_all_cold(total_params={:.0f}{}, num_gpus_per_node={}, num_nodes=1) prints it{}:\n",
      zero3 ? 3 : 2, total, zero3 ? fmt::format(", largest_layer_params={:.0f}", largest) : "", cfg.world_size,
      zero3 || cfg.zero_optimization.stage == 2
          ? ""
          : " (its ZeRO-2 formulas; the config is at stage " + std::to_string(cfg.zero_optimization.stage) + ")");
  // The row of this config's offload (ZeRO-3: built with deepspeed.zero.Init, as the HF integration does).
  int marked = -1;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const DeepSpeedStatesEstimate& r = rows[i];
    if (r.offload_optimizer == (placement.optimizer != StateHome::device) &&
        (!zero3 || (r.offload_param == (placement.params != StateHome::device) && r.zero_init))) {
      marked = static_cast<int>(i);
      break;
    }
  }
  out += format_deepspeed_estimates(rows, total, largest, cfg.world_size, 1, zero3, marked);
  out += "(DeepSpeed's figures assume 16-bit params and Adam; its CPU column is per node, and counts the model's load into host memory.)\n";
  if (meshed) {
    out += fmt::format("(They know no tensor, sequence, pipeline or expert parallelism: the whole model's states over all {} ranks.)\n", cfg.world_size);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void add_estimate_memory_command(CLI::App& app) {
  auto args = std::make_shared<EstimateMemoryArgs>();
  CLI::App* cmd = app.add_subcommand("estimate-memory",
                                     "Print the memory per rank a training run needs, by purpose (params, grads, optimizer, activations) and "
                                     "location (device, host, NVMe), as train's pre-flight estimates it, beside DeepSpeed's "
                                     "estimate_zero2/zero3_model_states_mem_needs for the same model");
  cmd->add_option("--deepspeed_config,--deepspeed,--deepspeed-config", args->config,
                  "ds_config file, JSON string, or base64 of one (as the deepspeed launcher passes)")
      ->required();
  cmd->add_option("--model", args->model, "Model spec, as train's --model (gpt2:d12, llama:L4-C256-H4, a config.json, ...)")->required();
  cmd->add_option("--num-ranks", args->num_ranks, "Number of ranks (the data-parallel world size the config is resolved for)")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--pipeline-stages", args->pipeline_stages, "Pipeline stages (as train's; overrides pipeline.stages)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--sequence-length", args->sequence_length, "T of every micro-batch (default: the model's positions, at most 1024)")
      ->check(whole_number_at_least(1));
  add_auto_value_options(cmd, args->autos);
  cmd->callback([args] { run_estimate_memory(*args); });
}

}  // namespace dstrain::cli
