// aio: the asynchronous I/O engine of NVMe offload (docs/config.md §8.1). Regime A (unknown keys are
// warnings, notably the pre-v0.16.4 name thread_count).
#pragma once

#include <cstdint>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

struct AioConfig {
  std::int64_t block_size = 1048576;      // bytes per I/O request
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;  // threads per read/write request (was thread_count)
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;                   // GPUDirect Storage
};

SectionSpec aio_section_spec();
AioConfig parse_aio_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
