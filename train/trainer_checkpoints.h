// The training loop's side of checkpoints (docs/checkpoints.md "The training loop"): what a run
// resumes from, checked before step 1; which old checkpoints go (--keep-last); and the stop request
// a scheduler sends (SIGTERM / SIGINT) before preempting a job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <memory>

#include "config_schema/ds_config.h"
#include "engine/checkpoint/deepspeed_resume.h"
#include "train/trainer_options.h"
#include "models/model_family.h"
#include "ops/stop_request.h"

namespace dstrain {

// A checkpoint a run continues from.
struct ResumePoint {
  std::filesystem::path dir;  // the save folder holding it
  std::string tag;
  std::int64_t global_steps = 0;
  std::uint64_t seed = 0;  // the run's seed: the data order and dropout continue with it
  // The sequence length it was trained with (checkpoints saved before it was recorded: nullopt),
  // and the data loader's position then, in windows of that length (client_state "data").
  std::optional<std::int64_t> sequence_length;
  std::uint64_t data_epoch = 0, data_position = 0;
  // The global batch it was trained with and how (manifest engine.train_batch_size,
  // gradient_accumulation_steps, ds_config.train_micro_batch_size_per_gpu, layout.world_size): a
  // resume at another world size must keep train_batch_size (check_resume_batch). 0: not recorded
  // (a DeepSpeed checkpoint: checked by deepspeed_resume_state).
  std::int64_t train_batch_size = 0, gradient_accumulation_steps = 0, micro_batch_size = 0, world_size = 0;
  // The model's training settings that --model changes (dropout, initializer_range), each as
  // "attn_pdrop 0.1 in the checkpoint, 0 here": said in a warning, not refused.
  std::vector<std::string> changed_settings;
  // A checkpoint DeepSpeed saved (--resume-deepspeed DIR, or --resume DIR holding one): read on
  // every rank, mapped to dstrain's parameters and checked against the config before step 1
  // (engine/checkpoint/deepspeed_resume.h); the engine loads it with load_whole_state. It has no
  // data loader position: the data starts from the beginning of --data with the run's seed.
  std::shared_ptr<const DeepSpeedResume> deepspeed;
};

// The pre-flight of --save-dir / --resume / --load-tag / --keep-last / --save-interval: the save
// folder created and proven writable; the checkpoint to resume from found (--resume auto: the one
// `latest` under --save-dir names, or none: a fresh start) and opened — manifest and every rank's
// index read and checked — and checked to be of this model (parameter names and shapes) and, unless
// the optimizer changed on purpose, of this optimizer's states. Error naming the option, folder or
// file and the fix. nullopt: the run starts fresh. A DeepSpeed checkpoint (--resume-deepspeed DIR,
// or --resume DIR where is_deepspeed_checkpoint(DIR)) is read whole and mapped
// (deepspeed_resume_state): every mapping error and everything that cannot carry over is an Error
// here, before the engine exists.
std::optional<ResumePoint> plan_resume(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config);

// What the resumed run does differently from the command line, once its sequence length T and the
// training file's windows of T tokens are known (plan_training): returns the warnings to print —
// --seed other than the checkpoint's (the saved seed is used: data order, dropout, stochastic
// rounding), --sequence-length other than the checkpoint's (the weights carry over; the saved data
// position is counted in windows of the new length, so the data order does not continue). Error
// when the saved position lies beyond the file's windows of T tokens (another --data, or a longer T).
std::vector<std::string> check_resume_against_run(const ResumePoint& resume, const TrainerOptions& options, const Architecture& model,
                                                  std::int64_t sequence_length, std::int64_t window_count);

// A resume keeps the global batch (docs/elastic.md): the run's train_batch_size, as the config
// resolves it for this world size (elasticity's arithmetic included), must be the checkpoint's —
// else the same steps would be other batches and the data order, the LR schedule and the loss
// scale would belong to another run. Error, before step 1, naming the saved and the new global
// batch and what keeps it: the data-parallel sizes the config allows for it (elasticity) or the
// world sizes and gradient_accumulation_steps that give it, and `train_batch_size` to set.
// `dp` is the run's data-parallel size, `ranks_per_dp` its world / dp (TP x SP x PP),
// `train_batch_size_given` whether the config file sets train_batch_size to a number.
void check_resume_batch(const ResumePoint& resume, const config::DsConfig& config, int dp, int ranks_per_dp, bool train_batch_size_given);

// How many checkpoints a run saves: one every `save_interval` optimizer steps (0: none) strictly
// between step `from` (where it starts: 0, or the step resumed) and its last step `to`, and one at
// the end.
std::int64_t checkpoint_saves(std::int64_t from, std::int64_t to, std::int64_t save_interval);
// How many checkpoints' bytes the run adds to the save folder at its fullest, with `prior` committed
// checkpoints there already: a save writes a whole new one before --keep-last K removes the oldest
// (never the one `latest` names), and those removed free their space for the next. K = 0 keeps all.
std::int64_t checkpoints_at_once(std::int64_t prior, std::int64_t saves, std::int64_t keep_last);

// The room the run's checkpoints need under --save-dir (docs/checkpoints.md "The training loop"),
// from the model's stored parameters, the optimizer's states and the precision: `bytes` in all, at
// least `largest_file` in one rank file. Data only: a lower bound.
struct CheckpointSpace {
  std::int64_t saves = 0, at_once = 0;
  double bytes_each = 0.0, bytes = 0.0, largest_file = 0.0;
};
CheckpointSpace checkpoint_space(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config, int world,
                                 std::int64_t from_step, std::int64_t to_step);

// Removes the oldest committed checkpoints under save_dir (by global_steps) so that `keep` remain,
// never the one `latest` names; keep <= 0 keeps all. Returns the tags removed.
std::vector<std::string> prune_checkpoints(const std::filesystem::path& save_dir, std::int64_t keep);

// SIGTERM / SIGINT while installed: the handler only records the signal (ops/stop_request.h); the
// training loop asks stop_signal() at every step boundary, and the ranks agree before they stop
// together; long NVMe swap I/O gives up with StopRequested once the request is overdue.
class StopSignalHandler {
 public:
  StopSignalHandler();  // installs the handlers (the previous ones are restored by the destructor)
  ~StopSignalHandler();
  StopSignalHandler(const StopSignalHandler&) = delete;
  StopSignalHandler& operator=(const StopSignalHandler&) = delete;
};

}  // namespace dstrain
