// RankTrainer: one rank's part of a training run (train/trainer.h) — its Engine, its slots of
// every global batch (data/data_loader.h), its share of the val batches, the monitors,
// timers, progress lines, samples and the flops profile. Rank 0 alone prints and writes monitor
// files; every rank makes the same Engine calls in the same order (collectives match).
//
//   RankTrainer rank(plan, options, comm);   // builds the engine, the loaders, the monitors
//   rank.announce();                         // rank 0: what is about to run
//   while (!rank.done()) rank.train_step();  // one optimizer step, with its cadence
//   rank.finish();                           // final evaluation, sample, weights, summary lines
//
// run() is those four calls. An embedding program that drives its own loop calls them itself; a
// later step (checkpoints, a stop request) slots in between train_step() calls, where every rank
// stands at the same optimizer-step boundary.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_loader.h"
#include "data/eval_loader.h"
#include "engine/checkpoint/checkpoint_manager.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/pipeline_engine.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "train/monitor/monitor_master.h"
#include "train/monitor/timers.h"
#include "train/sample_printer.h"
#include "train/startup_times.h"
#include "train/straggler_detector.h"
#include "train/train_summary.h"
#include "train/trainer_options.h"
#include "train/training_plan.h"
#include "zero/communicator.h"
#include "zero/device_mesh.h"

namespace dstrain {

class RankTrainer {
 public:
  // `plan` and `options` must outlive this object. comm: the rank's communicator (its world size
  // must be plan.world); nullptr: the single rank of a one-rank run.
  RankTrainer(const TrainingPlan& plan, const TrainerOptions& options, Communicator* comm);
  ~RankTrainer();
  RankTrainer(const RankTrainer&) = delete;
  RankTrainer& operator=(const RankTrainer&) = delete;

  // Rank 0 prints the model, the batch, the data, the optimizer and precision.
  void announce();
  // One optimizer step (gradient_accumulation_steps micro-batches), then its monitor events,
  // flops profile, progress line, and at the val interval the val loss and a sample.
  void train_step();
  // True once plan.steps optimizer steps have been taken.
  bool done() const;
  // The end of the run: this rank's ZeroReport, the final val loss and sample, the weights
  // (collective), and rank 0's summary lines.
  void finish();
  // announce(), train_step() until done(), finish().
  void run();
  // How long joining the process group took (Trainer::run measures it; printed with the startup line).
  void set_join_seconds(double s) { startup_.join_seconds = s; }

  // The val loss over options.val_batches batches (every rank's share; collective).
  double evaluate();
  // Rank 0 prints a sample generated from the model (collective at ZeRO stage 3).
  void sample(std::int64_t step);

  Engine& engine() { return *engine_; }
  int rank() const { return rank_; }
  bool lead() const { return rank_ == 0; }
  // The run's figures so far (complete after finish()).
  const TrainSummary& summary() const { return summary_; }
  TrainSummary take_summary() { return std::move(summary_); }
  // This rank's ZeRO figures after training (set by finish()).
  const ZeroReport& zero_report() const { return report_; }

  // A checkpoint of the run so far under options.save_dir (collective): the engine's state and, as
  // its client state, the data loader's position and the seed; then --keep-last. Returns the tag.
  std::string save_checkpoint();
  // True when the agreement after the last step found a stop request (SIGTERM / SIGINT,
  // request_stop()) on any rank, so that every rank stops after the same step.
  bool stop_requested();
  // The signal that ended run() early (after a checkpoint), or 0.
  int stopped_by_signal() const { return stopped_by_signal_; }

 private:
  void say(const std::string& line) const;
  template <typename Fn>
  void timed(std::string_view name, Fn&& fn);
  void after_step(double step_seconds);
  // Several ranks: every rank's host name and local rank, once before step 1 (collective), for the
  // straggler warnings.
  void exchange_hosts();
  // After every step (collective over the world): one fp64 sum all-reduce of every rank's step
  // seconds, the count of ranks that saw a stop signal, and rank 0's time-based save decision;
  // then the straggler check. One rank: the same decisions, nothing communicated.
  void agree_after_step(double step_seconds);
  // --inject-slow-rank: this rank's sleep inside the step.
  void inject_slowness() const;
  // Error naming the step when `loss` (the training or val loss) is NaN or infinite.
  void check_finite(double loss, const char* what, std::int64_t step) const;

  const TrainingPlan& plan_;
  const TrainerOptions& options_;
  Communicator* comm_;  // the world's
  // The device mesh's groups (zero/device_mesh.h): the engine trains on mesh_.data (its ZeRO group)
  // and mesh_.tp (its layers' group); empty for one rank.
  std::optional<MeshGroups> mesh_;
  // Pipeline parallelism (plan.mesh.pp > 1): the shared parameters' group (declared before the
  // engine, which holds it: destroyed after it), the schedule's runner, and every micro-batch of a
  // step, kept until the step ends (the stages run them interleaved).
  std::unique_ptr<Communicator> pipeline_ties_;
  std::optional<PipelineEngine> pipe_;
  std::vector<std::vector<std::int32_t>> step_tokens_, step_targets_;
  // Samples at the val interval: off under tensor parallelism (the generator reads whole logits;
  // each tensor-parallel rank holds a slice of the vocabulary's).
  bool samples_ = true;
  // Sequence parallelism: this rank's place in its group, and its share of each micro-batch.
  int sp_rank_ = 0;
  int sp_ranks_ = 1;
  SequenceParallelRank sp_layers_;  // what the layers were built with (ALST's tiles), for the start lines
  TensorParallelRank tp_layers_;
  std::vector<std::int32_t> shard_inputs_, shard_targets_;
  // The micro-batch in inputs_ / targets_ as this rank trains on it (its share of the tokens).
  Batch rank_batch();
  int rank_ = 0;
  std::optional<Engine> engine_;
  std::optional<CheckpointManager> checkpoints_;
  void train_pipeline_step();  // the engine's training checkpoints (declared after it: destroyed first)
  std::int64_t B_ = 0, GAS_ = 0, TBS_ = 0, T_ = 0;
  int stage_ = 0;
  std::optional<DataLoader> loader_;
  // --log-samples (a testing aid, docs/cli.md): the file, open for appending where this rank is the
  // one of its data-parallel slot that logs (tensor-parallel, sequence-parallel and pipeline rank 0;
  // -1 elsewhere), and the logging itself: one line per window of the micro-batch loader_ reads next.
  struct AppendFd {  // closed with the trainer, also when its constructor throws after opening it
    int fd = -1;
    AppendFd() = default;
    AppendFd(const AppendFd&) = delete;
    AppendFd& operator=(const AppendFd&) = delete;
    ~AppendFd();
  } sample_log_;
  void log_micro_batch_samples();
  std::optional<EvalLoader> val_;
  std::vector<std::int32_t> inputs_, targets_;  // (B, T) micro-batch storage the engine's Batch views

  MonitorMaster monitors_;
  bool timing_ = false;  // wall_clock_breakdown or the flops profiler
  Timers step_timers_, print_timers_;

  std::unique_ptr<Allocator> sample_allocator_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<Generator> generator_;
  SamplingOptions sampling_;

  TrainSummary summary_;
  ZeroReport report_;
  std::chrono::steady_clock::time_point start_;
  bool started_ = false;
  double train_s_ = 0.0, interval_train_s_ = 0.0;
  std::int64_t interval_steps_ = 0;
  std::int64_t skipped_before_ = 0;  // engine.state().skipped_steps before the last step
  std::uint64_t seed_ = 0;           // options.seed, or the resumed run's
  std::int64_t resumed_steps_ = 0;   // global_steps when this process started training
  StartupTimes startup_;             // printed after the first step of a resumed run
  std::string last_saved_tag_;       // the checkpoint of the current step, once saved
  int stopped_by_signal_ = 0;

  // The agreement after the last step (agree_after_step): the signal every rank stops with (0: go
  // on), and whether --save-interval-minutes asks for a save now.
  int agreed_signal_ = 0;
  bool agreed_save_ = false;
  std::chrono::steady_clock::time_point last_save_time_;  // the last save, or the start of training
  // Stragglers: the detector, every rank's host and local rank, the last step's slowest rank.
  StragglerDetector stragglers_;
  std::vector<std::string> hosts_;
  std::vector<int> local_ranks_;
  int slowest_rank_ = -1;
  double slowest_s_ = 0.0;
};

}  // namespace dstrain
