#include "engine/checkpoint_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>

#include "engine/host_prefault.h"
#include "offload/io_uring_engine.h"
#include "ops/atomic_file.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/transformer/safetensors.h"

namespace dstrain {
namespace fs = std::filesystem;
using config::Json;

namespace {

std::string q(const fs::path& p) { return fmt::format("'{}'", p.string()); }

void write_all(int fd, const fs::path& path, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      fail("writing checkpoint file {} failed: {} (the previous checkpoint, if any, is untouched; the run's state is intact)", q(path),
           write_errno_text(w == 0 ? ENOSPC : errno));
    }
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_close(int fd, const fs::path& path) {
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  if (::close(fd) != 0 || !synced) {
    fail("flushing checkpoint file {} to disk failed: {} (the previous checkpoint, if any, is untouched)", q(path),
         write_errno_text(synced ? errno : sync_err));
  }
}

Json read_json_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("checkpoint {} {} is missing or unreadable: {}; the checkpoint is incomplete — load another tag", what, q(path), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return Json::parse(ss.str());
  } catch (const std::exception& e) {
    fail("checkpoint {} {} is not valid JSON ({}); the file is truncated or corrupt — load another tag", what, q(path), e.what());
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string CheckpointPiece::tensor_name() const { return buffer + "/" + param + "/" + std::to_string(offset); }

void check_checkpoint_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.find('/') != std::string::npos || tag.find('\0') != std::string::npos ||
      tag.ends_with(".partial") || tag == kLatestFile) {
    fail("checkpoint tag '{}' cannot name a checkpoint folder: use a non-empty name without '/', not \".\", \"..\", \"latest\" or one "
         "ending in \".partial\" (the default is global_step<N>)",
         tag);
  }
}

fs::path partial_checkpoint_dir(const fs::path& save_dir, const std::string& tag) { return save_dir / (tag + ".partial"); }

std::string rank_file_name(int rank, const char* ext) { return fmt::format("rank_{:05d}{}", rank, ext); }

void checkpoint_test_pause() {
  static const long ms = [] {
    const char* v = std::getenv(kCheckpointPauseEnv);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---- writing ----

namespace {

constexpr std::size_t kBlock = 4096;                // O_DIRECT's unit of offset, size and address
constexpr std::size_t kChecksumChunk = std::size_t{4} << 20;  // staged and checksummed while still in cache

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

CheckpointMemory allocate_checkpoint_memory(std::size_t bytes, HostPages pages) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t rounded = round_up(std::max<std::size_t>(bytes, 1), kHuge);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHuge, rounded));
  if (p == nullptr) fail("cannot allocate {} bytes of host memory for a checkpoint (its staging, snapshot or load copy)", bytes);
#if defined(MADV_HUGEPAGE)
  if (pages == HostPages::huge) (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: THP "never" refuses it
#endif
  return CheckpointMemory(p);
}

void free_in_background(CheckpointMemory memory) {
  if (!memory) return;
  try {
    std::thread([m = std::move(memory)]() mutable { m.reset(); }).detach();
  } catch (const std::system_error&) {  // no thread to be had: the caller frees it (the lambda's copy is gone with it)
  }
}

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
    tensors.push_back({{"buffer", p.buffer}, {"param", p.param}, {"offset", p.offset}, {"numel", p.numel}, {"dtype", std::string(dtype_name(p.dtype))},
                       {"crc32c", crcs_[i]}});
  }
  return Json{{"format", kCheckpointFormat}, {"file", path_.filename().string()}, {"bytes", size_}, {"tensors", std::move(tensors)}};
}

void write_checkpoint_text(const fs::path& path, const std::string& text) {
  checkpoint_test_pause();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create checkpoint file {}: {}; check that the save folder is writable", q(path), write_errno_text(errno));
  try {
    write_all(fd, path, text.data(), text.size());
  } catch (...) {
    ::close(fd);
    throw;
  }
  fsync_close(fd, path);
}

void sync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open folder {} to flush it: {}", q(dir), std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok && err != EINVAL) fail("flushing folder {} to disk failed: {}", q(dir), write_errno_text(err));
}

void commit_checkpoint(const fs::path& save_dir, const std::string& tag) {
  const fs::path partial = partial_checkpoint_dir(save_dir, tag);
  const fs::path final_dir = save_dir / tag;
  sync_dir(partial);
  checkpoint_test_pause();
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    // Saving a tag again: the old folder moves aside first (a crash here leaves `latest` naming a
    // missing folder only if it named this very tag; the load then says so and names the others).
    const fs::path old = save_dir / (tag + ".old.partial");
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) fail("cannot replace the existing checkpoint {}: {}", q(final_dir), ec.message());
    fs::rename(partial, final_dir, ec);
    if (ec) fail("cannot rename {} to {}: {}", q(partial), q(final_dir), ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(partial, final_dir, ec);
    if (ec) fail("cannot rename {} to {}: {}", q(partial), q(final_dir), ec.message());
  }
  sync_dir(save_dir);
  checkpoint_test_pause();
  write_file_atomically(save_dir / kLatestFile, tag);
}

std::optional<std::string> read_latest_tag(const fs::path& save_dir) {
  const fs::path latest = save_dir / kLatestFile;
  std::error_code ec;
  if (!fs::exists(latest, ec)) return std::nullopt;
  std::string tag = read_text(latest);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) tag.pop_back();
  if (tag.empty()) fail("{} is empty; it should name the newest checkpoint's tag — pass the tag explicitly (--load-tag)", q(latest));
  return tag;
}

std::vector<std::string> list_checkpoint_tags(const fs::path& save_dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.ends_with(".partial") || !fs::exists(e.path() / kCheckpointManifest)) continue;
    std::int64_t steps = -1;
    try {
      steps = read_json_file(e.path() / kCheckpointManifest, "manifest").at("engine").at("global_steps").get<std::int64_t>();
    } catch (const std::exception&) {
    }
    found.emplace_back(steps, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [s, n] : found) tags.push_back(std::move(n));
  return tags;
}

// ---- reading ----

namespace {

// Reads a file through two aligned windows of kReadWindow bytes with O_DIRECT (buffered where the
// file system refuses it): a request is copied out of the current window, and the next window is
// read by a second thread meanwhile, so a front-to-back load keeps one large request at the disk
// at all times and never waits on the kernel's readahead (this disk serves 32 MiB requests several
// times faster than 1 MiB ones; docs/checkpoints.md "Measured").
// A load's unit of reading: one window of WindowedFileReader, one request of read_all (this disk
// serves 32 MiB requests several times faster than 1 MiB ones; docs/checkpoints.md "Measured").
constexpr std::size_t kReadWindow = std::size_t{32} << 20;

// Reads up to n bytes at `from` (n, from and dst whole blocks, as O_DIRECT wants them) into dst;
// returns how many there were (fewer only at the end of the file).
std::size_t read_blocks(int fd, const fs::path& path, std::byte* dst, std::size_t n, std::uint64_t from) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(from + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("reading checkpoint file {} failed at byte {}: {}; load another tag", q(path), from + got, std::strerror(errno));
    if (r == 0) break;  // end of file
    got += static_cast<std::size_t>(r);
    if (got % kBlock != 0) break;  // a short read ends at the end of the file
  }
  return got;
}

class WindowedFileReader {
 public:
  WindowedFileReader(fs::path path, std::uint64_t size) : path_(std::move(path)), size_(size) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd_ < 0 && errno == EINVAL) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open checkpoint file {}: {}", q(path_), std::strerror(errno));
    const std::size_t window = std::min<std::size_t>(kReadWindow, round_up(static_cast<std::size_t>(size_), kBlock));
    window_ = std::max(window, kBlock);
  }
  ~WindowedFileReader() {
    if (pending_.valid()) pending_.wait();
    if (fd_ >= 0) ::close(fd_);
  }
  WindowedFileReader(const WindowedFileReader&) = delete;
  WindowedFileReader& operator=(const WindowedFileReader&) = delete;
  // The file, opened with O_DIRECT where the file system takes it (CheckpointReader::read_all
  // reads spans of it straight into the caller's memory).
  int fd() const { return fd_; }

  // Copies bytes [at, at + n) of the file into out; Error naming the file when it ends early.
  void read(void* out, std::size_t n, std::uint64_t at) {
    auto* c = static_cast<std::byte*>(out);
    while (n > 0) {
      const Window& w = window_at(at);
      const std::size_t k = std::min<std::uint64_t>(n, w.end - at);
      std::memcpy(c, w.buf.get() + (at - w.begin), k);
      c += k;
      at += k;
      n -= k;
    }
  }

 private:
  struct Window {
    CheckpointMemory buf;
    std::uint64_t begin = 0, end = 0;  // the file bytes it holds
  };

  const Window& window_at(std::uint64_t at) {
    if (!windows_[0].buf) {  // allocated on first use: a load that reads spans straight (read_all) needs none
      for (Window& w : windows_) w.buf = allocate_checkpoint_memory(window_);
    }
    Window& cur = windows_[0];
    if (at >= cur.begin && at < cur.end) return cur;
    if (pending_.valid()) pending_.get();  // rethrows a failed read
    Window& next = windows_[1];
    if (at >= next.begin && at < next.end) {
      std::swap(cur, next);
    } else {
      fill(cur, at / kBlock * kBlock);
      if (at >= cur.end) {
        fail("reading checkpoint file {} failed at byte {}: the file ends at {} — it is truncated; load another tag", q(path_), at, cur.end);
      }
    }
    if (cur.end < size_) {
      Window* w = &windows_[1];
      const std::uint64_t from = cur.end;
      pending_ = std::async(std::launch::async, [this, w, from] { fill(*w, from); });
    }
    return cur;
  }

  // Reads one window at `from` (a multiple of kBlock).
  void fill(Window& w, std::uint64_t from) {
    w.begin = w.end = from;
    w.end = from + read_blocks(fd_, path_, w.buf.get(), window_, from);
  }

  fs::path path_;
  std::uint64_t size_ = 0;
  int fd_ = -1;
  std::size_t window_ = 0;
  Window windows_[2];
  std::future<void> pending_;
};

}  // namespace

struct CheckpointReader::Impl {
  struct Saved {
    std::size_t file = 0;  // index into files
    std::string name;      // tensor name in the data file
    std::int64_t offset = 0, numel = 0;
    DType dtype = DType::fp32;
    std::uint32_t crc = 0;
    bool verified = false;
  };
  struct File {
    fs::path path;
    std::uint64_t bytes = 0;
    std::unique_ptr<SafetensorsFile> st;  // opened on first read: the header checked against the index
    std::unique_ptr<WindowedFileReader> data;
    std::uint64_t data_start = 0;  // file offset of the data section
  };
  // Opens f's data file on first use: its size against the index, its safetensors header, the reader.
  void open(File& f);
  // The saved piece that is exactly w (same offset and numel) and its entry in its file; nullptr
  // when there is none (w is then read through read(), which names what is wrong).
  std::pair<Saved*, const SafetensorsEntry*> exact(const Want& w);
  // The saved pieces that are, in the order wanted, exactly the wanted ones, lying back to back in
  // one file (a load at the saving layout); empty when they are not.
  using Run = std::vector<std::pair<Saved*, const SafetensorsEntry*>>;
  Run run_of(const std::vector<Want>& want);
  // The whole blocks [first, first + bytes) of its file that hold a run (as O_DIRECT reads them).
  struct Span {
    std::uint64_t first = 0;
    std::size_t bytes = 0;
  };
  Span span_of(const Run& run) const;
  // Reads a run's span of its file (see the body) into slot(k) for request k, checks each piece's
  // CRC-32C as it lands and, given `landed`, hands on bytes [from, to) of piece i (offsets within
  // the piece) at `data` once they are in. A failed checksum or short read is an Error after the
  // ranges before it were handed on.
  void read_run(const Run& run, const std::function<std::byte*(std::size_t)>& slot, std::size_t slots,
                const std::function<void(std::size_t, std::uint64_t, std::uint64_t, const std::byte*)>& landed);
  std::vector<std::byte> scratch;  // a saved piece only partly wanted (a reshard), read whole to check it
  std::vector<File> files;
  std::map<std::pair<std::string, std::string>, std::vector<Saved>> pieces;  // (buffer, param) -> sorted by offset
  std::map<std::string, DType> buffers;
};

CheckpointReader::CheckpointReader(const fs::path& save_dir, const std::string& tag) : dir_(save_dir / tag), tag_(tag), impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) {
    std::string have;
    for (const std::string& t : list_checkpoint_tags(save_dir)) have += (have.empty() ? "" : ", ") + t;
    fail("checkpoint tag '{}' not found: {} is not a folder; the checkpoints under {} are: {}", tag, q(dir_), q(save_dir),
         have.empty() ? "none" : have);
  }
  const fs::path mpath = dir_ / kCheckpointManifest;
  if (!fs::exists(mpath, ec)) {
    fail("{} holds no {}: it is not a complete dstrain checkpoint (a save that did not finish never carries a tag's name); load another tag",
         q(dir_), kCheckpointManifest);
  }
  manifest_ = read_json_file(mpath, "manifest");
  // Every typed read below is inside the try: json's value()/get() throw its own type_error on a
  // field of the wrong type ("format": {}), which must become the malformed-manifest Error.
  try {
    if (!manifest_.is_object() || manifest_.value("format", std::string()) != kCheckpointFormat) {
      fail("{} is not a dstrain checkpoint manifest (no \"format\": \"{}\"); a DeepSpeed torch checkpoint is converted with "
           "`dstrain train --init-from` of its weights instead",
           q(mpath), kCheckpointFormat);
    }
    if (manifest_.value("version", 0) != kCheckpointVersion) {
      fail("{}: checkpoint format version {} — this dstrain reads version {}", q(mpath), manifest_.value("version", 0), kCheckpointVersion);
    }
    for (const Json& r : manifest_.at("ranks")) {
      const fs::path ipath = dir_ / r.at("index").get<std::string>();
      if (!fs::exists(ipath, ec)) fail("checkpoint index {} is missing; the checkpoint is incomplete — load another tag", q(ipath));
      const std::string text = read_text(ipath);
      if (text.size() != r.at("bytes").get<std::uint64_t>() || crc32c(text.data(), text.size()) != r.at("crc32c").get<std::uint32_t>()) {
        fail("checkpoint index {} does not match its checksum in {} ({} bytes, expected {}): the file is truncated or corrupt — load another tag",
             q(ipath), kCheckpointManifest, text.size(), r.at("bytes").get<std::uint64_t>());
      }
      const Json idx = Json::parse(text);
      Impl::File f;
      f.path = dir_ / idx.at("file").get<std::string>();
      f.bytes = idx.at("bytes").get<std::uint64_t>();
      const std::size_t fi = impl_->files.size();
      impl_->files.push_back(std::move(f));
      for (const Json& t : idx.at("tensors")) {
        Impl::Saved s;
        s.file = fi;
        const std::string buffer = t.at("buffer").get<std::string>();
        const std::string param = t.at("param").get<std::string>();
        s.offset = t.at("offset").get<std::int64_t>();
        s.numel = t.at("numel").get<std::int64_t>();
        // An element range a model could have: what read() adds and multiplies stays far from overflow.
        constexpr std::int64_t kMaxElements = std::int64_t{1} << 48;
        if (s.offset < 0 || s.numel < 0 || s.offset > kMaxElements || s.numel > kMaxElements) {
          fail("checkpoint index {} lists tensor '{}' of parameter '{}' at elements [{}, +{}), which no model has: the index is "
               "corrupt — load another tag",
               q(ipath), buffer, param, s.offset, s.numel);
        }
        s.dtype = parse_dtype(t.at("dtype").get<std::string>());
        s.crc = t.at("crc32c").get<std::uint32_t>();
        s.name = CheckpointPiece{buffer, param, s.offset, s.numel, s.dtype}.tensor_name();
        impl_->buffers.emplace(buffer, s.dtype);
        impl_->pieces[{buffer, param}].push_back(std::move(s));
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("checkpoint {} has a malformed manifest or rank index ({}); load another tag", q(dir_), e.what());
  }
  for (auto& [key, v] : impl_->pieces) std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
}

void CheckpointReader::Impl::open(File& f) {
  if (f.st) return;
  std::error_code ec;
  const auto size = fs::file_size(f.path, ec);
  if (ec) fail("checkpoint file {} is missing or unreadable ({}); the checkpoint is incomplete — load another tag", q(f.path), ec.message());
  if (size != f.bytes) {
    fail("checkpoint file {} has {} bytes but its index says {}: the file is truncated or was replaced — load another tag", q(f.path), size, f.bytes);
  }
  auto st = std::make_unique<SafetensorsFile>(f.path);
  // The data section starts after the 8-byte header length and the header (SafetensorsFile
  // checked that the header fits in the file).
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  std::uint8_t len[8];
  const bool got = fd >= 0 && ::pread(fd, len, 8, 0) == 8;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!got) fail("cannot read checkpoint file {}: {}; load another tag", q(f.path), std::strerror(err));
  std::uint64_t hn = 0;
  for (int i = 7; i >= 0; --i) hn = (hn << 8) | len[i];
  f.data = std::make_unique<WindowedFileReader>(f.path, f.bytes);
  f.data_start = 8 + hn;
  f.st = std::move(st);
}

std::pair<CheckpointReader::Impl::Saved*, const SafetensorsEntry*> CheckpointReader::Impl::exact(const Want& w) {
  const auto it = pieces.find({w.buffer, w.param});
  if (it == pieces.end()) return {nullptr, nullptr};
  std::vector<Saved>& v = it->second;
  const auto s = std::lower_bound(v.begin(), v.end(), w.offset, [](const Saved& a, std::int64_t o) { return a.offset < o; });
  if (s == v.end() || s->offset != w.offset || s->numel != w.numel) return {nullptr, nullptr};
  File& f = files[s->file];
  open(f);
  const SafetensorsEntry* e = f.st->find(s->name);
  if (e == nullptr || e->numel() != s->numel || e->end - e->begin != static_cast<std::uint64_t>(s->numel) * dtype_size(s->dtype) ||
      f.data_start + e->end > f.bytes || (f.data_start + e->begin) % dtype_size(s->dtype) != 0) {  // read in place: aligned for its dtype
    return {nullptr, nullptr};
  }
  return {&*s, e};
}

CheckpointReader::Impl::Run CheckpointReader::Impl::run_of(const std::vector<Want>& want) {
  Run run;
  for (const Want& w : want) {
    const auto [s, e] = exact(w);
    if (s == nullptr || (!run.empty() && (s->file != run.front().first->file || e->begin != run.back().second->end))) return {};
    run.emplace_back(s, e);
  }
  return run;
}

CheckpointReader::Impl::Span CheckpointReader::Impl::span_of(const Run& run) const {
  const File& f = files[run.front().first->file];
  const std::uint64_t first = (f.data_start + run.front().second->begin) / kBlock * kBlock;
  return {first, round_up(static_cast<std::size_t>(f.data_start + run.back().second->end - first), kBlock)};
}

void CheckpointReader::Impl::read_run(const Run& run, const std::function<std::byte*(std::size_t)>& slot, std::size_t slots,
                                      const std::function<void(std::size_t, std::uint64_t, std::uint64_t, const std::byte*)>& landed) {
  File& f = files[run.front().first->file];
  const std::uint64_t begin = f.data_start + run.front().second->begin, end = f.data_start + run.back().second->end;
  const Span sp = span_of(run);  // named, not bound: clang 14 cannot capture a structured binding
  const std::uint64_t first = sp.first;
  const std::size_t span = sp.bytes;
  // Request k reads blocks [first + k * kReadWindow, ...) into slot(k), on its own thread; kInFlight
  // of them at a time, the oldest checked (and handed on) while the others are read. With `slots`
  // reused slots, request k + kInFlight is issued once request k has landed, into a slot that is
  // neither k's (being handed on) nor one still being read.
  constexpr std::size_t kInFlight = 2;
  DSTRAIN_CHECK(slots == 0 || slots > kInFlight, "CheckpointReader: {} reused slots for {} requests in flight", slots, kInFlight);
  const std::size_t requests = (span + kReadWindow - 1) / kReadWindow;
  const int fd = f.data->fd();
  const auto issue = [&](std::size_t k) {
    const std::size_t off = k * kReadWindow, n = std::min(kReadWindow, span - off);
    return std::async(std::launch::async, [fd, &f, p = slot(k), n, at = first + off] { return read_blocks(fd, f.path, p, n, at); });
  };
  std::vector<std::future<std::size_t>> flight;
  const auto drain = [&flight] {
    for (auto& r : flight)
      if (r.valid()) r.wait();
  };
  try {
    for (std::size_t k = 0; k < std::min(kInFlight, requests); ++k) flight.push_back(issue(k));
    std::size_t piece = 0;          // the piece being checked
    std::uint64_t checked = begin;  // file offset checked up to
    std::uint32_t crc = 0;
    for (std::size_t k = 0; k < requests; ++k) {
      const std::size_t got = flight[k].get();
      if (k + kInFlight < requests) flight.push_back(issue(k + kInFlight));
      const std::uint64_t lo = first + k * kReadWindow;
      const std::uint64_t landed_to = std::min<std::uint64_t>(end, lo + got);
      if (landed_to < std::min<std::uint64_t>(end, lo + kReadWindow)) {
        fail("reading checkpoint file {} failed at byte {}: the file ends there — it is truncated; load another tag", q(f.path), landed_to);
      }
      const std::byte* const data = slot(k);
      for (; piece < run.size(); ++piece) {
        const auto& [s, e] = run[piece];
        const std::uint64_t piece_end = f.data_start + e->end;
        const std::uint64_t upto = std::min(piece_end, landed_to);
        if (upto > checked) {
          crc = crc32c(data + (checked - lo), static_cast<std::size_t>(upto - checked), crc);
          if (landed) landed(piece, checked - (f.data_start + e->begin), upto - (f.data_start + e->begin), data + (checked - lo));
        }
        checked = upto;
        if (upto < piece_end) break;  // the rest of this piece is in the next request
        if (crc != s->crc) {
          fail("checkpoint file {}: tensor '{}' fails its checksum (crc32c): the file is corrupt — load another tag", q(f.path), s->name);
        }
        s->verified = true;
        crc = 0;
      }
    }
  } catch (...) {
    drain();  // no request may outlive the memory it reads into
    throw;
  }
}

CheckpointReader::Loaded CheckpointReader::read_all(const std::vector<Want>& want) {
  Loaded out;
  const Impl::Run run = impl_->run_of(want);  // one file's pieces, back to back in it, in the order wanted?
  if (run.empty()) {
    std::size_t total = 0;
    std::vector<std::size_t> bytes;
    for (const Want& w : want) {
      const std::optional<DType> dt = buffer_dtype(w.buffer);
      bytes.push_back(static_cast<std::size_t>(w.numel) * (dt ? dtype_size(*dt) : 0));  // absent: read() says so
      total += bytes.back();
    }
    out.memory = allocate_checkpoint_memory(total);
    BackgroundPrefault prefault(out.memory.get(), total);
    std::byte* at = out.memory.get();
    for (std::size_t i = 0; i < want.size(); ++i) {
      out.at.push_back(at);
      read(want[i].buffer, want[i].param, want[i].offset, want[i].numel, at);
      at += bytes[i];
    }
    return out;
  }
  // Straight from the file into one block of memory, each piece at its file offset's place within
  // a block (as O_DIRECT requires); the checksums hide behind the reads.
  const Impl::File& f = impl_->files[run.front().first->file];
  const auto [first, span] = impl_->span_of(run);
  out.memory = allocate_checkpoint_memory(span);
  std::byte* const base = out.memory.get();
  for (const auto& [s, e] : run) out.at.push_back(base + (f.data_start + e->begin - first));
  BackgroundPrefault prefault(base, span);
  impl_->read_run(run, [base](std::size_t k) { return base + k * kReadWindow; }, 0, nullptr);
  return out;
}

bool CheckpointReader::stream(const std::vector<Want>& want, const Sink& sink) {
  const Impl::Run run = impl_->run_of(want);
  if (run.empty()) return false;
  // Three request-sized slots, reused: two being read while the third is checked and handed on.
  constexpr std::size_t kSlots = 3;
  const std::size_t span = impl_->span_of(run).bytes;
  const std::size_t slot_bytes = std::min(kReadWindow, span);
  const std::size_t slots = std::min(kSlots, (span + kReadWindow - 1) / kReadWindow);
  CheckpointMemory ring = allocate_checkpoint_memory(slot_bytes * slots);
  BackgroundPrefault prefault(ring.get(), slot_bytes * slots);
  std::byte* const base = ring.get();
  impl_->read_run(
      run, [base, slot_bytes](std::size_t k) { return base + (k % kSlots) * slot_bytes; }, kSlots,
      [&](std::size_t i, std::uint64_t from, std::uint64_t to, const std::byte* data) {
        const std::size_t es = dtype_size(run[i].first->dtype);
        sink(i, static_cast<std::int64_t>(from / es), static_cast<std::int64_t>((to - from) / es), data);
      });
  return true;
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;

std::optional<DType> CheckpointReader::buffer_dtype(const std::string& buffer) const {
  const auto it = impl_->buffers.find(buffer);
  if (it == impl_->buffers.end()) return std::nullopt;
  return it->second;
}

void CheckpointReader::read(const std::string& buffer, const std::string& param, std::int64_t offset, std::int64_t numel, void* out) {
  const auto it = impl_->pieces.find({buffer, param});
  if (it == impl_->pieces.end()) {
    fail("checkpoint {} holds no '{}' of parameter '{}': it was saved from another model (or without that state); check the model, or "
         "load without that state",
         q(dir_), buffer, param);
  }
  std::int64_t at = offset;  // the next element to fill
  const std::int64_t end = offset + numel;
  for (Impl::Saved& s : it->second) {
    if (s.offset + s.numel <= at || s.offset >= end) continue;
    if (s.offset > at) break;  // a gap
    Impl::File& f = impl_->files[s.file];
    impl_->open(f);
    const SafetensorsEntry* e = f.st->find(s.name);
    const std::size_t esize = dtype_size(s.dtype);
    if (e == nullptr || e->numel() != s.numel || e->end - e->begin != static_cast<std::uint64_t>(s.numel) * esize) {
      fail("checkpoint file {} has no tensor '{}' of {} elements as its index says; the file is corrupt — load another tag", q(f.path), s.name, s.numel);
    }
    const std::int64_t from = std::max(at, s.offset), to = std::min(end, s.offset + s.numel);
    std::byte* dst = static_cast<std::byte*>(out) + static_cast<std::size_t>(from - offset) * esize;
    const std::size_t want = static_cast<std::size_t>(to - from) * esize;
    const std::uint64_t piece_at = f.data_start + e->begin;
    if (s.verified) {
      f.data->read(dst, want, piece_at + static_cast<std::uint64_t>(from - s.offset) * esize);
    } else {
      // The checksum covers the whole saved piece: read it whole, into the caller's memory when
      // that is exactly what is wanted (a load at the saving layout), else through the scratch.
      const std::size_t whole = static_cast<std::size_t>(s.numel) * esize;
      std::byte* into = dst;
      if (want != whole) {
        impl_->scratch.resize(whole);
        into = impl_->scratch.data();
      }
      f.data->read(into, whole, piece_at);
      if (crc32c(into, whole) != s.crc) {
        fail("checkpoint file {}: tensor '{}' fails its checksum (crc32c): the file is corrupt — load another tag", q(f.path), s.name);
      }
      s.verified = true;
      if (into != dst) std::memcpy(dst, into + static_cast<std::size_t>(from - s.offset) * esize, want);
    }
    at = to;
    if (at >= end) break;
  }
  if (at < end) {
    fail("checkpoint {} does not hold elements [{}, {}) of '{}' of parameter '{}': a rank's file or index is missing pieces — the "
         "checkpoint is incomplete or from another model",
         q(dir_), at, end, buffer, param);
  }
}

}  // namespace dstrain
