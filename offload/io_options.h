// IoOptions: how the io_uring engine (offload/io_uring_engine.h) moves bytes — DeepSpeed's `aio`
// block (config_schema/aio_config.h, docs/offload.md §2), with DeepSpeed's meaning for each key.
#pragma once

#include <cstddef>
#include <cstdint>

#include "config_schema/aio_config.h"

namespace dstrain {

struct IoOptions {
  // Largest transfer the kernel is asked for at once (aio.block_size). A request is cut into pieces
  // of this size; the engine rounds it up to the file's O_DIRECT alignment (effective_block_size).
  std::uint64_t block_size = 1048576;
  // Pieces in flight per ring (aio.queue_depth): the ring's submission-queue size.
  unsigned queue_depth = 8;
  // Rings, each with its own thread (aio.intra_op_parallelism); a request's pieces are shared
  // between them in contiguous runs.
  unsigned intra_op_parallelism = 1;
  // aio.single_submit: one io_uring_submit call per piece instead of one per batch.
  bool single_submit = false;
  // aio.overlap_events: refill the ring as each piece completes (true), or submit a batch of up to
  // queue_depth pieces and wait for all of them before the next batch (false).
  bool overlap_events = true;
  // Files open at once per engine: every ring registers a table of this many (fixed files).
  unsigned max_open_files = 256;
  // Buffers registered at once (fixed buffers).
  unsigned max_registered_buffers = 256;

  // The io_uring limit on a ring's size (the kernel's IORING_MAX_ENTRIES).
  static constexpr unsigned kMaxQueueDepth = static_cast<unsigned>(config::kMaxQueueDepth);
  // Rings (and threads) per engine: more than a few per drive only adds threads.
  static constexpr unsigned kMaxIntraOpParallelism = static_cast<unsigned>(config::kMaxIntraOpParallelism);
  // One transfer never exceeds this: Linux moves at most 0x7ffff000 bytes per read/write.
  static constexpr std::uint64_t kMaxBlockSize = static_cast<std::uint64_t>(config::kMaxBlockSize);

  // From the config's top-level `aio` block (use_gds is reported by the config reader: no cuFile).
  static IoOptions from_config(const config::AioConfig& aio);

  // block_size rounded up to a multiple of `alignment` (O_DIRECT), at least one alignment unit and
  // at most kMaxBlockSize.
  std::uint64_t effective_block_size(std::uint64_t alignment) const;

  // Throws Error naming the aio key and the fix when a value is outside what the engine can do.
  void validate() const;
};

}  // namespace dstrain
