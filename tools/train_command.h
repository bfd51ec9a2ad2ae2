// `dstrain train`: a training run from a DeepSpeed config, a model spec and a token file.
//
//   dstrain train --deepspeed_config FILE --model SPEC --data TRAIN.bin [--val-data VAL.bin]
//                 [--steps N] [--warmup-steps N] [--seed S] [--sequence-length T]
//                 [--tokenizer gpt2|bytes] [--val-interval N] [--val-batches N]
//                 [--init-from W.safetensors] [--save-weights W.safetensors] [--summary-json FILE]
//                 [--sample-tokens N] [--sample-top-k K] [--sample-temperature X] [--peak-flops F]
//                 [--num-ranks N]
//
// --deepspeed and --deepspeed-config are aliases of --deepspeed_config (as DeepSpeed's launcher).
// --num-ranks N (default 1) trains on N data-parallel ranks, threads of this process over the local
// communicator (zero/local_communicator.h), each with its own Engine and its slots of every global
// batch; the config's zero_optimization.stage says how they partition the model states. The batch
// comes from the config resolved for world size N (train_batch_size = micro x GAS x N); a process
// started by a launcher as one of several ranks is refused (the CPU engine cannot join processes:
// NCCL needs the CUDA engine). Rank 0 alone prints; val losses average every rank's share of the
// --val-batches batches; --summary-json adds a "zero" object with every rank's ZeroReport. --steps also fills a scheduler's "auto"
// total_num_steps and --warmup-steps its "auto" warmup_num_steps; the engine applies the config's
// scheduler. T defaults to the model's n_positions, capped at 1024. --steps defaults to one
// pass over the training file (its windows / train_batch_size), and --steps 0 only evaluates
// (with --init-from: the loss of given weights). The run prints the model and the resolved batch,
// a progress line every steps_per_print steps (10 when the config leaves it unset), the val loss
// every --val-interval steps and at the end with a sample generated from the model (--sample-*), and
// a summary with peak memory by purpose. The config's csv_monitor / tensorboard, wall_clock_breakdown,
// memory_breakdown and flops_profiler write and print what DeepSpeed's do (README, "Monitoring").
// Same seed, config and data: the same losses, run after run.
// The loop itself is dstrain::Trainer (train/trainer.h); this file maps the flags onto TrainerOptions.
#pragma once

namespace CLI {
class App;
}

namespace dstrain::cli {

// Registers the subcommand on `app`; its callback throws dstrain::Error for invalid input.
void add_train_command(CLI::App& app);

}  // namespace dstrain::cli
