#include "config_schema/aio_config.h"

#include <algorithm>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

SectionSpec aio_section_spec() {
  return make_section(
      "aio", Regime::dict_lookup, "Asynchronous I/O for NVMe offload.",
      {
          int_field("block_size", 1048576, "Bytes per I/O request (rounded up to a multiple of 4096, at most 1 GiB).").min(1).max(kMaxBlockSize),
          int_field("queue_depth", 8, "I/O requests in flight per io_uring ring (at most 32768, the kernel's ring limit).")
              .min(1)
              .max(kMaxQueueDepth),
          int_field("intra_op_parallelism", 1, "io_uring rings, each with its own thread (was thread_count).").min(1).max(kMaxIntraOpParallelism),
          bool_field("single_submit", false, "Submit requests one at a time."),
          bool_field("overlap_events", true, "Overlapped submission and completion."),
          bool_field("use_gds", false, "NVIDIA GPUDirect Storage (needs cuFile, which dstrain does not link)."),
      });
}

AioConfig parse_aio_config(const Json* value, ParseContext& ctx, Json& resolved) {
  resolved = read_section(value == nullptr || value->is_null() ? Json::object() : *value, aio_section_spec(), ctx);
  AioConfig c;
  c.block_size = resolved["block_size"].get<std::int64_t>();
  c.queue_depth = resolved["queue_depth"].get<std::int64_t>();
  c.intra_op_parallelism = resolved["intra_op_parallelism"].get<std::int64_t>();
  c.single_submit = resolved["single_submit"].get<bool>();
  c.overlap_events = resolved["overlap_events"].get<bool>();
  c.use_gds = resolved["use_gds"].get<bool>();
  // O_DIRECT transfers are multiples of the page size: the engine rounds up (docs/offload.md §2).
  if (c.block_size % kDirectIoAlignment != 0)
    ctx.warn("aio.block_size", fmt::format("aio.block_size {} is not a multiple of {} (O_DIRECT's alignment): dstrain's I/O engine uses "
                                           "{}-byte pieces; set a multiple of {} (1048576 is the default) to silence this",
                                           c.block_size, kDirectIoAlignment,
                                           (c.block_size + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment, kDirectIoAlignment));
  if (c.use_gds)
    ctx.warn("aio.use_gds",
             "aio.use_gds is true, but GPUDirect Storage needs NVIDIA's cuFile library, which no dstrain build links "
             "(CPU or CUDA): NVMe offload reads and writes through pinned host buffers instead (DeepSpeed's path "
             "without GDS); set use_gds to false to silence this");
  return c;
}

}  // namespace dstrain::config
