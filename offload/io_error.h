// The messages of the io_uring engine's failures (docs/offload.md §1.7). Each names the file, the
// byte range and the operation, says what the errno means for a swap or checkpoint file, and gives
// the fix. DeepSpeed's aio layer checks none of this (its per-event result is never examined), so
// a failed or short O_DIRECT transfer there is silent; here it is always a dstrain::Error.
#pragma once

#include <cstdint>
#include <string>

#include "offload/io_fault_injection.h"

namespace dstrain {

// A piece that failed with `error_number` (positive errno).
std::string io_failure_message(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t bytes, int error_number);

// A piece that moved `done` of `bytes` bytes.
std::string io_short_message(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t bytes, std::uint64_t done);

// open(2) with O_DIRECT failed with `error_number`; `writing`: the file was opened for writing.
std::string io_open_message(const std::string& path, bool writing, int error_number);

// The file is on tmpfs or ramfs, which the engine refuses (io_uring_engine.cpp says why).
std::string io_memory_file_system_message(const std::string& path);

// Bytes free to an unprivileged user on the file system holding `path` (statvfs); -1 if unknown.
std::int64_t io_available_bytes(const std::string& path);

}  // namespace dstrain
