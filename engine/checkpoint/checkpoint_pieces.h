// What CheckpointManager's loads share (engine/checkpoint/checkpoint_manager.cpp: a dstrain
// checkpoint's rank files; engine/checkpoint/whole_state_load.cpp: a whole training state given in
// memory, such as a DeepSpeed checkpoint's): the owned pieces as runs of the whole parameters, the
// write of a run's values into the state, and the scalars a load restores. Internal to the
// checkpoint layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/loss_scaler.h"
#include "engine/optim/onebit_optimizer.h"
#include "ops/tensor.h"
#include "zero/model_states.h"

namespace dstrain {

// One run of an owned piece in the whole parameter's element space (docs/checkpoints.md
// "Tensor parallelism"): elements [first, first + numel) of owned piece `piece` (counted from the
// piece's start) are elements [whole_offset, whole_offset + numel) of the whole parameter. Without
// tensor parallelism every piece is one run, whole_offset = its tensor offset.
struct PieceRun {
  std::size_t piece = 0;  // index into ModelStates::owned_pieces()
  std::int64_t first = 0;
  std::int64_t whole_offset = 0;
  std::int64_t numel = 0;
};

// The runs of the owned pieces a save writes (`saving`: those this rank saves — tensor-parallel
// rank 0 for a replicated parameter, no rank for a pipeline copy in `copies`) or a load fills (every
// one), in owned-piece order.
std::vector<PieceRun> piece_runs_of(const ModelStates& st, int tp_rank, bool saving, const std::set<std::string>& copies = {});

// Which buffer a load writes: the fp32 masters (and the params from them, rounded, unless the
// 16-bit params come too), optimizer state `state`, or the 16-bit params themselves.
enum class WholeBuffer { master, state, param };

// Writes `values` (fp32 for master / state, the engine's dtype for param) as elements
// [first, first + values.numel()) of owned piece p through the store (docs/training_state.md §3).
// have_lowp: the 16-bit params are written apart (WholeBuffer::param), so a master does not set them.
void write_piece_values(ModelStates& st, const OwnedPiece& p, std::int64_t first, WholeBuffer which, std::size_t state, const Tensor& values,
                        bool have_lowp);

// Where a rank sits in the whole mesh (docs/parallelism.md §1: the pipeline outermost, then the
// data group, then tensor parallelism innermost; docs/checkpoints.md "Pipeline parallelism").
struct CheckpointMeshPosition {
  int pp_size = 1, pp_rank = 0;      // the pipeline group: its rank is the stage
  int data_size = 1, data_rank = 0;  // the engine's data group (DP x SP ranks of the stage)
  int tp_size = 1, tp_rank = 0;
  // Expert parallelism at stage 0: the data ranks hold different experts, so every rank writes the
  // values it alone saves (saves_piece), numbered as at stage >= 1.
  bool every_rank_writes = false;
  int mesh_size() const { return pp_size * data_size * tp_size; }
  // (stage · data size + data rank) · TP + tensor-parallel rank: the pipeline outermost, so that
  // without one it is the mesh rank of a run without a pipeline (data rank · TP + tp rank).
  int mesh_rank() const { return (pp_rank * data_size + data_rank) * tp_size + tp_rank; }
  // Mesh rank 0 makes the folder, writes the manifest and commits.
  bool first() const { return mesh_rank() == 0; }
  // The rank file this rank writes: its mesh rank at ZeRO stage >= 1 (every rank writes its
  // partition), else (data rank 0 of each stage and tensor-parallel index writes the stage's
  // values) stage · TP + tensor-parallel rank, so that the files are numbered 0 .. PP·TP - 1.
  int file(int zero_stage) const { return zero_stage >= 1 || every_rank_writes ? mesh_rank() : pp_rank * tp_size + tp_rank; }
  int files(int zero_stage) const { return zero_stage >= 1 || every_rank_writes ? mesh_size() : pp_size * tp_size; }
};

// Read in phase 1 of a load, inside its try: every typed read of the manifest's scalars happens
// there, so a field that is missing or of the wrong type is the malformed-manifest Error before
// anything of the engine changes (nothing of this may throw in phase 2).
struct CheckpointScalars {
  std::int64_t global_steps = 0, global_samples = 0, skipped_steps = 0;
  double last_step_lr = 0.0;
  float last_step_loss = 0.0f;
  std::int64_t lr_last_batch_iteration = 0;
  std::uint64_t seed = 0;
  // The loss scaler, and the 1-bit optimizers' phase where saved (applied with load_optimizer_states).
  LossScalerState scaler;
  std::string scaler_kind;
  std::optional<OneBitOptimizer::SavedState> onebit;
  std::string saved_layout;  // "ZeRO stage S on W rank(s) in DTYPE", for the log
};

}  // namespace dstrain
