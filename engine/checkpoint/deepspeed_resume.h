// Resuming a run DeepSpeed saved (docs/checkpoints.md "Resuming a DeepSpeed checkpoint"): the
// reader's DeepSpeedTrainingState (formats/deepspeed_checkpoint.h), by the Hugging Face model's
// names, mapped onto dstrain's parameters (Architecture::hf_param_names: GPT-2's Conv1D weights
// transposed, Llama's q_proj / k_proj / v_proj fused into qkv_proj, each expert a block of the
// stacked expert weights, a tied lm_head saved once or twice alike) and checked against the
// config — what cannot carry over is an Error before step 1 — giving the WholeTrainingState
// CheckpointManager::load_whole_state writes into an engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/checkpoint/whole_state_load.h"
#include "formats/deepspeed_checkpoint.h"
#include "models/model_family.h"

namespace dstrain {

// A shape's dimensions as a vector (the tensors' shapes as DeepSpeed files hold them).
std::vector<std::int64_t> shape_dims(const Shape& s);

// Tensors by Hugging Face name (each row-major at its saved shape, `shapes` where known) mapped to
// dstrain's parameters, whole, row-major: a transposed (Conv1D) tensor transposed, the row blocks of
// a fused parameter put in place, the padded vocabulary rows zero. `what` ("fp32 master",
// "exp_avg", ...) and `source` name them in errors. Error naming the tensor for one that is
// missing, one the model has not (unmapped), one of another shape, and a tied weight saved twice
// with different values.
std::map<std::string, std::vector<float>> map_hf_tensors(const Architecture& model, const std::map<std::string, std::vector<float>>& tensors,
                                                         const std::map<std::string, std::vector<std::int64_t>>& shapes, const std::string& source,
                                                         const std::string& what);

// A DeepSpeed checkpoint as a dstrain run of `model` under `config` continues it.
struct DeepSpeedResume {
  WholeTrainingState state;
  // "DeepSpeed checkpoint DIR (global_step N, ZeRO stage S on W ranks, DTYPE)".
  std::string summary;
  // What was carried over: "masters, exp_avg, exp_avg_sq, step K, lr schedule at iteration I, loss scale X".
  std::string carried;
  // What was ignored, each a sentence (a DeepSpeed loss scale under bf16, ...), said before step 1.
  std::vector<std::string> notes;
};

// Error, naming it, for what cannot carry over: another optimizer type than the config's (when the
// checkpoint names one), other optimizer states, an LR schedule dstrain does not have (or one on one
// side only), an optimizer step that is not global_steps - skipped_steps, any name mapping error.
DeepSpeedResume deepspeed_resume_state(const DeepSpeedTrainingState& ds, const Architecture& model, const config::DsConfig& config);

}  // namespace dstrain
