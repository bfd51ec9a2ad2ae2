// IoFaultInjection: the I/O layer's test hook. It makes the Nth piece the engine submits fail with
// an errno (EIO, ENOSPC, ...) or come back short, so that tests — the engine's, the swapper's, the
// checkpoint writer's, and `dstrain train` through the environment — can check that every failure
// becomes a dstrain::Error naming the file, offset and byte count, and that nothing hangs; or makes
// every piece from the Nth on slow, so that a test can stop a run in the middle of its swap I/O.
// Pieces are counted from 1, per engine, in the order the engine cuts them (docs/offload.md §1.6).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

enum class IoOp { read, write };

const char* io_op_name(IoOp op);

struct IoFault {
  enum class Kind {
    error,           // the piece fails with -errno_value (the kernel is not asked)
    short_transfer,  // the piece is transferred, but reported as half its bytes
    open_refused,    // opening a file with O_DIRECT fails with EINVAL, as on a file system without it
    slow,            // this piece and every later one wait kSlowPieceDelay before going to the kernel
  };
  // A slow drive's piece (a thousand times a real NVMe drive's): long enough that a run's swap I/O
  // outlasts any grace, short enough that what is in flight drains in a few seconds.
  static constexpr int kSlowPieceDelayMs = 200;
  Kind kind = Kind::error;
  int errno_value = 5;  // EIO
  // Only pieces of this operation count (none: reads and writes alike). Ignored for open_refused.
  std::optional<IoOp> op;
  // The piece (or, for open_refused, the open) that fails, counted from 1.
  std::uint64_t nth = 1;

  // The environment variable that arms a fault in every engine the process creates.
  static constexpr const char* kEnvironmentVariable = "DSTRAIN_IO_FAULT";

  // "KIND[:OP]@N", KIND one of eio, enospc, short, odirect (open_refused), slow; OP read or write.
  // Examples: "eio@3", "short:read@1", "enospc:write@10", "odirect@1", "slow@1". Throws Error naming the
  // variable and the accepted forms otherwise.
  static IoFault parse(std::string_view text);
  // The fault DSTRAIN_IO_FAULT asks for, if set.
  static std::optional<IoFault> from_environment();
  std::string describe() const;
};

}  // namespace dstrain
