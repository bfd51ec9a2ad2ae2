// RankFileWriter (engine/checkpoint/checkpoint_files.h): a rank's pieces staged, checksummed and written to
// its safetensors file by the configured writer (docs/checkpoints.md "Writers").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "engine/checkpoint/checkpoint_file_io.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "offload/io_uring_engine.h"
#include "ops/atomic_file.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/log.h"
#include "formats/safetensors.h"

namespace dstrain {
namespace fs = std::filesystem;
using config::Json;
using namespace checkpoint_io;

namespace {

constexpr std::size_t kChecksumChunk = std::size_t{4} << 20;  // staged and checksummed while still in cache

}  // namespace

// The staging buffers and, when double-buffered, the thread that writes one while the caller
// fills the other (DeepSpeed's Double_IO_Buffer: fill, then drain asynchronously).
struct RankFileWriter::Staging {
  std::size_t buffer_size = 0;  // bytes per buffer, whole blocks
  std::vector<CheckpointMemory> buffers;
  std::size_t fill = 0;      // the buffer being filled
  std::size_t fill_pos = 0;  // bytes in it
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool has_job = false, stop = false;
  const std::byte* job = nullptr;
  std::size_t job_bytes = 0;
  std::uint64_t job_at = 0;
  std::exception_ptr error;
  // The io_uring path (RankFileWriterOptions::aio); destroyed before the buffers, waiting for its requests.
  std::unique_ptr<IoEngine> io;
  IoFile file;
  IoHandle in_flight;
  bool has_in_flight = false;

  ~Staging() {
    if (io) {
      try {
        io->wait_all();
      } catch (...) {  // a save already failing: its first error is the one reported
      }
    }
    if (thread.joinable()) {
      {
        const std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      thread.join();  // an in-flight write finishes before its buffer is freed
    }
  }
};

RankFileWriter::RankFileWriter(fs::path path, std::vector<CheckpointPiece> pieces, RankFileWriterOptions options)
    : path_(std::move(path)), pieces_(std::move(pieces)) {
  Json h = Json::object();
  h["__metadata__"] = {{"format", kCheckpointFormat}};
  std::uint64_t off = 0;
  for (const CheckpointPiece& p : pieces_) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(p.numel) * dtype_size(p.dtype);
    h[p.tensor_name()] = {{"dtype", std::string(safetensors_dtype_name(p.dtype))}, {"shape", {p.numel}}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  size_ = 8 + header.size() + off;
  crcs_.reserve(pieces_.size());
  checkpoint_test_pause();
  staging_ = std::make_unique<Staging>();
  // Created and reserved through a plain descriptor whatever writes it: the whole size is known,
  // so a full disk (or a file size limit) fails here, before any time is spent writing, with the
  // same message for every writer; and the file system lays the file out in large extents.
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create checkpoint file {}: {}; check that the save folder is writable", q(path_), write_errno_text(errno));
  if (const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_)); rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
    ::close(std::exchange(fd_, -1));
    fail("cannot reserve {} bytes for checkpoint file {}: {} (the previous checkpoint, if any, is untouched; the run's state is intact)", size_,
         q(path_), write_errno_text(rc));
  }
  try {
    // The test hook stands in for a file system that refuses O_DIRECT.
    const bool refused = std::getenv(kCheckpointNoDirectEnv) != nullptr;
    if (options.direct && options.aio && !refused) {
      try {
        staging_->io = std::make_unique<IoEngine>(*options.aio);
        staging_->file = staging_->io->open(path_.string(), IoOpen::read_write);
        uring_ = direct_ = true;
        ::close(std::exchange(fd_, -1));
      } catch (const Error& e) {
        // io_uring refused (an old kernel, a seccomp filter) or O_DIRECT refused: pwrite below.
        static std::atomic<bool> warned{false};
        if (!options.direct_key.empty() && !warned.exchange(true)) {
          log_warning("{} \"fast\": the io_uring engine cannot write {} ({}); writing with pwrite instead", options.direct_key, q(path_), e.what());
        }
        staging_->file = IoFile();
        staging_->io.reset();
      }
    }
    if (options.direct && !uring_) {
      const int direct_fd = refused ? -1 : ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
      if (refused) errno = EINVAL;
      if (direct_fd >= 0) {
        ::close(std::exchange(fd_, direct_fd));
        direct_ = true;
      } else if (errno == EINVAL) {
        // tmpfs and some network file systems refuse O_DIRECT: buffered writes are as safe (fsync).
        static std::atomic<bool> warned{false};
        if (!options.direct_key.empty() && !warned.exchange(true)) {
          log_warning("{} \"fast\": the file system of {} refuses O_DIRECT; checkpoints there are written through the page cache instead",
                      options.direct_key, q(path_.parent_path()));
        }
      } else {
        const int err = errno;
        ::close(std::exchange(fd_, -1));
        fail("cannot open checkpoint file {} for O_DIRECT writes: {}", q(path_), write_errno_text(err));
      }
    }
    Staging& S = *staging_;
    const std::size_t count = options.double_buffer ? 2 : 1;
    DSTRAIN_CHECK(options.io_buffer_size >= count * kBlock && options.io_buffer_size % (count * kBlock) == 0,
                  "RankFileWriter: io_buffer_size {} is not {} buffer(s) of whole {}-byte blocks", options.io_buffer_size, count, kBlock);
    // No more memory than the file needs (a small model's checkpoint).
    S.buffer_size = std::min(options.io_buffer_size / count, round_up(static_cast<std::size_t>(size_), kBlock));
    for (std::size_t b = 0; b < count; ++b) S.buffers.push_back(allocate_checkpoint_memory(S.buffer_size));
    if (count == 2 && !S.io) {
      S.thread = std::thread([this, &S] {
        std::unique_lock<std::mutex> lock(S.mu);
        for (;;) {
          S.cv.wait(lock, [&S] { return S.has_job || S.stop; });
          if (!S.has_job) return;
          lock.unlock();
          try {
            write_at(S.job, S.job_bytes, S.job_at);
          } catch (...) {
            const std::lock_guard<std::mutex> g(S.mu);
            if (!S.error) S.error = std::current_exception();
          }
          lock.lock();
          S.has_job = false;
          S.cv.notify_all();
        }
      });
    }
    std::uint8_t len[8];
    const std::uint64_t hn = header.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(hn >> (8 * i));
    stage(len, 8);
    stage(header.data(), header.size());
  } catch (...) {  // a constructor that throws runs no destructor: the descriptor is closed here
    staging_.reset();
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    throw;
  }
}

RankFileWriter::~RankFileWriter() {
  staging_.reset();
  if (fd_ >= 0) ::close(fd_);
}

void RankFileWriter::write_at(const std::byte* p, std::size_t n, std::uint64_t at) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fail("writing checkpoint file {} failed: {} (the previous checkpoint, if any, is untouched; the run's state is intact)", q(path_),
           write_errno_text(w == 0 ? ENOSPC : errno));
    }
    p += w;
    at += static_cast<std::uint64_t>(w);
    n -= static_cast<std::size_t>(w);
  }
}

void RankFileWriter::wait_in_flight() {
  Staging& S = *staging_;
  if (S.io) {
    if (S.has_in_flight) {
      S.has_in_flight = false;
      S.in_flight.wait();
    }
    return;
  }
  if (!S.thread.joinable()) return;
  std::unique_lock<std::mutex> lock(S.mu);
  S.cv.wait(lock, [&S] { return !S.has_job; });
  if (S.error) std::rethrow_exception(S.error);
}

void RankFileWriter::flush_fill_buffer(bool last) {
  Staging& S = *staging_;
  std::size_t n = S.fill_pos;
  if (n == 0) return;
  std::byte* buf = S.buffers[S.fill].get();
  if (S.io) {
    // The engine writes a last partial block itself (through a buffered descriptor): no padding.
    wait_in_flight();
    S.in_flight = S.io->write(S.file, flushed_, buf, n);
    S.has_in_flight = true;
    if (S.buffers.size() == 1) wait_in_flight();
    S.fill = (S.fill + 1) % S.buffers.size();
    flushed_ += S.fill_pos;
    S.fill_pos = 0;
    return;
  }
  if (last && direct_) {
    // O_DIRECT writes whole blocks: the tail is padded with zeros and cut off by ftruncate.
    const std::size_t padded = round_up(n, kBlock);
    std::memset(buf + n, 0, padded - n);
    n = padded;
  }
  if (S.thread.joinable()) {
    wait_in_flight();
    {
      const std::lock_guard<std::mutex> lock(S.mu);
      S.job = buf;
      S.job_bytes = n;
      S.job_at = flushed_;
      S.has_job = true;
    }
    S.cv.notify_all();
    S.fill = (S.fill + 1) % S.buffers.size();
  } else {
    write_at(buf, n, flushed_);
  }
  flushed_ += S.fill_pos;
  S.fill_pos = 0;
}

void RankFileWriter::stage(const void* bytes, std::size_t n) {
  Staging& S = *staging_;
  const auto* c = static_cast<const std::byte*>(bytes);
  while (n > 0) {
    const std::size_t k = std::min(n, S.buffer_size - S.fill_pos);
    std::memcpy(S.buffers[S.fill].get() + S.fill_pos, c, k);
    S.fill_pos += k;
    written_ += k;
    c += k;
    n -= k;
    if (S.fill_pos == S.buffer_size) flush_fill_buffer(false);
  }
}

void RankFileWriter::write(std::size_t i, const PieceSource& source) {
  DSTRAIN_CHECK(i == next_ && i < pieces_.size(), "RankFileWriter: piece {} written out of order (expected {})", i, next_);
  Staging& S = *staging_;
  const std::size_t esize = dtype_size(pieces_[i].dtype);
  const std::int64_t numel = pieces_[i].numel;
  std::uint32_t crc = 0;
  for (std::int64_t e = 0; e < numel;) {
    const auto fit = static_cast<std::int64_t>(std::min(S.buffer_size - S.fill_pos, kChecksumChunk) / esize);
    if (fit == 0) {
      // One element straddles two buffers: through a bounce.
      std::byte one[16];
      source(e, 1, one);
      crc = crc32c(one, esize, crc);
      stage(one, esize);
      ++e;
      continue;
    }
    const std::int64_t count = std::min(fit, numel - e);
    const std::size_t bytes = static_cast<std::size_t>(count) * esize;
    std::byte* dst = S.buffers[S.fill].get() + S.fill_pos;
    source(e, count, dst);
    crc = crc32c(dst, bytes, crc);  // still in cache
    S.fill_pos += bytes;
    written_ += bytes;
    e += count;
    if (S.fill_pos == S.buffer_size) flush_fill_buffer(false);
  }
  crcs_.push_back(crc);
  ++next_;
}

void RankFileWriter::write(std::size_t i, const void* bytes) {
  DSTRAIN_CHECK(i < pieces_.size(), "RankFileWriter: piece {} of {}", i, pieces_.size());
  const std::size_t esize = dtype_size(pieces_[i].dtype);
  const auto* base = static_cast<const std::byte*>(bytes);
  write(i, [base, esize](std::int64_t first, std::int64_t count, void* dst) {
    std::memcpy(dst, base + static_cast<std::size_t>(first) * esize, static_cast<std::size_t>(count) * esize);
  });
}

Json RankFileWriter::finish() {
  DSTRAIN_CHECK(next_ == pieces_.size(), "RankFileWriter: {} of {} pieces written", next_, pieces_.size());
  DSTRAIN_CHECK(written_ == size_, "RankFileWriter: {} bytes staged, the file is {}", written_, size_);
  flush_fill_buffer(true);
  wait_in_flight();
  if (staging_->io) {
    staging_->file.sync();
    staging_->file.close();
    staging_.reset();
    return index_json();
  }
  if (direct_ && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    fail("cutting checkpoint file {} to its {} bytes failed: {} (the previous checkpoint, if any, is untouched)", q(path_), size_,
         write_errno_text(errno));
  }
  staging_.reset();
  const int fd = fd_;
  fd_ = -1;
  fsync_close(fd, path_);
  return index_json();
}

Json RankFileWriter::index_json() const {
  Json tensors = Json::array();
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const CheckpointPiece& p = pieces_[i];
    tensors.push_back({{"buffer", p.buffer},
                       {"param", p.param},
                       {"offset", p.offset},
                       {"numel", p.numel},
                       {"dtype", std::string(dtype_name(p.dtype))},
                       {"crc32c", crcs_[i]}});
  }
  return Json{{"format", kCheckpointFormat}, {"file", path_.filename().string()}, {"bytes", size_}, {"tensors", std::move(tensors)}};
}

}  // namespace dstrain
