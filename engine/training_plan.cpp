#include "engine/training_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "engine/data/byte_tokenizer.h"
#include "engine/data/data_loader.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/flops_report.h"
#include "ops/error.h"
#include "zero/launcher_communicator.h"

namespace dstrain {
namespace {

void require_file(const std::filesystem::path& path, const char* option) {
  if (!std::filesystem::is_regular_file(path)) {
    const std::string_view o(option);
    fail("{} {}: no such file; {}", option, path.string(),
         o == "--data" || o == "--val-data"
             ? "make token files with `dstrain prepare-data` (scripts/setup.sh makes data/brown_train.bin and data/brown_val.bin)"
             : "give the path of an existing file");
  }
}

// The launcher's environment: world size 1 (and launcher "none") when there is none. A process
// started as one of several ranks trains over NCCL, which needs --device cuda.
LaunchEnv launcher_env(Device device) {
  LaunchEnv env;
  try {
    env = detect_launch_env();
  } catch (const Error& e) {
    fail("the launcher's environment does not describe a rank ({}); start dstrain train without a launcher (--num-ranks N runs N ranks as "
         "threads of one process), or fix the launcher's variables",
         e.what());
  }
  if (env.world_size > 1 && device.is_cpu()) {
    fail("this process was started by a launcher as one of {} ranks ({}): on the cpu dstrain's ranks are threads of one process and cannot "
         "join other processes; give --device cuda (NCCL, one GPU per rank), or start one process without the launcher and give --num-ranks {}",
         env.world_size, env.str(), env.world_size);
  }
  return env;
}

}  // namespace

void trainer_print(const TrainerOptions& options, std::string_view line) {
  if (options.print) {
    options.print(line);
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void trainer_warn(const TrainerOptions& options, std::string_view text) {
  if (options.warn) {
    options.warn(text);
    return;
  }
  std::fprintf(stderr, "warning: %.*s\n", static_cast<int>(text.size()), text.data());
}

TrainingPlan plan_training(const ConfigText& config_text, const std::string& model_spec, const TrainerOptions& options) {
  TrainingPlan plan;
  plan.model_spec = model_spec;
  if (options.num_ranks < 1) {
    fail("--num-ranks {}: must be >= 1 (the number of data-parallel ranks, run as threads of this process)", options.num_ranks);
  }
  // --device: "cuda" alone means the launcher's local rank (cuda:0 without a launcher, and when
  // the launcher shows each process only its own GPU).
  plan.device = parse_device(options.device);
  const bool explicit_ordinal = options.device.find(':') != std::string::npos;
  plan.launch = launcher_env(plan.device);
  if (plan.device.is_cuda() && !explicit_ordinal) plan.device = launcher_device(plan.launch);
  // A launcher with a GPU per process: NCCL over its ranks (also at world size 1).
  plan.launcher_group = plan.device.is_cuda() && plan.launch.launcher != "none";
  if (plan.launcher_group && options.num_ranks > 1) {
    fail("--num-ranks {} with a launcher ({}): the launcher's processes are the ranks; drop --num-ranks", options.num_ranks, plan.launch.str());
  }
  plan.world = plan.launcher_group ? plan.launch.world_size : static_cast<int>(options.num_ranks);
  if (options.steps && *options.steps < 0) fail("--steps {}: must be >= 0", *options.steps);
  require_file(options.data, "--data");
  if (!options.val_data.empty()) require_file(options.val_data, "--val-data");
  if (!options.init_from.empty()) require_file(options.init_from, "--init-from");

  // ---- config: resolved for the world size (train_batch_size = micro x GAS x world); --steps
  // fills "auto" total_num_steps of a scheduler, --warmup-steps its warmup_num_steps ----
  config::ConfigOptions config_options;
  config_options.world_size = plan.world;
  config_options.autos = options.autos;
  if (!config_options.autos.total_num_steps) config_options.autos.total_num_steps = options.steps;
  if (!config_options.autos.warmup_num_steps) config_options.autos.warmup_num_steps = options.warmup_steps;
  plan.config = config::parse_ds_config(config_text.tree, config_options);
  for (const config::Warning& w : plan.config.warnings) trainer_warn(options, fmt::format("{}{}{}", w.path, w.path.empty() ? "" : ": ", w.message));
  const config::DsConfig& cfg = plan.config;

  // The flops profiler's peak, measured once here rather than on rank 0 while the others wait.
  plan.peak_flops = options.peak_flops;
  plan.peak_measured = cfg.flops_profiler.enabled && plan.peak_flops <= 0.0;
  if (plan.peak_measured) {
    plan.peak_flops = measure_gemm_flops(plan.device, cfg.fp16.enabled ? DType::fp16 : cfg.bf16.enabled ? DType::bf16 : DType::fp32);
  }

  // ---- the model's shape and the sequence length ----
  plan.model = model_config_from_spec(model_spec);
  validate(plan.model);
  const Gpt2Config& g = plan.model;
  const std::int64_t T = options.sequence_length ? *options.sequence_length : std::min<std::int64_t>(g.n_positions, 1024);
  if (T < 1 || T > g.n_positions) {
    fail("--sequence-length {}: must be between 1 and the model's n_positions = {} (give a model with more positions, e.g. a -T<n> descriptor)", T,
         g.n_positions);
  }
  plan.sequence_length = T;
  if (!options.tokenizer.empty()) {
    const std::int64_t tv = options.tokenizer == "gpt2" ? Gpt2Tokenizer::kVocabSize : ByteTokenizer().vocab_size();
    if (g.vocab_size < tv) {
      fail("--tokenizer {} has {} tokens but the model {} has a vocabulary of {}; give a model with -V{} (or more)", options.tokenizer, tv, model_spec,
           g.vocab_size, tv);
    }
  }

  // ---- the training file: its windows give the length of an epoch ----
  {
    DataLoaderOptions dlo;
    dlo.micro_batch_size = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
    dlo.sequence_length = static_cast<std::size_t>(T);
    dlo.gradient_accumulation_steps = static_cast<int>(cfg.gradient_accumulation_steps);
    dlo.world_size = plan.world;
    dlo.rank = 0;
    const DataLoader loader = DataLoader::open(options.data, dlo);
    plan.window_count = static_cast<std::int64_t>(loader.window_count());
  }
  plan.epoch_steps = std::max<std::int64_t>(1, plan.window_count / cfg.train_batch_size);
  plan.steps_from_epoch = !options.steps.has_value();
  plan.steps = options.steps ? *options.steps : plan.epoch_steps;

  if (cfg.steps_per_print && *cfg.steps_per_print > 0) {
    plan.print_every = *cfg.steps_per_print;
  } else {
    plan.print_every = 10;
    plan.print_every_defaulted = true;
  }
  return plan;
}

}  // namespace dstrain
