// IoEngine: asynchronous reads and writes of files on NVMe through io_uring (liburing), for the
// NVMe swapper and the fast checkpoint writer. Design and rules: docs/offload.md §1.
//
//   IoEngine io(IoOptions::from_config(ds.aio));
//   IoFile f = io.open("/nvme/swap/rank0/optimizer.swp", IoOpen::create);
//   f.allocate(bytes);                      // reserves the space; a full disk fails here, named
//   IoHandle w = io.write(f, 0, buffer, bytes);
//   ...                                     // compute while the write runs
//   w.wait();                               // throws dstrain::Error on any failure
//
// - Files are opened O_DIRECT (the page cache is bypassed: offloaded state is bigger than RAM's
//   spare room, and copying it through the cache would halve the bandwidth) and registered with
//   every ring (fixed files). Buffers may be registered too (register_buffer: fixed buffers, no
//   page pinning per transfer).
// - Alignment: the buffer address and the file offset must be multiples of the file's alignment()
//   (4096 at least; more when the device says so). The byte count may be anything: the aligned
//   part goes O_DIRECT, a last partial block goes through a buffered descriptor of the same file.
// - A request is cut into pieces of block_size; its pieces are shared among intra_op_parallelism
//   rings, each a thread keeping up to queue_depth pieces in the kernel.
// - Every failure — an errno, a short transfer, a refused open — is a dstrain::Error naming the
//   file, the offset, the byte count and the fix; thrown by the handle's wait() (and wait_all()).
//   The engine stays usable after a failed request.
// - All member functions are thread-safe. A file must not be closed, nor a buffer unregistered or
//   freed, while requests on it are in flight (close and unregister wait for them).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "offload/io_fault_injection.h"
#include "offload/io_options.h"
#include "offload/io_request.h"

namespace dstrain {

enum class IoOpen {
  read,        // O_RDONLY: an existing file
  read_write,  // O_RDWR: an existing file
  create,      // O_RDWR | O_CREAT | O_TRUNC, mode 0600: a new, empty file
  create_new,  // O_RDWR | O_CREAT | O_EXCL, mode 0600: a file that must not exist yet (never someone else's)
};

class IoEngineCore;
struct IoFileState;

// An open file of an IoEngine. Move-only; closes itself (waiting for its requests) when destroyed.
class IoFile {
 public:
  IoFile() = default;
  IoFile(IoFile&&) noexcept = default;
  IoFile& operator=(IoFile&& other) noexcept;
  ~IoFile();

  bool is_open() const { return state_ != nullptr; }
  const std::string& path() const;
  // The O_DIRECT alignment of buffer addresses and offsets for this file, in bytes.
  std::uint64_t alignment() const;
  // The file's size now (fstat).
  std::uint64_t size() const;
  // Reserves the file's first `bytes` bytes on disk (fallocate), after checking that the file
  // system has them: a drive too small fails here, naming bytes needed and available.
  void allocate(std::uint64_t bytes);
  // fdatasync: written bytes are on the drive when it returns.
  void sync();
  // Waits for the file's requests, unregisters it and closes it; throws Error if close(2) fails.
  void close();

 private:
  friend class IoEngine;
  std::shared_ptr<IoEngineCore> core_;
  std::shared_ptr<IoFileState> state_;
};

class IoEngine {
 public:
  // The smallest alignment used, whatever the device says: the page size, which O_DIRECT on every
  // Linux file system accepts and PinnedHostAllocator's blocks have.
  static constexpr std::uint64_t kMinAlignment = 4096;

  // Starts intra_op_parallelism rings and threads. Throws Error on invalid options (naming the
  // aio key) or when the kernel refuses io_uring. DSTRAIN_IO_FAULT arms the test hook.
  explicit IoEngine(const IoOptions& options = {});
  // Waits for every request, then stops the rings. Files still open stay usable for close().
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  IoFile open(const std::string& path, IoOpen mode);

  // Reads `bytes` bytes at `offset` of `file` into `data` / writes them from `data`. Returns at once;
  // the buffer must stay alive and untouched until the handle is waited for. Throws Error at once
  // for a misaligned buffer or offset, a closed file, or a write to a file opened for reading.
  IoHandle read(IoFile& file, std::uint64_t offset, void* data, std::uint64_t bytes);
  IoHandle write(IoFile& file, std::uint64_t offset, const void* data, std::uint64_t bytes);

  // Waits for every request of the engine; throws Error with the first failure since the last call
  // (a failure is thrown by its handle's wait() and once here).
  void wait_all();

  // Registers [data, data + bytes) with every ring, so transfers inside it use fixed buffers. Returns
  // false when the kernel refuses (locked-memory limit, ulimit -l): I/O then works unregistered.
  bool register_buffer(void* data, std::size_t bytes);
  // Waits for the engine's requests, then unregisters the buffer that starts at `data`.
  void unregister_buffer(void* data);

  // The test hook (io_fault_injection.h): arms `fault` (nullopt disarms), counting from now.
  void inject_fault(std::optional<IoFault> fault);

  const IoOptions& options() const;
  // Counted since the engine started, with atomics at submission (bytes, pieces) and in IoHandle::wait
  // (wait_seconds: the time callers were blocked there, summed over the threads that waited; a
  // wait on a finished request adds nothing and reads no clock). The summary's offload figures
  // (docs/offload.md §9) are differences of two Totals.
  struct Totals {
    std::uint64_t bytes_read = 0;
    std::uint64_t bytes_written = 0;
    std::uint64_t pieces = 0;
    double wait_seconds = 0.0;
    Totals operator-(const Totals& o) const {
      return {bytes_read - o.bytes_read, bytes_written - o.bytes_written, pieces - o.pieces, wait_seconds - o.wait_seconds};
    }
    Totals& operator+=(const Totals& o) {
      bytes_read += o.bytes_read;
      bytes_written += o.bytes_written;
      pieces += o.pieces;
      wait_seconds += o.wait_seconds;
      return *this;
    }
  };
  Totals totals() const;

 private:
  IoHandle submit(IoOp op, IoFile& file, std::uint64_t offset, std::byte* data, std::uint64_t bytes);
  std::shared_ptr<IoEngineCore> core_;
};

}  // namespace dstrain
