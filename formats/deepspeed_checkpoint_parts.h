// What the two DeepSpeed checkpoint readers (and, for names and shapes, the writer) share — the save_checkpoint folders'
// (formats/deepspeed_checkpoint.cpp) and ds_to_universal's (formats/deepspeed_universal_checkpoint.cpp):
// the same model states file, loss scaler objects, param groups and scalars in both. Internal to
// formats/ (not installed): the public interface is formats/deepspeed_checkpoint.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/deepspeed_checkpoint.h"
#include "formats/torch_pickle.h"

namespace dstrain::deepspeed_parts {

// True when `n` is one folder name: not empty, ".", ".." or a path — what a tag and (in a
// universal checkpoint's zero/<name>/) a parameter name must be, read or written.
bool is_folder_name(const std::string& n);
// Elements of a saved shape; Error on a negative or absurdly large size (a corrupt file).
std::int64_t numel_of(const std::vector<std::int64_t>& shape);
// Error naming the file and the parameter for a shape numel_of would refuse: a lying param_shapes
// entry is found where it is read, not later in a shape-less message.
void check_param_shape(const std::vector<std::int64_t>& shape, const std::string& file, const std::string& name);
// The first name that appears twice in `names`, "" if none.
std::string first_repeated(const std::vector<std::string>& names);
// Error unless the parameter name `n` (of `file`) is one folder name: not empty, ".", ".." or a
// path. A universal checkpoint keeps each parameter in zero/<name>/, and a state read from any
// folder may be written as one (dstrain export): a name that is a path would reach outside it.
void check_param_name(const std::string& n, const std::string& file);
// A torch.Size / tuple / tensor's shape.
std::vector<std::int64_t> shape_of(const TorchValue& v);
// "F32" -> "fp32", "F16" -> "fp16", "BF16" -> "bf16".
std::string dtype_name(const std::string& safetensors_dtype);
// A scalar saved as a number or a one-element tensor (torch's Adam keeps `step` as a tensor).
std::int64_t scalar_int(const TorchPickle& file, const TorchValue& v);
// lr, betas, eps, weight_decay of a torch param group into st.param_group; the optimizer type from
// its keys when ds_config named none.
void read_param_group(const TorchValue& g, DeepSpeedTrainingState& st);
// DeepSpeed's LossScaler / DynamicLossScaler object as saved.
DeepSpeedLossScaler loss_scaler_of(const TorchValue& obj);
// optimizer_state_dict.zero_stage: ZeroStageEnum(2), getattr(ZeroStageEnum, 'gradients'), or an int.
int zero_stage_of(const TorchValue& zs);
// The model states file's run-wide entries: the counters, lr_scheduler (as JSON), ds_config (as JSON,
// and its optimizer.type lowercased).
void read_run_state(const TorchValue& model_states_root, DeepSpeedTrainingState& st);
// ds_config's zero_optimization.stage, or -1 when it does not say.
int config_zero_stage(const TorchValue& model_states_root);
// st.groups from the optimizer's param_groups and the (raw) names of each, when they correspond
// one to one; otherwise left empty. `bare` maps a saved name to the state's name.
void set_groups(const TorchValue& param_groups, const std::vector<std::vector<std::string>>& names_per_group, DeepSpeedTrainingState& st,
                const std::function<std::string(const std::string&)>& bare);

// The same for ZeRO-3, whose param_shapes are its sub-groups: a param group's `params` index them.
void set_zero3_groups(const TorchValue& param_groups, const std::vector<std::vector<std::string>>& sub_groups, DeepSpeedTrainingState& st,
                      const std::function<std::string(const std::string&)>& bare);

// The universal checkpoint folder st.dir (ds_to_universal.py's output: zero/<name>/fp32.pt, ...),
// read into st (dir and tag already set).
void read_universal_checkpoint(DeepSpeedTrainingState& st);

}  // namespace dstrain::deepspeed_parts
