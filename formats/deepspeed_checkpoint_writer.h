// DeepSpeed checkpoint folders written without Python, laid out exactly as DeepSpeed's own saving
// code lays them out, so that DeepSpeed's load_checkpoint resumes them, its zero_to_fp32.py
// consolidates them and its load_universal reads the universal form — the other direction of
// formats/deepspeed_checkpoint.h, from the same DeepSpeedTrainingState (Hugging Face names, whole
// fp32 tensors). Files are torch.save files (formats/torch_save.h); the pickled classes are
// DeepSpeed's own (deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler / LossScaler,
// deepspeed.runtime.zero.config.ZeroStageEnum), so torch.load in a DeepSpeed installation gets the
// objects DeepSpeed's saving code would have put there.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "formats/deepspeed_checkpoint.h"

namespace dstrain {

// The layout of the DeepSpeed run the folder is written for.
struct DeepSpeedSaveLayout {
  int zero_stage = 0;         // 0-3
  int dp_world_size = 1;      // the data-parallel ranks whose files are written (>= 1)
  std::string dtype = "fp32"; // the module weights' dtype: "fp32", "fp16" (FP16_Optimizer / ZeRO's fp16), "bf16"
};

// Writes save_dir/<state.tag>/ as engine.save_checkpoint of a run with `layout` writes it
// (runtime/engine.py _save_checkpoint and _save_zero_checkpoint; zero/stage_1_and_2.py,
// zero/stage3.py, bf16_optimizer.py, fp16/fused_optimizer.py state_dict): mp_rank_00_model_states.pt
// (module in layout.dtype, param_shapes, buffer_names, counters, lr_scheduler, ds_config,
// ds_version; stage 0: the optimizer), per rank [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt
// (the flat fp32 partitions with DeepSpeed's alignment and padding, base_optimizer_state with
// exp_avg / exp_avg_sq / step, loss_scaler), for stage 3 also
// zero_pp_rank_<r>_mp_rank_00_model_states.pt; then save_dir/latest naming the tag, last, so that
// a folder without `latest` updated is never half-new. `state.module` empty: the masters rounded to
// layout.dtype. Error, before anything is written, naming what is wrong: a tag that is not one
// folder name, a layout out of range, a name without master / shape / optimizer state values of
// the right size; and for an I/O failure, naming the file.
void write_deepspeed_checkpoint(const std::filesystem::path& save_dir, const DeepSpeedTrainingState& state, const DeepSpeedSaveLayout& layout);

// Writes save_dir/<state.tag>/ as DeepSpeed's checkpoint/ds_to_universal.py writes a universal
// checkpoint converted from the save_checkpoint folder of `source` (ZeRO stage 1-3; the
// conversion's result depends on it): ZeRO 1/2 zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt (each
// {"cat_dim": 0, "param": the tensor}) and step.pt per parameter, ZeRO 3 the flat tensors alone;
// zero/optimizer_state.pt, and the model states file(s) load_universal reads the counters, schedule
// and config from; then save_dir/latest_universal naming the tag. `source` absent: the state's own
// zero_stage / dp_world_size / dtype when they name a ZeRO layout, else ZeRO 2 on one rank in fp32.
// The same errors as write_deepspeed_checkpoint, and stage 0 (ds_to_universal converts ZeRO folders).
void write_universal_checkpoint(const std::filesystem::path& save_dir, const DeepSpeedTrainingState& state,
                                const std::optional<DeepSpeedSaveLayout>& source = std::nullopt);

}  // namespace dstrain
