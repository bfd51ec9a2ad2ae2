// The training loop's side of checkpoints (docs/checkpoints.md "The training loop"): what a run
// resumes from, checked before step 1; which old checkpoints go (--keep-last); and the stop request
// a scheduler sends (SIGTERM / SIGINT) before preempting a job.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "config_schema/ds_config.h"
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
};

// The pre-flight of --save-dir / --resume / --load-tag / --keep-last / --save-interval: the save
// folder created and proven writable; the checkpoint to resume from found (--resume auto: the one
// `latest` under --save-dir names, or none: a fresh start) and opened — manifest and every rank's
// index read and checked — and checked to be of this model (parameter names and shapes) and, unless
// the optimizer changed on purpose, of this optimizer's states. Error naming the option, folder or
// file and the fix. nullopt: the run starts fresh.
std::optional<ResumePoint> plan_resume(const TrainerOptions& options, const Architecture& model, const config::DsConfig& config);

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
