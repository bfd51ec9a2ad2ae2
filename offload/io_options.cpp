#include "offload/io_options.h"

#include <algorithm>

#include "config_schema/aio_config.h"
#include "ops/error.h"

namespace dstrain {

IoOptions IoOptions::from_config(const config::AioConfig& aio) {
  IoOptions o;
  o.block_size = static_cast<std::uint64_t>(aio.block_size);
  o.queue_depth = static_cast<unsigned>(std::min<std::int64_t>(aio.queue_depth, kMaxQueueDepth + 1));
  o.intra_op_parallelism = static_cast<unsigned>(std::min<std::int64_t>(aio.intra_op_parallelism, 1 << 20));
  o.single_submit = aio.single_submit;
  o.overlap_events = aio.overlap_events;
  return o;
}

std::uint64_t IoOptions::effective_block_size(std::uint64_t alignment) const {
  const std::uint64_t rounded = (std::max<std::uint64_t>(block_size, 1) + alignment - 1) / alignment * alignment;
  return std::min(rounded, kMaxBlockSize / alignment * alignment);
}

void IoOptions::validate() const {
  if (block_size < 1 || block_size > kMaxBlockSize)
    fail(
        "aio.block_size is {}: it must be 1 to {} bytes (1 GiB: a piece is at most what Linux moves per transfer); 1048576 is "
        "DeepSpeed's default",
        block_size, kMaxBlockSize);
  if (queue_depth < 1 || queue_depth > kMaxQueueDepth)
    fail(
        "aio.queue_depth is {}: an io_uring ring holds 1 to {} requests (the kernel's IORING_MAX_ENTRIES); "
        "set aio.queue_depth in that range (8 is DeepSpeed's default, 32-128 suit one NVMe drive)",
        queue_depth, kMaxQueueDepth);
  if (intra_op_parallelism < 1 || intra_op_parallelism > kMaxIntraOpParallelism)
    fail(
        "aio.intra_op_parallelism is {}: it is the number of io_uring rings, each with its own thread, and must be "
        "1 to {}; set it to at most the number of NVMe drives times 2-4",
        intra_op_parallelism, kMaxIntraOpParallelism);
  if (max_open_files < 1 || max_registered_buffers < 1) fail("IoOptions: max_open_files and max_registered_buffers must be at least 1");
}

}  // namespace dstrain
