// A checkpoint's manifest (checkpoint.json, docs/checkpoints.md "What is saved") checked field by
// field before anything is loaded, and the model it records compared with a model built now. A
// manifest edited by hand or damaged on disk must be an Error naming the field, the file and the
// value — never a resume at step 10^18, a load that reads one rank file of four, or a model with
// twice the heads continuing from weights trained with half (n_head leaves every parameter's shape
// as it is, so the parameter list alone cannot tell).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "models/model_family.h"

namespace dstrain {

// The most optimizer steps a manifest may count: no run takes 2^40 (10^12) steps, and the counters
// derived from it (micro-steps = steps x gradient accumulation) stay far from int64's end.
inline constexpr std::int64_t kMaxCheckpointSteps = std::int64_t{1} << 40;

// Every field of `manifest` (read from `manifest_path`) of the type and in the range a save writes:
// the layout's world size, ZeRO stage, dtype (fp32, fp16, bf16), tensor-parallel size (absent:
// 1; it divides the world size) and pipeline stages (absent: 1; they divide world size / TP); as
// many rank indexes as the layout wrote (one per rank at ZeRO stage >= 1, one per pipeline stage
// and tensor-parallel rank at stage 0), each named as a save names it; the
// counters (integers, global_steps <= kMaxCheckpointSteps, skipped <= global, equal to N of a
// "global_step<N>" tag or folder); the loss scaler's kind, the schedule, the seed, the parameter
// list. Error naming the field, the file, the value and what it must be.
void validate_checkpoint_manifest(const config::Json& manifest, const std::filesystem::path& manifest_path);

// The config keys whose values differ between the model a manifest records ("architecture") and
// `built`, each as "n_head 2 in the checkpoint, 4 here" (the family first when it differs); empty
// when they are the same model, or the manifest records no architecture (a model without a family).
// Keys that only set how the model trains (dropout probabilities, initializer_range, use_cache) are
// listed apart: a resume may change them. Both are compared as their family writes them (Architecture::config_json), so the manifest's
// config is read back by its family first.
struct ArchitectureDifferences {
  std::vector<std::string> model;     // keys that make it another model (n_head, n_layer, rope_theta, ...)
  std::vector<std::string> settings;  // training settings only (dropout, initializer_range, use_cache)
};
ArchitectureDifferences architecture_differences(const config::Json& manifest, const std::string& where, const Architecture& built);

}  // namespace dstrain
