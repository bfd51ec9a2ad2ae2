// tensor_parallel: AutoTP training (docs/config.md §8.5), read as DeepSpeed 0.19's TPTrainingConfig
// (deepspeed/runtime/tensor_parallel/config.py, a pydantic model: regime B) and, inside it,
// partition_config as AutoTPConfig.from_dict reads it (deepspeed/module_inject/autotp_config.py,
// dict lookups: regime A).
//
//   "tensor_parallel": {"autotp_size": 4, "preset_model": "llama"}
//
// The tensor-parallel degree is autotp_size when it is > 1, else 1: DeepSpeed's engine shards the
// model only when autotp_size() > 1 and then overwrites tp.tp_size with it (a tp.tp_size other than
// 1 or autotp_size is its ValueError); tp.tp_size alone shards nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

// How a matched parameter is cut (DeepSpeed's PartitionType): column = output dimension (all-reduce
// in backward), row = input dimension (all-reduce after forward), skip = replicated.
enum class TpPartitionType { column, row, skip };
const char* to_string(TpPartitionType t);

// One entry of a layer spec's `shape`: a size (> 0, or -1 = inferred), or, at partition_dim only,
// the sizes of unequal sub-parameters (e.g. GQA's q, k, v rows: [4096, 1024, 1024]).
struct TpShapeDim {
  std::int64_t size = -1;               // meaningful when sub_sizes is empty
  std::vector<std::int64_t> sub_sizes;  // non-empty: unequal sub-parameters (1-level nesting)
};

// DeepSpeed's TPLayerSpec.
struct TpLayerSpec {
  // Regular expressions over parameter names ("model.layers.0.self_attn.q_proj.weight"), matched
  // as Python's re.match does: anchored at the start, not at the end (tp_pattern_matches).
  std::vector<std::string> patterns;
  TpPartitionType partition_type = TpPartitionType::column;
  std::optional<std::vector<TpShapeDim>> shape;         // logical shape to view the weight as before cutting
  std::optional<std::int64_t> partition_dim;            // as given; see effective_partition_dim()
  std::optional<std::vector<std::string>> model_types;  // only for these model_type values (any case)
  bool gather_output = false;                           // column: all-gather the output shards (untied output layers)
  bool grad_allreduce = false;                          // skip: sum the replicated parameter's gradient over the TP group

  // DeepSpeed's get_partition_dim(): partition_dim, else 0 for column, 1 for row and skip.
  std::int64_t effective_partition_dim() const { return partition_dim ? *partition_dim : partition_type == TpPartitionType::column ? 0 : 1; }
};

// DeepSpeed's AutoTPConfig (partition_config, or a preset). tp_size is not kept: DeepSpeed sets it
// from autotp_size.
struct TpPartitionConfig {
  bool use_default_specs = true;  // with preset_model: the custom specs first, then the preset's
  std::vector<TpLayerSpec> layer_specs;
  std::int64_t embedding_partition_dim = 1;
  std::vector<std::string> lm_head_patterns = {"lm_head", "embed_out"};
  bool strict_mode = false;  // a Linear no spec matches is an error (else it stays replicated)
};

struct TensorParallelConfig {
  bool configured = false;                            // the section is present
  std::int64_t autotp_size = 0;                       // the tensor-parallel degree; 0 or 1 = off
  bool tp_overlap_comm = false;                       // overlap the row-parallel all-reduce with computation
  std::int64_t tp_size = 1;                           // tp.tp_size: 1 or autotp_size (DeepSpeed overwrites it)
  std::int64_t tp_grain_size = 1;                     // tp.tp_grain_size: shard granularity of uneven splits
  std::optional<std::string> preset_model;            // lower-cased; a name DeepSpeed knows (tp_preset_names) or one warned about
  std::optional<TpPartitionConfig> partition_config;  // as given (not merged with the preset)
  std::optional<Json> injection_policy_tuple;         // inference only; warned
  bool keep_module_on_host = false;
  bool replace_with_kernel_inject = false;  // inference kernels; warned when true

  // The degree the device mesh uses: autotp_size when > 1, else 1 (DeepSpeed's autotp_size() > 1).
  std::int64_t size() const { return autotp_size > 1 ? autotp_size : 1; }
  bool enabled() const { return size() > 1; }

  // The partition rules DeepSpeed builds (TPTrainingConfig.get_partition_config_object): the
  // preset's, then partition_config's — the custom specs first, followed by the preset's when
  // use_default_specs is true, else the custom config alone. nullopt: neither is given (DeepSpeed
  // then uses the model's Hugging Face tp_plan, or its heuristics).
  std::optional<TpPartitionConfig> effective_partition_config() const;
};

SectionSpec tensor_parallel_section_spec();
// `key` is the spelling given: "tensor_parallel" (the field name) or "tp" (its alias).
SectionSpec tensor_parallel_tp_section_spec(const std::string& key);
SectionSpec tp_partition_config_section_spec();
// One entry of partition_config.layer_specs; `path` names it ("tensor_parallel.partition_config.layer_specs[0]").
SectionSpec tp_layer_spec_section_spec(const std::string& path = "tensor_parallel.partition_config.layer_specs[]");

TensorParallelConfig parse_tensor_parallel_config(const Json* value, ParseContext& ctx, Json& resolved);

// The presets DeepSpeed's AutoTPPresets.get_preset knows (lower-case; it lower-cases the name).
const std::vector<std::string>& tp_preset_names();
// A preset's layer specs, as AutoTPPresets defines them; nullopt for a name DeepSpeed does not know.
std::optional<TpPartitionConfig> tp_preset(const std::string& name);

// Compiles a layer-spec pattern as dstrain matches it (std::regex, ECMAScript), refusing the Python
// re constructs that ECMAScript lacks or reads differently (\A, \Z, (?P<..>), (?<=..), inline flags);
// `path` names the key in the Error.
std::regex compile_tp_pattern(const std::string& pattern, const std::string& path);
// Python's re.match(pattern, name): a match that starts at the beginning of the name (it need not
// reach the end; a pattern ending in $ asks for that).
bool tp_pattern_matches(const std::regex& pattern, const std::string& name);

}  // namespace dstrain::config
