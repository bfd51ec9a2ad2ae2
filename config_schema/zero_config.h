// zero_optimization (+ offload_param, offload_optimizer): docs/zero.md §9. Regime B in
// DeepSpeed (pydantic): unknown keys are errors, integers accept 5e8 and "500".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

// Where offloaded tensors live. DeepSpeed's enum values are lower-case and case-sensitive.
enum class OffloadDevice { none, cpu, nvme };
const char* to_string(OffloadDevice device);

// zero_optimization.offload_param: partitioned parameters off the GPU (stage 3 only).
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::none;
  std::optional<std::string> nvme_path;     // required for nvme
  std::int64_t buffer_count = 5;            // NVMe swap buffers
  std::int64_t buffer_size = 100'000'000;   // elements per swap buffer; must fit the largest parameter
  std::int64_t max_in_cpu = 1'000'000'000;  // elements kept in host memory when device = nvme
  bool pin_memory = true;                   // default true since DeepSpeed v0.19.5
};

// zero_optimization.offload_optimizer: optimizer states (and the optimizer step) on the CPU / NVMe.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::none;
  std::optional<std::string> nvme_path;  // swap folder root (stage 3); required for nvme
  std::int64_t buffer_count = 4;         // >= optimizer tensors per parameter (Adam: 4)
  bool pin_memory = true;                // default true since DeepSpeed v0.19.5
  bool pipeline_read = false;            // overlap NVMe tile reads with compute
  bool pipeline_write = false;           // overlap NVMe tile writes with compute
  bool fast_init = false;
  double ratio = 1.0;          // fraction of the step on the CPU; < 1 needs stage 3
  bool super_offload = false;  // DeepSpeed SuperOffload: not provided by dstrain
  double cpuadam_cores_perc = 0.8;
};

// zero_optimization. Field names are DeepSpeed's pydantic field names: the bare names, not the
// stage3_* aliases (both spellings are accepted on input).
struct ZeroConfig {
  int stage = 0;  // 0 off, 1 optimizer states, 2 +gradients, 3 +parameters
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500'000'000;  // elements per reduction bucket
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;  // resolved: DeepSpeed's None means "true iff stage 3"
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  std::optional<OffloadParamConfig> offload_param;          // absent/null: no parameter offload
  std::optional<OffloadOptimizerConfig> offload_optimizer;  // absent/null: no optimizer offload
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t prefetch_bucket_size = 50'000'000;        // stage3_prefetch_bucket_size; docs say 5e8, code 5e7
  std::int64_t param_persistence_threshold = 100'000;    // stage3_param_persistence_threshold
  std::int64_t model_persistence_threshold = INT64_MAX;  // stage3_model_persistence_threshold (sys.maxsize)
  std::int64_t max_live_parameters = 1'000'000'000;      // stage3_max_live_parameters
  std::int64_t max_reuse_distance = 1'000'000'000;       // stage3_max_reuse_distance
  bool gather_16bit_weights_on_model_save = false;       // stage3_gather_16bit_weights_on_model_save
  std::int64_t module_granularity_threshold = 0;         // stage3_module_granularity_threshold
  bool use_all_reduce_for_fetch_params = false;          // stage3_use_all_reduce_for_fetch_params
  bool allgather_sequential = false;                     // stage3_allgather_sequential
  bool ignore_unused_parameters = true;
  bool legacy_stage1 = false;
  bool round_robin_gradients = false;
  std::int64_t zero_hpz_partition_size = 1;  // ZeRO++ hpZ (docs/zero.md §10)
  bool zero_quantized_weights = false;       // ZeRO++ qwZ
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;  // ZeRO++ qgZ
  Json zeropp_loco_param;                 // null or {err_beta, reset_T}: refused before step 1 (no LoCo in dstrain)
  std::int64_t mics_shard_size = -1;      // > 0 enables MiCS
  bool mics_hierarchical_params_gather = false;
  bool memory_efficient_linear = true;
  bool pipeline_loading_checkpoint = false;
  bool override_module_apply = true;
  bool log_trace_cache_warnings = false;
  bool enable_sanity_checks = false;
  bool save_muon_momentum_buffer_in_memory = false;
  Json leaf_module;                  // null or {classes, names, name_suffixes}
  Json zenflow;                      // null or the ZenFlow block (not provided)
  bool legacy_boolean_form = false;  // "zero_optimization": true/false was used
};

SectionSpec zero_section_spec();
SectionSpec offload_param_section_spec();
SectionSpec offload_optimizer_section_spec();

// Parses the zero_optimization value (`value` is nullptr when the key is absent). `allgather_size`
// is the top-level key used by the legacy boolean form. Writes the canonical resolved section to
// `resolved`.
ZeroConfig parse_zero_config(const Json* value, std::int64_t allgather_size, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
