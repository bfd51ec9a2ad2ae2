// The config's AutoTP partition rules (tensor_parallel.preset_model, tensor_parallel.partition_config)
// against the model dstrain trains, before step 1 (docs/parallelism.md §2 "partition_config",
// docs/config.md §8.5).
//
// DeepSpeed's AutoTP cuts a Hugging Face module tree by these rules: each linear layer takes the
// first layer spec whose patterns re.match its name + ".weight" (column = output dimension, row =
// input dimension, skip = whole; a `shape` views a fused weight as sub-parameters cut one by one).
// dstrain's layers declare their own cut (ParamSpec::split), so a rule is honoured where it asks for
// that cut, and refused where it asks for another — with the rule, the parameter, the reason and
// the fix. A pattern that names no parameter of the model is an error (DeepSpeed skips it
// silently, and the layers it meant to cut stay whole): a preset written for another architecture
// is refused that way.
#pragma once

#include <string>
#include <vector>

#include "config_schema/tensor_parallel_config.h"
#include "models/model_family.h"

namespace dstrain {

// Checks the rules DeepSpeed would build from `tp` (TensorParallelConfig::effective_partition_config:
// the preset's, partition_config's, or both merged) against `model`'s parameters as its Hugging
// Face model names them (Architecture::hf_param_names), for `tp_ranks` tensor-parallel ranks.
// Returns the lines to print at the start of the run (one per rule: honoured, not applied to this
// model_type, or shadowed by an earlier rule; the parameters no rule names, which dstrain cuts as
// its layers declare); empty when the config has no rules. Throws Error, naming the key path:
//   - a pattern of a rule that names no parameter (the rule's place and the pattern, the names it
//     could have matched, and the presets that fit the model);
//   - a rule that asks for another cut than dstrain's: row for a column-parallel weight, column or
//     skip for a row-parallel one, a cut of a norm weight, of a bias without its weight, of a
//     vocabulary-parallel embedding; a shape whose sub-parameters are not dstrain's blocks of a
//     fused weight (GPT-2's c_attn needs [3, -1]); gather_output on a layer other than the LM head;
//     grad_allreduce on a parameter whose gradient is already whole on every rank;
//   - strict_mode with a linear weight no rule names (DeepSpeed's "No matching spec");
//   - embedding_partition_dim other than 1, lm_head_patterns that miss the LM head or name another
//     parameter.
std::vector<std::string> check_tensor_parallel_partition(const config::TensorParallelConfig& tp, const Architecture& model, int tp_ranks);

// The presets of config::tp_preset_names() that check_tensor_parallel_partition accepts for `model`
// ("llama" and "qwen2" for the Llama family; none for GPT-2), for messages.
std::vector<std::string> tp_presets_for(const Architecture& model);

}  // namespace dstrain
