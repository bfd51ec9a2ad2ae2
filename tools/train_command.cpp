#include "train_command.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

#include "cli_options.h"

namespace dstrain::cli {
namespace {

// --model's help: every model family's spec forms (models/model_registry.h), so it lists what the
// registry reads.
std::string model_spec_help() {
  std::string forms;
  for (const auto& f : model_families()) forms += (forms.empty() ? "" : "; ") + f->spec_forms();
  return "Model spec: " + forms + " (docs/models.md)";
}

// The command line as CLI11 fills it; run_train turns it into TrainerOptions.
struct TrainArgs {
  std::string config, model, data, val_data, tokenizer, init_from, save_weights, summary_json, log_samples;
  std::string save_dir, resume, load_tag, resume_deepspeed, save_format = "dstrain";
  std::int64_t save_interval = 0, keep_last = 0;
  double save_interval_minutes = 0.0;
  double straggler_factor = 2.0;
  std::int64_t straggler_steps = 3;
  std::string inject_slow_rank;  // "R:MS"
  std::optional<std::int64_t> steps, sequence_length, warmup_steps;
  std::uint64_t seed = 42;
  bool seed_given = false;  // --seed on the command line, not the default
  std::int64_t val_interval = 100, val_batches = 20;
  bool checkpoint_activations = false;
  bool bf16_stochastic_rounding = false;
  bool megatron_sequence_parallel = true;
  int pipeline_stages = 0;                    // 0: the config's pipeline.stages
  int pipeline_virtual_stages = 1;            // Megatron's interleaved 1F1B chunks per stage
  std::string pipeline_schedule;              // "": interleaved when virtual stages > 1, else 1f1b
  std::vector<std::int64_t> inject_overflow;  // optimizer steps (1-based) given an inf gradient
  std::int64_t sample_tokens = 64, sample_top_k = 40;
  double sample_temperature = 1.0;
  double peak_flops = 0.0;                 // 0: measure this machine's sgemm once (flops_profiler only)
  std::int64_t num_ranks = 1;              // data-parallel ranks, as threads of this process (local communicator)
  std::string device = "cpu";              // where the engine trains: cpu, cuda, cuda:N
  std::string comm = "auto";               // the communicator backend: auto, local, mpi, gloo, nccl
  std::int64_t ranks_per_node = 0;         // 0: the launcher's / MPI's node layout
  std::optional<std::int64_t> local_rank;  // --local_rank=N, as DeepSpeed's launcher appends it
  AutoValueArgs autos;                     // the config's "auto" values, as check-config takes them
};

// --inject-slow-rank R:MS -> {R, MS}.
TrainerOptions::SlowRank parse_slow_rank(const std::string& text) {
  const std::size_t colon = text.find(':');
  const auto whole = [](const std::string& s, std::int64_t& out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) return false;
    out = std::stoll(s);
    return true;
  };
  TrainerOptions::SlowRank r;
  if (colon == std::string::npos || !whole(text.substr(0, colon), r.rank) || !whole(text.substr(colon + 1), r.ms)) {
    fail("--inject-slow-rank {}: expected RANK:MILLISECONDS, e.g. 2:300 (rank 2 sleeps 300 ms in every step)", text);
  }
  return r;
}

TrainerOptions trainer_options(const TrainArgs& args) {
  TrainerOptions o;
  o.data = args.data;
  o.val_data = args.val_data;
  o.init_from = args.init_from;
  o.steps = args.steps;
  o.warmup_steps = args.warmup_steps;
  o.sequence_length = args.sequence_length;
  o.seed = args.seed;
  o.seed_given = args.seed_given;
  o.tokenizer = args.tokenizer;
  o.val_interval = args.val_interval;
  o.val_batches = args.val_batches;
  o.sample_tokens = args.sample_tokens;
  o.sample_top_k = args.sample_top_k;
  o.sample_temperature = args.sample_temperature;
  o.peak_flops = args.peak_flops;
  o.device = args.device;
  o.num_ranks = args.num_ranks;
  o.comm = args.comm;
  o.ranks_per_node = args.ranks_per_node;
  o.checkpoint_activations = args.checkpoint_activations;
  o.bf16_stochastic_rounding = args.bf16_stochastic_rounding;
  o.megatron_sequence_parallel = args.megatron_sequence_parallel;
  o.pipeline_stages = args.pipeline_stages;
  o.pipeline_virtual_stages = args.pipeline_virtual_stages;
  o.pipeline_schedule = args.pipeline_schedule;
  o.inject_overflow = args.inject_overflow;
  o.save_weights = args.save_weights;
  o.save_dir = args.save_dir;
  o.save_interval = args.save_interval;
  o.keep_last = args.keep_last;
  o.save_interval_minutes = args.save_interval_minutes;
  o.straggler_factor = args.straggler_factor;
  o.straggler_steps = args.straggler_steps;
  if (!args.inject_slow_rank.empty()) o.inject_slow_rank = parse_slow_rank(args.inject_slow_rank);
  o.save_format = args.save_format == "deepspeed"   ? TrainerOptions::SaveFormat::deepspeed
                  : args.save_format == "universal" ? TrainerOptions::SaveFormat::universal
                                                    : TrainerOptions::SaveFormat::dstrain;
  o.resume = args.resume;
  o.resume_deepspeed = args.resume_deepspeed;
  o.load_tag = args.load_tag;
  o.handle_signals = true;
  o.summary_json = args.summary_json;
  o.log_samples = args.log_samples;
  o.local_rank = args.local_rank;
  o.autos = to_auto_values(args.autos);
  return o;
}

void run_train(const TrainArgs& args) {
  Trainer trainer(load_config_argument(args.config), args.model, trainer_options(args));
  const TrainResult r = trainer.run();
  // Stopped by SIGTERM / SIGINT after a checkpoint: EX_TEMPFAIL, "try again" — a job script
  // reruns the same command (with --resume auto) to continue.
  if (r.stopped_by_signal != 0) throw ExitStatus{kExitStoppedBySignal};
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train",
                                     "Train a GPT-2 or a Llama-family model from a DeepSpeed config on a token file (ZeRO stages 0-3 on --num-ranks "
                                     "local ranks or mpirun -np N processes)");
  cmd->add_option("--deepspeed_config,--deepspeed,--deepspeed-config", args->config, "ds_config file, JSON string or base64 of one")->required();
  cmd->add_option("--model", args->model, model_spec_help())->required();
  cmd->add_option("--data", args->data, "Training token file (dstrain prepare-data)")->required();
  cmd->add_option("--val-data", args->val_data, "Validation token file")->check(not_empty());
  cmd->add_option("--steps", args->steps, "Optimizer steps (default: one pass over --data; 0: only evaluate); fills \"auto\" total_num_steps")
      ->check(whole_number_at_least(0));
  cmd->add_option("--warmup-steps", args->warmup_steps, "Fills a scheduler's \"auto\" warmup_num_steps")->check(whole_number_at_least(1));
  cmd->add_option("--seed", args->seed, "Seed of the parameter init, the data order and dropout (0 to 2^64 - 1)")
      ->check(whole_number_64_bit_unsigned())
      ->each([args](const std::string&) { args->seed_given = true; })
      ->capture_default_str();
  cmd->add_option("--sequence-length", args->sequence_length, "T: tokens per sequence (default: the model's n_positions, at most 1024)")
      ->check(whole_number_at_least(1));
  // The spelling is checked here, before the data files are looked at; a tokenizer.json's contents
  // where it is loaded (make_tokenizer).
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Tokenizer of the data files (gpt2, bytes, or a Hugging Face tokenizer.json): checks the model's "
                  "vocabulary covers it, and decodes the samples")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            std::error_code error;
            if (text == "gpt2" || text == "bytes" || std::filesystem::path(text).extension() == ".json" ||
                std::filesystem::is_directory(text, error)) {
              return std::string();
            }
            return fmt::format("'{}' is not one of gpt2, bytes, or the path of a tokenizer.json (or of its folder)", text);
          },
          "{gpt2, bytes, PATH/tokenizer.json}"));
  cmd->add_option("--val-interval", args->val_interval, "Evaluate every N steps (and always at the end; 0: only at the end)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--val-batches", args->val_batches,
                  "Batches (of the micro-batch size) per evaluation, shared out over the ranks: exactly N whatever the world size "
                  "(0: the whole val file)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--init-from", args->init_from,
                  "Start from these weights instead of the init: Hugging Face safetensors (GPT-2: model.safetensors or a torch.save state dict such "
                  "as pytorch_model.bin, DeepSpeed's mp_rank_00_model_states.pt, zero_to_fp32 output, read without running its code; the Llama "
                  "family: model.safetensors, model.safetensors.index.json or their folder)")
      ->check(not_empty());
  cmd->add_option("--save-weights", args->save_weights,
                  "Write the final weights in the Hugging Face layout (GPT-2: model.safetensors; the Llama family: model.safetensors, sharded with "
                  "an index above 5 GB)")
      ->check(not_empty());
  cmd->add_option("--save-dir", args->save_dir,
                  "Save training checkpoints here (docs/checkpoints.md): every --save-interval steps, at the end, and on SIGTERM / SIGINT")
      ->check(not_empty());
  cmd->add_option("--save-interval", args->save_interval, "Optimizer steps between checkpoints (0: only at the end)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--save-format", args->save_format,
                  "Also save each checkpoint for DeepSpeed, beside dstrain's files in its tag folder: deepspeed (save_checkpoint's layout for the "
                  "run's ZeRO stage, data-parallel ranks and dtype: DeepSpeed's load_checkpoint and zero_to_fp32.py read it) or universal "
                  "(ds_to_universal's)")
      ->check(one_of({"dstrain", "deepspeed", "universal"}))
      ->capture_default_str();
  cmd->add_option("--save-interval-minutes", args->save_interval_minutes,
                  "Also save a checkpoint when this many minutes have passed since the last save (or the start); rank 0's clock decides, "
                  "every rank saves after the same step. Needs --save-dir");
  cmd->add_option("--keep-last", args->keep_last, "Keep only the newest K checkpoints under --save-dir (0: all)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  CLI::Option* resume =
      cmd->add_option(
             "--resume", args->resume,
             "Continue a run from a checkpoint: DIR (a --save-dir), or auto (the latest under --save-dir if there is one, else start "
             "fresh; --resume alone is auto). --steps counts from the start of training, so the resumed run ends where the uninterrupted one would")
          ->expected(0, 1)
          ->default_str("auto");  // the value of --resume alone, so that --resume "" stays empty
  cmd->add_option("--resume-deepspeed", args->resume_deepspeed,
                  "Continue a run DeepSpeed saved: DIR is its save_dir (the tag `latest` names, or --load-tag) — its fp32 masters, optimizer "
                  "states and step, counters, LR schedule and fp16 loss scale (docs/checkpoints.md \"Resuming a DeepSpeed checkpoint\"); "
                  "--resume DIR does the same when DIR is one")
      ->check(not_empty());
  cmd->add_option("--load-tag", args->load_tag, "The checkpoint to resume from (default: the one DIR/latest names)")->check(not_empty());
  cmd->add_option("--inject-overflow", args->inject_overflow,
                  "Put an inf into one gradient at these optimizer steps (1-based, comma-separated), to watch fp16 / bf16 skip them")
      ->delimiter(',')
      ->check(whole_number_at_least(1));
  cmd->add_option("--log-samples", args->log_samples,
                  "Testing aid: append \"step S epoch E window W rank R\" to FILE for every training window each data-parallel rank reads "
                  "(a resumed run appends to the same file), to compare the samples of runs")
      ->check(not_empty());
  cmd->add_option("--inject-slow-rank", args->inject_slow_rank,
                  "Testing aid: rank R sleeps MS milliseconds in every optimizer step (R:MS), to watch the straggler warning name it")
      ->check(not_empty());
  cmd->add_option("--straggler-factor", args->straggler_factor,
                  "Name a rank whose step time is above this factor x the median of all ranks' for --straggler-steps consecutive steps, "
                  "with its host and local rank (docs/monitoring.md \"Stragglers\"); 0: off")
      ->capture_default_str();
  cmd->add_option("--straggler-steps", args->straggler_steps, "Consecutive slow steps before a rank is named a straggler")
      ->capture_default_str();
  cmd->add_option("--summary-json", args->summary_json,
                  "Write the run's figures as JSON (with a \"zero\" object: every rank's ZeRO memory and traffic)")
      ->check(not_empty());
  cmd->add_option("--num-ranks", args->num_ranks,
                  "Data-parallel ranks, run as threads of this process over the local communicator; the config is resolved for this "
                  "world size (train_batch_size = micro-batch x gradient_accumulation_steps x N)")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--ranks-per-node", args->ranks_per_node,
                  "Ranks per node (machine): rank r is on node r / N, for ZeRO++ / MiCS groups and the cross-node bytes of --summary-json; "
                  "must divide the world size (default: MPI's or the launcher's node layout; --num-ranks threads: one node)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--comm", args->comm,
                  "The communicator between the ranks: local (--num-ranks threads of this process), mpi (each process mpirun / "
                  "mpiexec / srun --mpi=pmix starts is a rank, on the cpu; docs/mpi.md), gloo (each process torchrun, srun or a script "
                  "setting RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT starts is a rank, on the cpu; docs/elastic.md), nccl (a GPU per "
                  "process), or auto: mpi under an MPI launcher on the cpu, gloo under another launcher on the cpu, nccl under a launcher "
                  "with --device cuda, else local. Said at the start of the run")
      ->check(one_of({"auto", "local", "mpi", "gloo", "nccl"}))
      ->capture_default_str();
  cmd->add_option("--device", args->device,
                  "Where the engine trains: cpu, or cuda / cuda:N (the CUDA build; started by a launcher, \"cuda\" is cuda:LOCAL_RANK, or "
                  "cuda:0 when each process sees one GPU, and the launcher's processes train over NCCL)")
      ->capture_default_str();
  cmd->add_option("--local_rank,--local-rank", args->local_rank,
                  "The local rank DeepSpeed's launcher appends (--local_rank=N); checked against the launcher's LOCAL_RANK")
      ->check(whole_number_at_least(0));
  cmd->add_flag("--bf16-stochastic-rounding", args->bf16_stochastic_rounding,
                "bf16 training: round the bf16 weights stochastically from the fp32 masters after each Adam/AdamW step (llm.c's choice) "
                "instead of to nearest (DeepSpeed's)");
  cmd->add_flag("--megatron-sp,!--no-megatron-sp", args->megatron_sequence_parallel,
                "Tensor parallelism: Megatron's sequence parallelism in the norm and dropout regions — each tensor-parallel rank keeps "
                "1/TP of the residual stream's tokens (reduce-scatter / all-gather in place of all-reduce), where the micro-batch's "
                "tokens divide by TP. On by default; --no-megatron-sp keeps the stream whole (less memory saved, fewer bytes sent)");
  const char* pipeline_group = "Pipeline parallelism (the config's \"pipeline\" section; docs/parallelism.md)";
  cmd->add_option("--pipeline-stages", args->pipeline_stages,
                  "Pipeline stages P, as a DeepSpeed program gives PipelineModule(num_stages=P): replaces pipeline.stages. The world is P x "
                  "data-parallel x sequence-parallel x tensor-parallel, so train_batch_size = micro-batch x gradient_accumulation_steps x "
                  "world / (P x TP x SP); gradient_accumulation_steps is the micro-batches per step")
      ->group(pipeline_group)
      ->check(whole_number_at_least(1));
  cmd->add_option("--pipeline-virtual-stages", args->pipeline_virtual_stages,
                  "Megatron's interleaved 1F1B: V chunks of the model per stage (the bubble divided by V, at V x the point-to-point "
                  "traffic); gradient_accumulation_steps must be a multiple of the stage count")
      ->group(pipeline_group)
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--pipeline-schedule", args->pipeline_schedule,
                  "1f1b (the default; DeepSpeed's TrainSchedule), interleaved (the default with --pipeline-virtual-stages > 1) or gpipe "
                  "(all forwards, then all backwards: the reference; one chunk per stage)")
      ->group(pipeline_group)
      ->check(one_of({"1f1b", "interleaved", "gpipe"}));
  cmd->add_flag("--checkpoint-activations", args->checkpoint_activations,
                "Activation checkpointing: keep only the inputs of checkpoint segments and recompute in backward; the config's "
                "\"activation_checkpointing\" section configures it");
  cmd->add_option("--sample-tokens", args->sample_tokens, "Tokens of the sample printed every --val-interval steps and at the end (0: no samples)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--sample-top-k", args->sample_top_k, "Sample among the k most likely tokens (0: the whole vocabulary)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--sample-temperature", args->sample_temperature, "Sampling temperature (0: greedy)")
      ->check(finite_number_at_least(0.0))
      ->capture_default_str();
  cmd->add_option("--peak-flops", args->peak_flops,
                  "Peak FLOP/s for MFU in the progress line, the summary and the flops profiler (default 0: measure one GEMM "
                  "once, in the training dtype, on the training device: 1024^3 on the cpu through the path the run's "
                  "matmuls take, 4096^3 through cuBLASLt on a GPU)")
      ->check(finite_number_at_least(0.0))
      ->capture_default_str();
  add_auto_value_options(cmd, args->autos);
  cmd->callback([args, resume] {
    // --resume alone is auto (its default_str); --resume "" (an unset shell variable) is a mistake.
    if (resume->count() > 0 && args->resume.empty()) {
      fail("--resume is empty (an unset shell variable?); give the checkpoint folder, auto, or --resume alone");
    }
    run_train(*args);
  });
}

}  // namespace dstrain::cli
