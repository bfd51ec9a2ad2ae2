#include "engine/data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>
#include <string>
#include <vector>

#include "ops/atomic_file.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

// The format is little-endian and the reader hands out the file's bytes as uint16 directly.
static_assert(std::endian::native == std::endian::little, "token files are little-endian; add byte swapping");

namespace {

std::string errno_text(int error) {
  if (error == ENOSPC) return "no space left on the device; free some space or write to another folder";
  if (error == EDQUOT) return "disk quota exceeded; free some space or write to another folder";
  if (error == EFBIG) return "file too large for this file system or the process's file size limit (ulimit -f)";
  if (error == EACCES || error == EPERM) return std::string(std::strerror(error)) + "; choose a folder you may write";
  if (error == ENOENT) return "no such folder; create the folder first";
  return std::strerror(error);
}

// Writes all of `bytes` to `fd`, retrying short writes and EINTR. Returns 0 or the errno.
int write_all(int fd, const void* bytes, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

// Removes the temporary file unless release() was called: every early exit cleans up.
class TempFile {
 public:
  TempFile(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!released_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  // Closes the descriptor; returns 0 or the errno (close can report a delayed write error).
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void release() { released_ = true; }

 private:
  std::filesystem::path path_;
  int fd_;
  bool released_ = false;
};

}  // namespace

void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens) {
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    fail("cannot write {}: {} tokens exceed the token file's int32 count (2^31-1); split the data into several "
         "files",
         path.string(), tokens.size());
  }
  // Check every id before creating anything, so a bad tokenizer leaves no file at all.
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 0xFFFF) {
      fail("cannot write {}: token {} at position {} does not fit the token file's uint16 (the vocabulary must be "
           "smaller than 65536); use a tokenizer with a smaller vocabulary",
           path.string(), tokens[i], i);
    }
  }

  // Same folder as the target, so rename() is atomic; pid + counter keep concurrent writers apart.
  // Temporaries of earlier writes whose process died go first (ops/atomic_file.h).
  remove_stale_temp_files(path);
  const std::filesystem::path temp_path = temp_path_for(path);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create {} (to write {}): {}", temp_path.string(), path.string(), errno_text(errno));
  TempFile temp(temp_path, fd);

  std::array<std::int32_t, kTokenFileHeaderBytes / sizeof(std::int32_t)> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<std::int32_t>(tokens.size());
  if (const int error = write_all(fd, header.data(), sizeof(header)); error != 0) {
    fail("cannot write {}: {}", path.string(), errno_text(error));
  }
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<std::uint16_t> chunk;
  chunk.reserve(std::min(kChunk, tokens.size()));
  for (std::size_t start = 0; start < tokens.size(); start += kChunk) {
    const std::size_t n = std::min(kChunk, tokens.size() - start);
    chunk.resize(n);
    for (std::size_t i = 0; i < n; ++i) chunk[i] = static_cast<std::uint16_t>(tokens[start + i]);
    if (const int error = write_all(fd, chunk.data(), n * sizeof(std::uint16_t)); error != 0) {
      fail("cannot write {}: {}", path.string(), errno_text(error));
    }
  }
  if (::fsync(fd) != 0) fail("cannot flush {} to disk: {}", path.string(), errno_text(errno));
  if (const int error = temp.close(); error != 0) fail("cannot write {}: {}", path.string(), errno_text(error));
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    fail("cannot move {} to {}: {}", temp_path.string(), path.string(), errno_text(errno));
  }
  temp.release();

  // The rename itself is durable only once the folder is synced.
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::fsync(dir_fd) != 0) {
    log_warning("wrote {}, but could not sync its folder {}: {}", path.string(), dir.string(), std::strerror(errno));
  }
  if (dir_fd >= 0) ::close(dir_fd);
}

TokenFile TokenFile::open(const std::filesystem::path& path) {
  constexpr const char* kFix = "regenerate it with `dstrain prepare-data`";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open token file {}: {}; check the path or {}", path.string(), std::strerror(errno), kFix);
  TokenFile file;
  file.path_ = path;
  file.fd_ = fd;  // from here on the destructor closes, also when a check fails
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat token file {}: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("token file {} is not a regular file (a folder?): give the path of a .bin file", path.string());
  const auto file_bytes = static_cast<std::size_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    fail("token file {} has {} bytes, less than its 1024-byte header: it is truncated or not a token file; {}",
         path.string(), file_bytes, kFix);
  }

  std::array<std::int32_t, 3> header{};
  const ssize_t got = ::pread(fd, header.data(), sizeof(header), 0);
  if (got != static_cast<ssize_t>(sizeof(header))) {
    fail("cannot read the header of token file {}: {}", path.string(), got < 0 ? std::strerror(errno) : "it shrank while being opened");
  }
  if (header[0] != kTokenFileMagic) {
    fail("token file {} starts with magic {}, not {}: it is not an llm.c token file; {}", path.string(), header[0],
         kTokenFileMagic, kFix);
  }
  if (header[1] != kTokenFileVersion) {
    fail("token file {} has version {}; this reader knows version {} (uint16 tokens); {}", path.string(), header[1],
         kTokenFileVersion, kFix);
  }
  if (header[2] < 0) {
    fail("token file {} claims {} tokens, a negative count: the header is corrupt; {}", path.string(), header[2],
         kFix);
  }
  const auto count = static_cast<std::size_t>(header[2]);
  const std::size_t expected = kTokenFileHeaderBytes + count * sizeof(std::uint16_t);
  if (file_bytes != expected) {
    fail("token file {} has {} bytes, but its header's {} tokens need {} (1024 + 2 per token): it is {}; {}",
         path.string(), file_bytes, count, expected, file_bytes < expected ? "truncated" : "longer than its header says",
         kFix);
  }
  file.count_ = count;
  // Training reads the tokens in order and more than once; tell the kernel, ignore if it declines.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  return file;
}

void TokenFile::read(std::size_t first, std::span<std::uint16_t> out) const {
  if (first > count_ || out.size() > count_ - first) {
    fail("token file {}: tokens {}..{} lie past its end ({} tokens)", path_.string(), first, first + out.size(), count_);
  }
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  std::size_t left = out.size_bytes();
  auto offset = static_cast<off_t>(kTokenFileHeaderBytes + first * sizeof(std::uint16_t));
  while (left > 0) {
    const ssize_t n = ::pread(fd_, p, left, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading token file {} failed: {}", path_.string(), std::strerror(errno));
    if (n == 0) {
      fail("token file {} shrank while this run reads it: it held {} tokens at the start and now ends before token {}; something "
           "truncated or rewrote it in place. Keep a file's contents fixed while a run reads it (prepare-data replaces its outputs "
           "atomically, which is safe)",
           path_.string(), count_, first + (out.size_bytes() - left) / sizeof(std::uint16_t));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
    offset += n;
  }
}

std::vector<std::uint16_t> TokenFile::read_all() const {
  std::vector<std::uint16_t> all(count_);
  read(0, all);
  return all;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), count_(std::exchange(other.count_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

TokenFile::~TokenFile() { close(); }

void TokenFile::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  count_ = 0;
}

}  // namespace dstrain
