// "auto" values (docs/config.md §6): DeepSpeed has no resolution of its own; HF Trainer / Accelerate
// rewrite the dict first. dstrain resolves the same keys from AutoValues, following HF's mapping,
// and records each resolution; any other "auto" is an error naming the key (see read_section).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/warning.h"

namespace dstrain::config {

// What can resolve "auto". Each member is what HF's TrainingArguments would supply.
struct AutoValues {
  std::optional<std::int64_t> train_micro_batch_size_per_gpu, gradient_accumulation_steps, hidden_size;
  std::optional<double> gradient_clipping, lr, eps, weight_decay;
  std::optional<std::pair<double, double>> betas;
  std::optional<std::int64_t> total_num_steps, warmup_num_steps;
  std::optional<std::string> precision;  // "fp32" | "fp16" | "bf16" (fills fp16.enabled / bf16.enabled)
  // hidden_size is the model's (train fills it from n_embd), not an option the user gave: a config
  // without "auto" bucket sizes leaves it unused without a warning.
  bool hidden_size_from_model = false;
};

// Replaces every "auto" that AutoValues (or the HF mapping) can derive in a copy of the config tree,
// appending "path: auto -> value (from source)" to `resolved`. Throws Error naming the key and the
// option that would fill it when a derivable key lacks its option. `data_parallel_world_size`
// feeds train_batch_size = micro * GAS * world.
//
// Where a key has an explicit value and the matching option is also given with a different value,
// HF Trainer raises ("... mismatch TrainingArguments values"); dstrain keeps the config value and
// appends a Warning to `mismatches`, because a CLI may pass its defaults for every option.
Json resolve_auto_values(const Json& root, const AutoValues& autos, std::int64_t data_parallel_world_size, std::vector<std::string>& resolved,
                         std::vector<Warning>* mismatches = nullptr);

// The options given that `root` (the config before resolution) has no key for: an option fills an
// "auto" key and is compared with an explicit value, but with no key at all it would be ignored
// without a word. One Warning per such option, naming the value that applies instead and how to
// make the option count ("auto" in the config). A config with no "optimizer" block takes every
// optimizer option (train's default AdamW is built from them).
std::vector<Warning> unused_auto_options(const Json& root, const AutoValues& autos);

}  // namespace dstrain::config
