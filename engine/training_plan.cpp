#include "engine/training_plan.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "engine/data/byte_tokenizer.h"
#include "engine/data/data_loader.h"
#include "engine/data/eval_loader.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/run_files.h"
#include "engine/flops_report.h"
#include "engine/memory_estimate.h"
#include "engine/progress.h"
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

// The values of the options, each on its own (their combinations come later).
void check_option_values(const TrainerOptions& o) {
  if (o.num_ranks < 1) {
    fail("--num-ranks {}: must be >= 1 (the number of data-parallel ranks, run as threads of this process)", o.num_ranks);
  }
  if (o.steps && *o.steps < 0) fail("--steps {}: must be >= 0", *o.steps);
  if (o.warmup_steps && *o.warmup_steps < 1) fail("--warmup-steps {}: must be >= 1", *o.warmup_steps);
  if (o.val_interval < 0) fail("--val-interval {}: must be >= 0 (0: evaluate only at the end)", o.val_interval);
  if (o.val_batches < 0) fail("--val-batches {}: must be >= 0 (0: the whole val file)", o.val_batches);
  if (o.sample_tokens < 0) fail("--sample-tokens {}: must be >= 0 (0: no samples)", o.sample_tokens);
  if (o.sample_top_k < 0) fail("--sample-top-k {}: must be >= 0 (0: the whole vocabulary)", o.sample_top_k);
  // The sampler divides float logits by the temperature: it must be a finite float.
  if (!std::isfinite(o.sample_temperature) || o.sample_temperature < 0.0 || o.sample_temperature > static_cast<double>(FLT_MAX)) {
    fail("--sample-temperature {}: must be a finite number between 0 (greedy) and {:g}; 1 samples the model's own distribution",
         o.sample_temperature, static_cast<double>(FLT_MAX));
  }
  if (!std::isfinite(o.peak_flops) || o.peak_flops < 0.0) {
    fail("--peak-flops {}: must be a finite number of FLOP/s >= 0 (0: measure one GEMM)", o.peak_flops);
  }
  for (const std::int64_t s : o.inject_overflow) {
    if (s < 1) fail("--inject-overflow {}: optimizer steps count from 1", s);
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

// A PMIx launcher (prterun, srun --mpi=pmix) sets PMIX_RANK but no world size in the environment
// (zero/launch_env.h): with none of the launchers detect_launch_env knows, each such process would
// train alone as rank 0 of 1.
void refuse_unsized_launcher(const LaunchEnv& env) {
  if (env.launcher != "none") return;
  if (const char* pmix = std::getenv("PMIX_RANK")) {
    fail("PMIX_RANK={} is set: a PMIx launcher (prterun, srun --mpi=pmix) started this process, but its environment gives no world size "
         "(no RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE or SLURM_* variables), so every process would train alone as rank 0 "
         "of 1. Fix: start it with torchrun, mpirun or srun, or export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for each "
         "process; on one machine, one process with --num-ranks N",
         pmix);
  }
}

// DeepSpeed's launcher appends --local_rank=N to the command and sets LOCAL_RANK=N: they must agree.
void check_local_rank_argument(const LaunchEnv& env, const std::optional<std::int64_t>& local_rank) {
  if (!local_rank) return;
  if (env.launcher == "none" && *local_rank != 0) {
    fail("--local_rank={} is given but no launcher's environment is set (RANK and WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, "
         "SLURM_*): start dstrain through the launcher, or drop --local_rank",
         *local_rank);
  }
  if (env.launcher != "none" && *local_rank != env.local_rank) {
    fail("--local_rank={} but the launcher's environment says local rank {} ({}): they must name the same rank; drop --local_rank or fix "
         "the launcher's variables",
         *local_rank, env.local_rank, env.str());
  }
}

// The Hugging Face config.json a model spec reads (empty for the gpt2: presets and descriptors).
std::filesystem::path model_config_file(const std::string& spec) {
  if (spec.rfind("gpt2:", 0) == 0) return {};
  const std::filesystem::path p(spec);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return p / "config.json";
  return p;
}

// A parameter count: grouped digits, or 3 significant digits when it is astronomical.
std::string parameter_figure(double value) { return value < 1e15 ? format_count(value) : fmt::format("{:.3g}", value); }

// Refuses a model that cannot fit before any layer is built (engine/memory_estimate.h): on the
// cpu against what this process may still allocate, for every rank it runs; on a GPU against a
// bound no device reaches (the allocator reports a real shortage at the first allocation).
void check_memory(const TrainingPlan& plan, const std::string& model_spec, int ranks_here) {
  const MemoryEstimate e = estimate_rank_memory(plan.model, plan.config, plan.sequence_length);
  const double needed = e.per_rank() * static_cast<double>(ranks_here);
  const std::string figures = fmt::format(
      "{} parameters; per rank at least params {} + grads {} + optimizer {} + activations {} = {}{}", parameter_figure(e.parameters),
      format_estimate_bytes(e.params), format_estimate_bytes(e.grads), format_estimate_bytes(e.optimizer), format_estimate_bytes(e.activations),
      format_estimate_bytes(e.per_rank()), ranks_here > 1 ? fmt::format(", x {} ranks in this process = {}", ranks_here, format_estimate_bytes(needed)) : "");
  const char* fix = "give a smaller model (--model), a smaller micro-batch or sequence length, or partition the model states with a higher ZeRO "
                    "stage";
  if (plan.device.is_cpu()) {
    const std::optional<HostMemoryLimit> limit = host_memory_limit();
    if (limit && needed > limit->bytes) {
      fail("the model {} does not fit in memory: {}, but {} is available ({}); {}", model_spec, figures, format_estimate_bytes(limit->bytes),
           limit->source, fix);
    }
  } else if (e.per_rank() > 0x1p50) {  // 1 PiB
    fail("the model {} does not fit on any GPU: {}; {}", model_spec, figures, fix);
  }
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
  check_option_values(options);

  // ---- the world: --device, the launcher ("cuda" alone means the launcher's local rank: cuda:0
  // without a launcher, and when the launcher shows each process only its own GPU) ----
  plan.device = parse_device(options.device);
  const bool explicit_ordinal = options.device.find(':') != std::string::npos;
  plan.launch = launcher_env(plan.device);
  refuse_unsized_launcher(plan.launch);
  check_local_rank_argument(plan.launch, options.local_rank);
  if (plan.device.is_cuda() && !explicit_ordinal) plan.device = launcher_device(plan.launch);
  // A launcher with a GPU per process: NCCL over its ranks (also at world size 1).
  plan.launcher_group = plan.device.is_cuda() && plan.launch.launcher != "none";
  if (plan.launcher_group && options.num_ranks > 1) {
    fail("--num-ranks {} with a launcher ({}): the launcher's processes are the ranks; drop --num-ranks", options.num_ranks, plan.launch.str());
  }
  plan.world = plan.launcher_group ? plan.launch.world_size : static_cast<int>(options.num_ranks);

  // ---- the inputs exist, the outputs spare them and can be written ----
  require_file(options.data, "--data");
  if (!options.val_data.empty()) require_file(options.val_data, "--val-data");
  if (!options.init_from.empty()) require_file(options.init_from, "--init-from");
  std::vector<RunFile> inputs{{options.data, "--data"}, {options.val_data, "--val-data"}, {options.init_from, "--init-from"},
                              {config_text.file, "the config file"}, {model_config_file(model_spec), "the model config (--model)"}};
  std::vector<RunFile> outputs{{options.save_weights, "--save-weights"}, {options.summary_json, "--summary-json"}};

  // ---- the model's shape, before the config: its hidden size fills the ZeRO bucket sizes' "auto" ----
  plan.model = model_config_from_spec(model_spec);
  validate(plan.model);
  const Gpt2Config& g = plan.model;

  // ---- config: resolved for the world size (train_batch_size = micro x GAS x world); --steps
  // fills "auto" total_num_steps of a scheduler, --warmup-steps its warmup_num_steps, the model's
  // n_embd the hidden size (as the HF integration reads model.config.hidden_size) ----
  config::ConfigOptions config_options;
  config_options.world_size = plan.world;
  config_options.autos = options.autos;
  if (!config_options.autos.total_num_steps) config_options.autos.total_num_steps = options.steps;
  if (!config_options.autos.warmup_num_steps) config_options.autos.warmup_num_steps = options.warmup_steps;
  if (!config_options.autos.hidden_size) config_options.autos.hidden_size = g.n_embd;
  plan.config = config::parse_ds_config(config_text.tree, config_options);
  for (const config::Warning& w : plan.config.warnings) trainer_warn(options, fmt::format("{}{}{}", w.path, w.path.empty() ? "" : ": ", w.message));
  for (const std::string& r : plan.config.resolved_autos) trainer_print(options, fmt::format("auto: {}", r));
  const config::DsConfig& cfg = plan.config;
  if (cfg.flops_profiler.enabled && cfg.flops_profiler.output_file && !cfg.flops_profiler.output_file->empty()) {
    outputs.push_back({*cfg.flops_profiler.output_file, "flops_profiler.output_file"});
  }
  check_outputs_spare_inputs(inputs, outputs);
  for (const RunFile& out : outputs) {
    if (!out.path.empty()) prove_writable(out);
  }

  // ---- checkpoints: the save folder writable, the checkpoint to resume from found and of this
  // model (engine/trainer_checkpoints.h) ----
  plan.resume = plan_resume(options, g, cfg);

  // ---- the sequence length, the tokenizer, the memory the run needs ----
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
  check_memory(plan, model_spec, plan.launcher_group ? 1 : plan.world);

  // ---- the data: the training file's windows give the length of an epoch; both files are read
  // whole once, every token checked against the vocabulary ----
  const auto vocab = static_cast<std::int32_t>(g.vocab_size);
  {
    DataLoaderOptions dlo;
    dlo.micro_batch_size = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
    dlo.sequence_length = static_cast<std::size_t>(T);
    dlo.gradient_accumulation_steps = static_cast<int>(cfg.gradient_accumulation_steps);
    dlo.world_size = plan.world;
    dlo.rank = 0;
    const DataLoader loader = DataLoader::open(options.data, dlo);
    loader.validate(vocab);
    plan.window_count = static_cast<std::int64_t>(loader.window_count());
  }
  if (!options.val_data.empty()) {
    EvalLoaderOptions elo;
    elo.batch_size = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
    elo.sequence_length = static_cast<std::size_t>(T);
    elo.world_size = plan.world;
    elo.max_batches = static_cast<std::size_t>(options.val_batches);
    const EvalLoader val = EvalLoader::open(options.val_data, elo);
    validate_token_file(TokenFile::open(options.val_data), vocab);
    plan.val_batches = static_cast<std::int64_t>(val.total_batches());
  }
  plan.epoch_steps = std::max<std::int64_t>(1, plan.window_count / cfg.train_batch_size);
  plan.steps_from_epoch = !options.steps.has_value();
  plan.steps = options.steps ? *options.steps : plan.epoch_steps;

  // ---- what the end of the run will ask, asked now ----
  if (!options.save_weights.empty() && cfg.zero_optimization.stage == 3 && !cfg.zero_optimization.gather_16bit_weights_on_model_save &&
      plan.world > 1) {
    fail("--save-weights {}: ZeRO stage 3 partitions the weights across {} ranks and zero_optimization.stage3_gather_16bit_weights_on_model_save "
         "is false, so they would not be gathered for saving at the end of the run (DeepSpeed's save_16bit_model refuses likewise); set it to "
         "true, or drop --save-weights",
         options.save_weights.string(), plan.world);
  }

  if (cfg.steps_per_print && *cfg.steps_per_print > 0) {
    plan.print_every = *cfg.steps_per_print;
  } else {
    plan.print_every = 10;
    plan.print_every_defaulted = true;
  }

  // The flops profiler's peak, measured once here rather than on rank 0 while the others wait.
  plan.peak_flops = options.peak_flops;
  plan.peak_measured = cfg.flops_profiler.enabled && plan.peak_flops <= 0.0;
  if (plan.peak_measured) {
    plan.peak_flops = measure_gemm_flops(plan.device, cfg.fp16.enabled ? DType::fp16 : cfg.bf16.enabled ? DType::bf16 : DType::fp32);
  }
  return plan;
}

}  // namespace dstrain
