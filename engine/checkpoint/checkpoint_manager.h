// CheckpointManager: an engine's training checkpoints (docs/checkpoints.md), apart from the step
// as torch.distributed.checkpoint and torchtitan keep them apart — the engine trains, the manager
// saves and restores everything a continuation needs: the fp32 masters, the 16-bit params, every
// optimizer state, the counters, the loss scaler, the LR schedule, the seed, the model and the
// layout, in parameter space of the whole model (a tensor-parallel piece is saved at its whole
// parameter's element offsets; a pipeline stage saves its stage's parameters, and the manifest lists
// every stage's), so that a checkpoint loads at any world size, ZeRO stage, dtype, tensor-parallel
// size and number of pipeline stages.
//
//   dstrain::Engine engine = dstrain::initialize(model, config, options);
//   dstrain::CheckpointManager checkpoints(engine);   // with checkpoint.writer.decoupled: faults in
//                                                      // the snapshot memory now, not at the first save
//   checkpoints.load("ckpt");                          // resume if ckpt/latest names one
//   ... train ...
//   checkpoints.save("ckpt");                          // ckpt/global_step<N>, then ckpt/latest
//   checkpoints.wait();                                // a decoupled save's files, committed
//
// Every call is collective: each rank of the engine (on a pipeline, of every stage) calls it, in the same order as the engine's
// other collectives. The manager holds a reference to the engine, which must outlive it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/host_prefault.h"
#include "engine/engine.h"

namespace dstrain {

// What load() restores besides the weights, as DeepSpeed's arguments of the same names: the
// optimizer states (and the fp16 loss scaler, which DeepSpeed keeps with them), the LR schedule,
// or only the weights (no counters, optimizer or schedule).
struct LoadCheckpointOptions {
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;
};

// What a load found: the checkpoint's folder (empty when there was nothing to load), its tag and
// the client state the saver passed.
struct LoadedCheckpoint {
  std::filesystem::path path;
  std::string tag;
  config::Json client_state;
  bool loaded() const { return !path.empty(); }
};

// A checkpoint manifest's scalars (counters, schedule, seed, loss scaler, 1-bit phase), read and
// type-checked in load()'s first phase and applied in its second (checkpoint_manager.cpp).
struct CheckpointScalars;

// Where this rank sits in the whole mesh (pipeline x data x tensor parallel), and the number of
// its rank file (checkpoint_manager.cpp; docs/checkpoints.md "Pipeline parallelism").
struct CheckpointMeshPosition;

// A parameter of the whole model as a manifest lists it: its name and whole shape.
struct CheckpointParam {
  std::string name;
  std::vector<std::int64_t> shape;
};

// A whole training state in memory (engine/checkpoint/whole_state_load.h).
struct WholeTrainingState;

class CheckpointManager {
 public:
  // With checkpoint.writer.decoupled, allocates this rank's snapshot memory and starts faulting it
  // in, so that no save's stall pays for it (docs/checkpoints.md "Host memory"). Logs what the
  // config's checkpoint keys change.
  explicit CheckpointManager(Engine& engine);
  // Waits for a decoupled save's files but does not commit them: the partial folder is removed by
  // the next run's pre-flight.
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves the engine's state under save_dir/<tag>, each rank writing the pieces of parameter space
  // it owns (under tensor parallelism at whole-parameter offsets, replicated parameters by
  // tensor-parallel rank 0; one file per mesh rank), then rewrites save_dir/latest. Atomic: a crash leaves the previous checkpoint
  // loadable. Default tag "global_step<N>"; checkpoint.tag_validation compares the tag across ranks
  // (Warn / Fail). Call at a gradient-accumulation boundary (after the step() that completes one):
  // the accumulated gradients of a half-done step are not saved. Returns the tag. Error naming the
  // file and the cause (disk full, permissions); the run's state is untouched by a failed save.
  // With checkpoint.writer.decoupled it returns once every rank has a snapshot in host memory and
  // writes the files in the background; wait() (or the next save or load) commits them.
  std::string save(const std::filesystem::path& save_dir, std::string tag = "", const config::Json& client_state = config::Json::object());
  // Loads load_dir/<tag> (tag "": the one load_dir/latest names; nothing is loaded, with a warning,
  // when there is no latest) saved at any world size, ZeRO stage, dtype and tensor-parallel size:
  // each rank reads the saved pieces that intersect what it owns (its pieces' runs in the whole
  // parameters). Verifies every checksum and shape first; an Error
  // (naming the file and tensor) leaves the engine as it was. Call before the first forward or at a
  // gradient-accumulation boundary.
  LoadedCheckpoint load(const std::filesystem::path& load_dir, std::string tag = "", const LoadCheckpointOptions& options = {});
  // Loads a whole training state given in memory (every rank passes the same; a DeepSpeed
  // checkpoint mapped to dstrain's names: engine/checkpoint/deepspeed_resume.h): each rank writes
  // its owned pieces' runs of the whole masters and optimizer states, at any world size, ZeRO
  // stage, tensor-parallel / expert-parallel / pipeline layout, then sets the counters, the loss
  // scaler and the LR schedule's position. Every rank first checks everything — each parameter
  // present by name at its whole size, no other name, every value finite, the state names the
  // optimizer's, the optimizer step global_steps - skipped_steps, the counters and the scaler
  // consistent — and the ranks agree on the first Error (naming the source and the tensor), which
  // leaves the engine as it was. Options: load_optimizer_states = false ignores the states and the
  // scaler; load_lr_scheduler_states = false leaves the schedule. Collective; call before the first
  // forward or at a gradient-accumulation boundary. The seed and the 16-bit params' stochastic
  // rounding stream are the engine's (a whole state has none).
  void load_whole_state(const WholeTrainingState& state, const LoadCheckpointOptions& options = {});
  // Waits for a decoupled save's files and commits the checkpoint (manifest, rename, `latest`); a
  // no-op when nothing is pending.
  void wait();
  // The bytes of this rank's part of a checkpoint, its file's tensors (0 when it writes none: stage
  // 0, rank > 0): what a save writes and a decoupled save's snapshot holds.
  std::size_t rank_bytes() const;

 private:
  struct SaveJob;  // a save between its phases; with a decoupled writer, its background thread
  void finish_phase(const SaveJob& job, const std::string& error);
  void commit(SaveJob& job);
  config::Json manifest(const std::string& tag, const config::Json& client_state) const;
  CheckpointMeshPosition position() const;
  // Every parameter of the whole model, in layer order, at whole shapes: the engine's own without a
  // pipeline; on a pipeline stage every stage's, from the model's architecture (a stage holds only
  // its own), checked against the parameters this stage holds. Error naming the parameter otherwise.
  std::vector<CheckpointParam> whole_params() const;
  // checkpoint.writer.decoupled: allocates `bytes` of snapshot memory (replacing any before) and
  // starts faulting it in.
  void prepare_snapshot(std::size_t bytes);
  void restore_scalars(const CheckpointScalars& saved, const LoadCheckpointOptions& options);
  // Puts back the training state initialize made (the seed's parameters, zero optimizer states),
  // after a load streamed into it failed.
  void restore_initial_state();

  Engine& engine_;
  // checkpoint.writer.decoupled: the host memory every snapshot is copied into, faulted in by a
  // background thread from the start, and kept for the whole run. Declared before pending_, whose
  // thread reads it.
  CheckpointMemory snapshot_memory_;
  std::size_t snapshot_bytes_ = 0;
  std::unique_ptr<BackgroundPrefault> prefault_;
  std::unique_ptr<SaveJob> pending_;  // a decoupled save written in the background, not yet committed
  bool writer_announced_ = false;
};

}  // namespace dstrain
