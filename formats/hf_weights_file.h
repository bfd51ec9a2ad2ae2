// Where a Hugging Face checkpoint's weights are, given what a user passes to --init-from.
//
// Hub checkpoints come as a folder (config.json, tokenizer.json, and the weights as one
// model.safetensors or shards listed by model.safetensors.index.json), so the folder itself is
// accepted wherever a weights file is (docs/models.md, "Weights").
#pragma once

#include <filesystem>

namespace dstrain {

// `path` itself when it is not a folder; for a folder, its model.safetensors.index.json when
// present (a sharded checkpoint), else its model.safetensors. Throws Error naming the folder and
// both file names when it holds neither. `option` names the input in the message ("--init-from").
std::filesystem::path hf_weights_file(const std::filesystem::path& path, const char* option);

}  // namespace dstrain
