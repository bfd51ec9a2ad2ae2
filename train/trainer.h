// Trainer: a whole training run, as `dstrain train` runs it and an embedding program can —
// the loop around the Engine (data, evaluation cadence, monitors, progress lines, samples, the
// flops profile, the summary) on every rank of this process.
//
//   dstrain::TrainerOptions options;
//   options.data = "datasets/brown_train.bin";
//   options.val_data = "datasets/brown_val.bin";
//   options.steps = 300;
//   dstrain::Trainer trainer(dstrain::load_config_file("ds_config.json"), "gpt2:L4-C256-H4-T128", options);
//   dstrain::TrainResult result = trainer.run();   // result.summary: losses, tokens/s, memory
//
// A run has three phases, in this order:
//   1. prepare(): the pre-flight (train/training_plan.h): the launcher's world, the config
//      resolved for it, the model's shape, every input file read and checked. Nothing trains
//      before it has passed; a mistake is an Error naming the option, key or file.
//   2. the step loop, on each rank (train/rank_trainer.h): options.num_ranks ranks as threads of
//      this process over the local communicator; or this process's rank of MPI_COMM_WORLD (the MPI
//      backend, processes on the cpu: `mpirun -np N`); or, started by a launcher with a GPU per
//      process, this process's rank of the launcher's group (NCCL). Every rank runs the same Engine
//      calls.
//   3. the finish: each rank's final evaluation, sample and weights; then the summary, printed by
//      rank 0 and written to options.summary_json with every rank's ZeroReport (over MPI gathered
//      from every process).
// The loop's lines go to options.print (rank 0 only) and warnings to options.warn.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config_schema/config_source.h"
#include "engine/engine.h"
#include "train/train_summary.h"
#include "train/trainer_options.h"
#include "train/training_plan.h"

namespace dstrain {

// What a run hands back.
struct TrainResult {
  std::optional<TrainSummary> summary;  // rank 0's; empty in a launcher's process of another rank
  // One per rank: every rank with num_ranks and over MPI (gathered); under NCCL this process's rank alone.
  std::vector<ZeroReport> reports;
  // The signal (SIGTERM, SIGINT) that stopped the run after a step and a checkpoint; 0: it ran to the end.
  int stopped_by_signal = 0;
};

class Trainer {
 public:
  // `config`: the ds_config (load_config_argument / load_config_file); `model`: a model spec as
  // models/model_registry.h reads it (gpt2:d12, llama:L4-C256-H4, a Hugging Face config.json, a
  // registered family's own spec).
  // Stores them; nothing is read or checked until prepare().
  Trainer(ConfigText config, std::string model, TrainerOptions options);

  // Phase 1, the pre-flight; run() calls it when it has not run. Throws Error.
  const TrainingPlan& prepare();
  // Phases 2 and 3: trains on every rank of this process and finishes. Throws Error (a rank's
  // error ends every rank of this process and is rethrown here).
  TrainResult run();

  const TrainerOptions& options() const { return options_; }
  // The plan of prepare() (an Error before it).
  const TrainingPlan& plan() const;

 private:
  void write_summary_json(const TrainResult& result) const;

  ConfigText config_;
  std::string model_;
  TrainerOptions options_;
  std::optional<TrainingPlan> plan_;
};

}  // namespace dstrain
