// A dstrain training checkpoint as the DeepSpeed run of its Hugging Face model would have saved it
// (docs/checkpoints.md "Saving for DeepSpeed"): `dstrain export --format deepspeed|universal` and
// `dstrain train --save-format deepspeed`. The other direction of engine/checkpoint/deepspeed_resume.h:
// dstrain's whole parameters and optimizer states put back under their Hugging Face names and
// shapes (GPT-2's Conv1D weights and their moments transposed to (in, out), Llama's qkv_proj cut
// into q_proj / k_proj / v_proj, a mixture of experts' stacked weights into one tensor per expert,
// the padded vocabulary rows dropped, a tied lm_head saved in the
// module's state dict as the embedding), with the counters, the loss scaler, the LR schedule's
// position and the config — written by formats/deepspeed_checkpoint_writer.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/deepspeed_checkpoint.h"
#include "formats/deepspeed_checkpoint_writer.h"
#include "models/model_family.h"

namespace dstrain {

// One Hugging Face tensor of a model: its name, its shape as the Hugging Face module holds it
// (Conv1D: (in, out)), and whether it is a parameter of its own (named_parameters lists it) or a
// second name of a tied one (only the module's state dict holds it).
struct HfTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  bool tied = false;
  std::vector<float> values;
};

// dstrain's whole tensors (by parameter name, whole shapes, row-major: one of master / exp_avg /
// ...) as the model's Hugging Face tensors, in the Hugging Face model's order — map_hf_tensors'
// inverse: map_hf_tensors(model, hf_tensors_of(model, w)) == w for every parameter, padding rows zero.
// Error naming the parameter when one is missing or of another size.
std::vector<HfTensor> hf_tensors_of(const Architecture& model, const std::map<std::string, std::vector<float>>& whole, const std::string& what);

// Error, naming the parameter, when the model's parameters cannot all be written under Hugging Face
// names that dstrain reads back (a parameter without one, blocks that do not cover their
// parameter), and naming the optimizer when it is not Adam or AdamW (whose states,
// as DeepSpeed's FusedAdam keeps them, are what the writer writes) — the pre-flight of --save-format.
void check_deepspeed_exportable(const Architecture& model, const std::string& optimizer_type);

// The checkpoint save_dir/<tag> (tag "": the one `latest` names) as a DeepSpeedTrainingState:
// Hugging Face names, masters and every optimizer state whole, the optimizer step
// (global_steps - skipped_steps), the counters, the dynamic fp16 loss scaler, the schedule's
// position, the config, and two param groups as a Hugging Face Trainer makes them (the decayed
// parameters with the config's weight_decay, the rest with 0) — dstrain decays what those groups
// decay. Error naming the file for a checkpoint that cannot be read whole.
DeepSpeedTrainingState deepspeed_state_of_checkpoint(const std::filesystem::path& save_dir, const std::string& tag);

// The checkpoint's own layout as DeepSpeed's: its ZeRO stage, its data-parallel ranks and its dtype.
DeepSpeedSaveLayout deepspeed_layout_of_checkpoint(const std::filesystem::path& save_dir, const std::string& tag);

enum class DeepSpeedExportFormat { deepspeed, universal };

// Writes the checkpoint save_dir/<tag> into `output` as a DeepSpeed save_checkpoint folder with
// `layout` (its stage, data-parallel ranks and dtype; unset: the checkpoint's own) or as a
// universal checkpoint. `output` must not be save_dir nor inside it (checked before anything is
// read). Returns the tag written.
std::string export_deepspeed_checkpoint(const std::filesystem::path& save_dir, const std::string& tag, const std::filesystem::path& output,
                                        DeepSpeedExportFormat format, std::optional<DeepSpeedSaveLayout> layout = std::nullopt);

}  // namespace dstrain
