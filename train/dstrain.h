// dstrain's public header: everything an application that embeds the engine needs.
//
//   #include <dstrain/dstrain.h>
//
// Installed by `cmake --install`; found with find_package(dstrain) and linked as dstrain::dstrain.
#pragma once

#include "config_schema/config_source.h"
#include "config_schema/ds_config.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/device.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/dtype.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/memory_stats.h"
#include "ops/tensor.h"

// Data: tokenizers, token files, their preparation, and the training / evaluation loaders.
#include "data/brown_corpus.h"
#include "data/byte_tokenizer.h"
#include "data/cache_dir.h"
#include "data/data_loader.h"
#include "data/eval_loader.h"
#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "data/jsonl_documents.h"
#include "data/prepare.h"
#include "data/run_files.h"
#include "data/token_file.h"
#include "data/tokenizer.h"

// Training: the model (layers), the engine and its step loop, weights in the HF GPT-2 layout.
#include "engine/engine.h"
#include "engine/checkpoint/checkpoint_consolidate.h"
#include "engine/checkpoint/deepspeed_export.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/checkpoint_manager.h"
// Offload: pinned host memory and the io_uring engine that NVMe offload and fast checkpoints use.
#include "offload/io_uring_engine.h"
#include "offload/pinned_host_allocator.h"
// Data parallelism: the communicator ranks train over (local threads; MPI processes; launcher
// environments).
#include "zero/communicator.h"
#include "zero/launch_env.h"
#include "zero/launcher_communicator.h"
#include "zero/local_communicator.h"
#include "zero/mpi_process.h"
#include "engine/generate.h"
#include "engine/lr_schedule.h"
#include "models/model.h"
#include "models/model_family.h"
#include "models/model_registry.h"
#include "models/param_split.h"
#include "models/stage_partition.h"
#include "models/gpt2/gpt2_family.h"
#include "models/llama/llama_family.h"
#include "train/progress.h"
#include "train/train_summary.h"
#include "models/gpt2/gpt2_config.h"
#include "models/gpt2/gpt2_weights.h"

// Monitoring: csv_monitor / TensorBoard writers from the config, DeepSpeed's event names and timers.
#include "train/monitor/flops.h"
#include "train/monitor/memory_breakdown.h"
#include "train/monitor/monitor_master.h"
#include "train/monitor/timers.h"
#include "train/monitor/train_events.h"

// The training loop around the engine, as `dstrain train` runs it: Trainer (the whole run: the
// pre-flight, every rank of this process, the summary) and RankTrainer (one rank's loop).
#include "train/flops_report.h"
#include "train/memory_estimate.h"
#include "train/pipeline_plan.h"
#include "train/expert_parallel_plan.h"
#include "train/deepspeed_memory_estimate.h"
#include "train/rank_trainer.h"
#include "train/sample_printer.h"
#include "train/trainer.h"
#include "train/trainer_checkpoints.h"
#include "train/trainer_options.h"
#include "train/training_plan.h"

namespace dstrain {

// The library's version, "MAJOR.MINOR.PATCH".
inline constexpr const char* kVersion = "0.1.0";

}  // namespace dstrain
