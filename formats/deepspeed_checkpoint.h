// DeepSpeed's save_checkpoint folders read without Python: <save_dir>/latest naming the tag, and in
// <save_dir>/<tag>/ the model states (mp_rank_00_model_states.pt: "module", "param_shapes",
// "buffer_names", the counters, "lr_scheduler", stage 0's "optimizer") and, under ZeRO, one optimizer
// file per data-parallel rank ([bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt:
// "optimizer_state_dict" with "single_partition_of_fp32_groups", "base_optimizer_state",
// "group_paddings", "partition_count", "zero_stage", "loss_scaler"). The flat partitions are taken
// apart as deepspeed/utils/zero_to_fp32.py does: the ranks' partitions of a group concatenated, the
// alignment padding at the group's tail dropped, the parameters cut off in param_shapes order.
// ZeRO stage 3 (zero_pp_rank_<r>_mp_rank_00_model_states.pt per rank, "fp32_flat_groups" and the base
// optimizer's "optimizer_state_dict"): each parameter ceil(numel / W) per rank, as zero_to_fp32 merges them.
// A universal checkpoint (ds_to_universal.py's output: zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt,
// step.pt, zero/optimizer_state.pt, the copied model states; `latest_universal` naming it) is read
// into the same state (formats/deepspeed_universal_checkpoint.cpp).
// Every file goes through the restricted unpickler (formats/torch_pickle.h): nothing is executed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dstrain {

struct DeepSpeedLossScaler {
  double cur_scale = 1.0;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  std::int64_t cur_hysteresis = 0;
  bool dynamic = false;
};

// One of the optimizer's param groups: its parameters (names as in DeepSpeedTrainingState::names)
// and the weight decay it was saved with.
struct DeepSpeedParamGroup {
  std::vector<std::string> names;
  double weight_decay = 0;
};

struct DeepSpeedTrainingState {
  std::filesystem::path dir;       // the global_step folder read
  std::string tag;                 // "global_step10"
  int zero_stage = 0;
  int dp_world_size = 1;           // the saving run's data-parallel ranks (files found)
  std::string dtype;               // "fp32", "fp16", "bf16": the module weights' dtype
  std::vector<std::string> names;  // parameter names in the saved order, "module." stripped
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::vector<float>> master;  // each parameter's fp32 master (stage 0 fp32: the module's weights)
  std::map<std::string, std::vector<float>> module;  // each parameter's module weights as saved, widened to fp32
  std::map<std::string, std::map<std::string, std::vector<float>>> optimizer_states;  // "exp_avg" / "exp_avg_sq" -> name -> values
  std::optional<std::int64_t> optimizer_step;  // Adam's step
  std::string optimizer_type;                  // ds_config's optimizer.type lowercased, else from the param group's keys, else ""
  std::map<std::string, double> param_group;   // lr, betas0, betas1, eps, weight_decay of group 0 as saved
  std::int64_t global_steps = 0, global_samples = 0, skipped_steps = 0;
  std::optional<DeepSpeedLossScaler> loss_scaler;
  std::optional<std::string> lr_scheduler_json;  // the scheduler's state_dict as JSON text, if saved
  std::optional<std::string> ds_config_json;     // the saving run's ds_config as JSON text, if saved
  // The optimizer's param groups in order (the flat fp32 groups of ZeRO 1-3 follow them). Empty when
  // read from a folder that does not say; the writer then saves one group of every name with
  // param_group's weight_decay.
  std::vector<DeepSpeedParamGroup> groups;
  // Tied weights: a second name of a parameter -> the parameter's name (GPT-2's "lm_head.weight" ->
  // "transformer.wte.weight"), as DeepSpeed's shared_params says. The writer puts each into the
  // module's state dict as the same tensor (load_state_dict(strict=True) asks for every name).
  std::map<std::string, std::string> tied;
  // What a dstrain run's checkpoint adds to DeepSpeed's model states, as a client_state entry
  // "dstrain" (DeepSpeed's save_checkpoint(client_state=...) puts such keys beside its own and gives
  // them back on load): {"data": {"epoch", "position"}, "seed", "sequence_length"} — the data
  // loader's position, so that a run resumed from the folder continues the data as dstrain's own
  // resume does. Absent in a folder DeepSpeed saved.
  std::optional<std::string> dstrain_json;
};

// `dir`: a save_checkpoint folder (its `latest` — without one, its `latest_universal` — names the tag
// unless `tag` is given) or a tag folder itself; a tag folder holding zero/ is a universal checkpoint.
// Error naming the file and the cause: missing rank files, a `latest` / `latest_universal` naming a
// folder that is not there or outside, shapes that do not add up with the partitions and paddings (or,
// universal, differ from param_shapes), a missing parameter folder or fp32.pt, truncated files,
// refused globals, a universal checkpoint of a model-parallel run.
DeepSpeedTrainingState read_deepspeed_checkpoint(const std::filesystem::path& dir, const std::string& tag = "");

// True when `dir` looks like a DeepSpeed checkpoint folder (latest file, or
// global_step*/mp_rank_00_model_states.pt, or zero/ of a universal one) — and not dstrain's own
// save_dir (whose `latest` names a folder holding checkpoint.json) nor one of its tag folders.
bool is_deepspeed_checkpoint(const std::filesystem::path& dir);

}  // namespace dstrain
