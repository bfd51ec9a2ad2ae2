// The pieces formats/deepspeed_checkpoint_writer.cpp (stages 0-2), deepspeed_save_zero3.cpp and
// deepspeed_save_universal.cpp share: the checked plan of one save (every refusal happens while it
// is built, before any file is written) and the Python objects DeepSpeed's saving code puts into
// every file (the model states dict, FusedAdam's param groups, the loss scaler, OrderedDict and
// torch.Size spelled so that torch.load gets those types back). Internal to formats/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed_checkpoint_parts.h"
#include "formats/deepspeed_checkpoint_writer.h"
#include "formats/torch_save.h"

namespace dstrain::ds_save {

// The version DeepSpeed's files carry (ds_version): the layout written is that of DeepSpeed's
// saving code at this version (runtime/engine.py, zero/stage_1_and_2.py, zero/stage3.py,
// bf16_optimizer.py, fp16/fused_optimizer.py, checkpoint/ds_to_universal.py).
inline constexpr const char* kDeepSpeedVersion = "0.19.6";

struct Plan {
  const DeepSpeedTrainingState* st = nullptr;
  DeepSpeedSaveLayout layout;
  std::vector<DeepSpeedParamGroup> groups;  // resolved: state.groups, or one group of every name
  bool groups_given = false;                // the client passed param groups (their dicts start with weight_decay)
  nlohmann::ordered_json config;            // the ds_config saved, agreeing with the layout
  std::string lp_dtype;                     // the module's torch dtype, "F32" / "F16" / "BF16"
  std::int64_t optimizer_step = 0;
  double clip_grad = 0;
  // BF16_Optimizer (engine._do_optimizer_sanity_check: bf16, ZeRO stage 1, grad_accum_dtype fp32,
  // no CPU offload) instead of DeepSpeedZeroOptimizer.
  bool bf16_optimizer = false;
  std::filesystem::path tag_dir;
};

// Checks everything and resolves the groups and the config. Error naming what is wrong.
Plan make_plan(const std::filesystem::path& save_dir, const DeepSpeedTrainingState& state, const DeepSpeedSaveLayout& layout);

// Elements of a shape, as the readers count them (Error on a negative or huge size).
using deepspeed_parts::numel_of;
// The named parameters' values (`what`: the master or an optimizer state's map) back to back.
std::vector<float> flat_of(const Plan& p, const std::vector<std::string>& names, const std::map<std::string, std::vector<float>>& what);

TorchValue str(const std::string& s);
TorchValuePair kv(const std::string& key, TorchValue v);
// collections.OrderedDict(list of (key, value)) — the same OrderedDict torch.load gets from the
// pickler's spelling (REDUCE of an empty OrderedDict, then SETITEMS).
TorchValue ordered_dict(std::vector<TorchValuePair> pairs);
TorchValue torch_size(const std::vector<std::int64_t>& shape);
TorchValue json_value(const nlohmann::ordered_json& j);

// FusedAdam's param group g as torch's Optimizer.state_dict packs it: the group's keys in insertion
// order without "params" (the client's weight_decay first when it passed groups, then FusedAdam's
// defaults lr, bias_correction, betas, eps, weight_decay; "step" 0, which FusedAdam.step adds once),
// then "params".
TorchValue adam_param_group(const Plan& p, std::size_t g, std::vector<std::int64_t> param_ids);
// One FusedAdam state entry: step (an int), exp_avg, exp_avg_sq.
TorchValue adam_state(TorchSaveWriter& w, const Plan& p, const std::vector<std::int64_t>& shape, const std::vector<float>& exp_avg,
                      const std::vector<float>& exp_avg_sq);
// The ZeRO optimizers' loss scaler: CreateLossScaler's DynamicLossScaler (fp16, dynamic) or
// LossScaler (fp16's static scale, 1.0 otherwise), with the attributes their __init__ sets.
TorchValue loss_scaler(const Plan& p);
bool dynamic_loss_scale(const Plan& p);

// engine._common_checkpoint_state: the model states dict (module, buffer_names, optimizer, ...,
// ds_config, ds_version). `module`: the module's state dict; `optimizer`: stage 0's, else None.
TorchValue model_states(const Plan& p, TorchValue module, TorchValue optimizer);
// The module state dict of layout.dtype weights (ZeRO-3: empty placeholders of that dtype).
TorchValue module_state(TorchSaveWriter& w, const Plan& p, bool placeholders);

// The optimizer_state_dict rank r saves: DeepSpeedZeroOptimizer's / BF16_Optimizer's state_dict
// (stages 1-2, formats/deepspeed_checkpoint_writer.cpp), stage3._rigid_state_dict (stage 3,
// deepspeed_save_zero3.cpp). The universal form keeps rank 0's.
TorchValue zero12_optimizer_state(TorchSaveWriter& w, const Plan& p, std::int64_t rank);
TorchValue zero3_optimizer_state(TorchSaveWriter& w, const Plan& p, std::int64_t rank);
// Stage 3's refusals (a group DeepSpeed would cut into sub-groups), part of make_plan.
void check_zero3(const Plan& p);
void write_zero3(const Plan& p);

}  // namespace dstrain::ds_save
