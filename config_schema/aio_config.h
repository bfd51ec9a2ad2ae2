// aio: the asynchronous I/O engine of NVMe offload (docs/config.md §8.1). Regime A (unknown keys are
// warnings, notably the pre-v0.16.4 name thread_count).
#pragma once

#include <cstdint>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

// The engine's limits (offload/io_options.h): a ring holds at most 32768 entries (IORING_MAX_ENTRIES);
// rings each have a thread, so their number is bounded; pieces are multiples of the page size.
inline constexpr std::int64_t kMaxQueueDepth = 32768;
inline constexpr std::int64_t kMaxIntraOpParallelism = 256;
inline constexpr std::int64_t kDirectIoAlignment = 4096;
// One piece moves at most 1 GiB (Linux transfers at most 2 GiB - 4 KiB per read or write): a larger
// block_size is refused, naming the range, rather than capped without a word.
inline constexpr std::int64_t kMaxBlockSize = std::int64_t{1} << 30;

struct AioConfig {
  std::int64_t block_size = 1048576;      // bytes per I/O request (piece)
  std::int64_t queue_depth = 8;           // pieces in flight per ring
  std::int64_t intra_op_parallelism = 1;  // rings, one thread each (was thread_count)
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;  // GPUDirect Storage: warned (no cuFile), not used
};

SectionSpec aio_section_spec();
AioConfig parse_aio_config(const Json* value, ParseContext& ctx, Json& resolved);

}  // namespace dstrain::config
