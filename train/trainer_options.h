// TrainerOptions: what a training run is asked to do — everything `dstrain train` takes on its
// command line besides the config, in one struct an embedding program fills the same way
// (train/trainer.h runs it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config_schema/auto_values.h"

namespace dstrain {

struct TrainerOptions {
  // ---- what to train on ----
  std::filesystem::path data;       // training token file (data/token_file.h); required
  std::filesystem::path val_data;   // validation token file; empty: no evaluation
  std::filesystem::path init_from;  // start from these weights (HF safetensors: GPT-2 or the Llama family, docs/models.md §4; GPT-2 also a torch.save
                                    // state dict); empty: the init
  // Optimizer steps of the run; nullopt: one pass over `data` (its windows / train_batch_size);
  // 0: only evaluate. Also fills a scheduler's "auto" total_num_steps.
  std::optional<std::int64_t> steps;
  std::optional<std::int64_t> warmup_steps;     // fills a scheduler's "auto" warmup_num_steps
  std::optional<std::int64_t> sequence_length;  // T; nullopt: the model's n_positions, at most 1024
  std::uint64_t seed = 42;                      // parameter init, data order, dropout, samples
  bool seed_given = false;                      // --seed was given (a resume warns when it differs from the saved seed)
  std::string tokenizer;                        // "gpt2" | "bytes" | a tokenizer.json path | "": the data's tokenizer (vocabulary check, samples)
  // Values for the config's other "auto" keys, as `check-config` takes them (config_schema/auto_values.h).
  // total_num_steps / warmup_num_steps come from `steps` / `warmup_steps` when left unset here.
  config::AutoValues autos;
  // The program's own optimizer, as an "optimizer" block ({"type": "Lion", "params": {"lr": 1e-4}}):
  // it replaces the config's block, as the optimizer a program passes to deepspeed.initialize does.
  // nullopt: the config's block, or with none AdamW with the HF Trainer's defaults, filled from
  // autos' lr / betas / eps / weight_decay (config::default_optimizer_block).
  std::optional<config::Json> optimizer;

  // ---- evaluation and samples ----
  std::int64_t val_interval = 100;  // evaluate (and sample) every N steps and at the end; 0: only at the end
  std::int64_t val_batches = 20;    // batches of the micro-batch size per evaluation, over all ranks; 0: the whole file
  std::int64_t sample_tokens = 64;  // tokens per sample; 0: no samples
  std::int64_t sample_top_k = 40;
  double sample_temperature = 1.0;  // finite, >= 0 (0: greedy), at most FLT_MAX
  double peak_flops = 0.0;          // the flops profiler's MFU peak; 0: measure one GEMM once

  // ---- the engine ----
  std::string device = "cpu";  // cpu, cuda, cuda:N ("cuda" under a launcher: cuda:LOCAL_RANK)
  std::int64_t num_ranks = 1;  // data-parallel ranks as threads of this process (local communicator)
  // The communicator backend: "auto" (mpi when an MPI launcher started this process on the cpu,
  // nccl when a launcher started it with --device cuda, else local), "local" (--num-ranks threads),
  // "mpi" (the processes of MPI_COMM_WORLD; docs/mpi.md) or "nccl" (a launcher's processes, a GPU each).
  std::string comm = "auto";
  // Ranks per node (machine): rank r is on node r / ranks_per_node, for the communicators' node
  // layout (Communicator::set_nodes: ZeRO++ / MiCS groups, the cross-node bytes of --summary-json).
  // 0: not given — local ranks one node, mpi what MPI_Comm_split_type finds, a launcher's processes
  // its local world size when it gives one (LaunchEnv::local_world_size), else one node. Must
  // divide the world size. docs/parallelism.md "Nodes".
  std::int64_t ranks_per_node = 0;
  // The local rank a launcher passed as an argument (DeepSpeed's launcher appends --local_rank=N);
  // nullopt: none. Must agree with the launcher's environment (LOCAL_RANK, ...).
  std::optional<std::int64_t> local_rank;
  bool checkpoint_activations = false;
  bool bf16_stochastic_rounding = false;
  // Under tensor parallelism, Megatron's sequence parallelism in the norm and dropout regions
  // (models/residual_shards.h): each TP rank keeps 1/TP of the residual stream's tokens, where the
  // micro-batch's B·T tokens divide by TP. On by default: it saves activation memory; off trades
  // that back for 20% fewer tensor-parallel bytes (the backward's second all-gathers).
  bool megatron_sequence_parallel = true;
  // ---- pipeline parallelism (docs/parallelism.md, train/pipeline_plan.h) ----
  // The stage count, as DeepSpeed's PipelineModule(num_stages=N) gives it in a program: it replaces
  // the config's pipeline.stages (config::ConfigOptions::pipeline_stages).
  int pipeline_stages = 0;  // 0: the config's
  // Megatron's interleaved 1F1B: each rank runs V chunks of the model (virtual stage v = chunk x
  // stages + stage), dividing the bubble by V at V x the point-to-point traffic.
  int pipeline_virtual_stages = 1;
  // "1f1b", "interleaved" (V > 1) or "gpipe" (all forwards, then all backwards; V = 1).
  std::string pipeline_schedule;              // "" = default: "interleaved" when pipeline_virtual_stages > 1, else "1f1b"
  std::vector<std::int64_t> inject_overflow;  // test hook: optimizer steps given an inf gradient
  // Test hook (--inject-slow-rank R:MS): rank `rank` sleeps `ms` milliseconds in every optimizer
  // step, to watch the straggler warning name it.
  struct SlowRank {
    std::int64_t rank = 0;
    std::int64_t ms = 0;
  };
  std::optional<SlowRank> inject_slow_rank;

  // ---- stragglers (docs/monitoring.md "Stragglers") ----
  // After every step the ranks share their step times (the step's one small all-reduce); a rank
  // slower than factor x the median for `straggler_steps` consecutive steps is named (rank 0's
  // warning and monitor events) with its host and local rank. 0: off; else > 1.
  double straggler_factor = 2.0;
  std::int64_t straggler_steps = 3;  // >= 1

  // ---- outputs ----
  std::filesystem::path save_weights;  // the final weights in the HF layout of the model (docs/models.md §4); empty: none
  // ---- training checkpoints (docs/checkpoints.md "The training loop") ----
  std::filesystem::path save_dir;  // checkpoints go here (every save_interval steps and at the end); empty: none
  std::int64_t save_interval = 0;  // optimizer steps between checkpoints; 0: only at the end (and on a stop signal)
  std::int64_t keep_last = 0;      // keep the newest K checkpoints under save_dir; 0: all
  // Also save when this many minutes have passed since the last save (or the start of training):
  // rank 0's clock decides, every rank saves after the same step. 0: off; needs save_dir.
  double save_interval_minutes = 0.0;
  // What each checkpoint is saved as besides dstrain's own files (docs/checkpoints.md "Saving for
  // DeepSpeed"): nothing; DeepSpeed's save_checkpoint layout for the run's ZeRO stage, data-parallel
  // ranks and dtype (mp_rank_00_model_states.pt, the ranks' optimizer files, `latest`), beside
  // dstrain's in each tag folder; or ds_to_universal's layout (<tag>/zero/, latest_universal).
  enum class SaveFormat { dstrain, deepspeed, universal };
  SaveFormat save_format = SaveFormat::dstrain;
  // Continue a run: "" (start fresh), "auto" (from the checkpoint `latest` names under save_dir if
  // there is one, else fresh: a job script can be rerun as it is) or the folder of a run's save_dir.
  std::string resume;
  std::string load_tag;  // the checkpoint to resume from; empty: the one `latest` names
  // Continue a run DeepSpeed saved: the folder of its save_dir (or one global_step folder); --resume
  // DIR does the same when DIR is a DeepSpeed checkpoint (is_deepspeed_checkpoint).
  std::string resume_deepspeed;
  // SIGTERM / SIGINT finish the current step, save a checkpoint (with save_dir) and end the run
  // (TrainResult::stopped_by_signal): the ranks agree after every step (one small all-reduce).
  // `dstrain train` sets it; with it an embedding program may also call request_stop()
  // (train/trainer_checkpoints.h).
  bool handle_signals = false;
  std::filesystem::path summary_json;  // the run's figures as JSON; empty: none
  // Testing aid: each data-parallel rank appends "step S epoch E window W rank R" for every training
  // window it reads (train/rank_trainer.cpp), so a test compares the samples of runs; empty: none.
  std::filesystem::path log_samples;

  // ---- where the run's lines go ----
  // Rank 0's progress lines (model, batch, steps, val losses, samples, the summary), one call per
  // line or block without a trailing newline. Empty: stdout, flushed after every line.
  std::function<void(std::string_view)> print;
  // Warnings (the config's, the loader's), one call each without the "warning: " prefix. Empty:
  // stderr as "warning: <text>".
  std::function<void(std::string_view)> warn;
};

// "dstrain", "deepspeed", "universal": --save-format's values.
inline const char* save_format_name(TrainerOptions::SaveFormat f) {
  switch (f) {
    case TrainerOptions::SaveFormat::deepspeed: return "deepspeed";
    case TrainerOptions::SaveFormat::universal: return "universal";
    case TrainerOptions::SaveFormat::dstrain: break;
  }
  return "dstrain";
}

}  // namespace dstrain
