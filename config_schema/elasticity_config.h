// elasticity (docs/batch.md §4): DeepSpeed computes the batch triple from the elastic settings
// and the data-parallel world size, overriding train_batch_size / micro batch / GAS. Regime A.
// The computation follows deepspeed/elasticity/elasticity.py (versions 0.1 and 0.2).
#pragma once

#include <cstdint>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

struct ElasticityConfig {
  bool enabled = false;
  std::int64_t max_train_batch_size = 2000;              // required when enabled
  std::vector<std::int64_t> micro_batch_sizes{2, 4, 6};  // required when enabled
  std::int64_t min_gpus = 1;
  std::int64_t max_gpus = 10000;
  double min_time = 0.0;  // minutes; scheduler hint only
  bool prefer_larger_batch = true;
  bool ignore_non_elastic_batch_info = false;  // else giving batch keys is an error
  double version = 0.2;
  std::int64_t num_gpus_per_node = 1;
  std::int64_t model_parallel_size = 1;
};

// The batch DeepSpeed derives for one data-parallel world size.
struct ElasticBatch {
  std::int64_t train_batch_size = 0;
  std::vector<std::int64_t> valid_world_sizes;  // data-parallel sizes this batch supports
  std::int64_t micro_batch_size = 0;
  std::int64_t gradient_accumulation_steps = 0;
};

SectionSpec elasticity_section_spec();

ElasticityConfig parse_elasticity_config(const Json* value, ParseContext& ctx, Json& resolved);

// DeepSpeed's compute_elastic_config(world_size=W, return_microbatch=True) followed by
// GAS = final // (micro * W). Throws Error (ElasticityIncompatibleWorldSize etc.) with the fix.
ElasticBatch compute_elastic_batch(const ElasticityConfig& config, std::int64_t data_parallel_world_size);

}  // namespace dstrain::config
