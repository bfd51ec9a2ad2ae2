// A training checkpoint's weights in its model family's Hugging Face layout — DeepSpeed's
// zero_to_fp32.py, without Python (`dstrain consolidate`, docs/checkpoints.md "Consolidate").
#pragma once

#include <filesystem>
#include <string>

#include "ops/dtype.h"

namespace dstrain {

// Reads every parameter's fp32 masters from the checkpoint save_dir/<tag> (tag "": the one
// save_dir/latest names), from however many ranks' pieces they were saved in, verifying each
// piece's checksum, and writes them in the layout of the model the manifest records (its family's
// Architecture::export_weights) with dtype `dtype` (fp32: the same bytes as `dstrain train
// --save-weights` of the same run), atomically. Returns the tag read. Error naming the file and
// tensor for a missing, corrupt or incomplete checkpoint, or one whose model has no family.
std::string consolidate_checkpoint(const std::filesystem::path& save_dir, std::string tag, const std::filesystem::path& output,
                                   DType dtype = DType::fp32);

}  // namespace dstrain
