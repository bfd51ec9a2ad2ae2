#include "data/token_file.h"

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

TokenWidth token_width_for_vocab(std::int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > std::int64_t{1} << 32) {
    fail("a vocabulary of {} ids does not fit a token file (ids are uint16 or uint32)", vocab_size);
  }
  return vocab_size <= 65536 ? TokenWidth::uint16 : TokenWidth::uint32;
}

void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens, TokenWidth width) {
  if (width != TokenWidth::uint16 && width != TokenWidth::uint32) {
    fail("cannot write {}: token width {} is neither 2 (uint16) nor 4 (uint32) bytes", path.string(), static_cast<std::int32_t>(width));
  }
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    fail(
        "cannot write {}: {} tokens exceed the token file's int32 count (2^31-1); split the data into several "
        "files",
        path.string(), tokens.size());
  }
  // Check every id before creating anything, so a bad tokenizer leaves no file at all. int32 ids are
  // never above uint32's range, so only uint16 has an upper limit to check.
  const bool narrow = width == TokenWidth::uint16;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || (narrow && tokens[i] > 0xFFFF)) {
      fail("cannot write {}: token {} at position {} does not fit the token file's {} ids{}", path.string(), tokens[i], i,
           narrow ? "uint16" : "uint32",
           narrow ? " (vocabulary < 65536); write it with TokenWidth::uint32 (version 2), as prepare-data does for a "
                    "larger vocabulary"
                  : "");
    }
  }

  // Same folder as the target, so rename() is atomic; pid + counter keep concurrent writers apart.
  // Temporaries of earlier writes whose process died go first (ops/atomic_file.h).
  check_replaceable(path, "the token file");
  remove_stale_temp_files(path);
  const std::filesystem::path temp_path = temp_path_for(path);
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create {} (to write {}): {}", temp_path.string(), path.string(), errno_text(errno));
  TempFile temp(temp_path, fd);

  std::array<std::int32_t, kTokenFileHeaderBytes / sizeof(std::int32_t)> header{};
  header[0] = kTokenFileMagic;
  header[1] = narrow ? kTokenFileVersionUint16 : kTokenFileVersionWidth;
  header[2] = static_cast<std::int32_t>(tokens.size());
  if (!narrow) header[3] = static_cast<std::int32_t>(width);
  if (const int error = write_all(fd, header.data(), sizeof(header)); error != 0) {
    fail("cannot write {}: {}", path.string(), errno_text(error));
  }
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  const auto write_chunks = [&]<typename Id>(std::vector<Id>& chunk) {
    chunk.reserve(std::min(kChunk, tokens.size()));
    for (std::size_t start = 0; start < tokens.size(); start += kChunk) {
      const std::size_t n = std::min(kChunk, tokens.size() - start);
      chunk.resize(n);
      for (std::size_t i = 0; i < n; ++i) chunk[i] = static_cast<Id>(tokens[start + i]);
      if (const int error = write_all(fd, chunk.data(), n * sizeof(Id)); error != 0) {
        fail("cannot write {}: {}", path.string(), errno_text(error));
      }
    }
  };
  if (narrow) {
    std::vector<std::uint16_t> chunk;
    write_chunks(chunk);
  } else {
    std::vector<std::uint32_t> chunk;
    write_chunks(chunk);
  }
  if (::fsync(fd) != 0) fail("cannot flush {} to disk: {}", path.string(), errno_text(errno));
  if (const int error = temp.close(); error != 0) fail("cannot write {}: {}", path.string(), errno_text(error));
  check_replaceable(path, "the token file");  // what may have appeared there while writing (the temporary goes with `temp`)
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
    fail("token file {} has {} bytes, less than its 1024-byte header: it is truncated or not a token file; {}", path.string(), file_bytes, kFix);
  }

  std::array<std::int32_t, 4> header{};
  const ssize_t got = ::pread(fd, header.data(), sizeof(header), 0);
  if (got != static_cast<ssize_t>(sizeof(header))) {
    fail("cannot read the header of token file {}: {}", path.string(), got < 0 ? std::strerror(errno) : "it shrank while being opened");
  }
  if (header[0] != kTokenFileMagic) {
    fail("token file {} starts with magic {}, not {}: it is not an llm.c token file; {}", path.string(), header[0], kTokenFileMagic, kFix);
  }
  TokenWidth width = TokenWidth::uint16;
  if (header[1] == kTokenFileVersionWidth) {
    if (header[3] != static_cast<std::int32_t>(TokenWidth::uint16) && header[3] != static_cast<std::int32_t>(TokenWidth::uint32)) {
      fail(
          "token file {} (version 2) gives {} bytes per token; the format allows 2 (uint16) or 4 (uint32): the header "
          "is corrupt; {}",
          path.string(), header[3], kFix);
    }
    width = static_cast<TokenWidth>(header[3]);
  } else if (header[1] != kTokenFileVersionUint16) {
    fail(
        "token file {} has version {}; this reader knows versions 1 (uint16 tokens) and 2 (uint16 or uint32 tokens, "
        "width in the header); {}",
        path.string(), header[1], kFix);
  }
  if (header[2] < 0) {
    fail("token file {} claims {} tokens, a negative count: the header is corrupt; {}", path.string(), header[2], kFix);
  }
  const auto count = static_cast<std::size_t>(header[2]);
  const auto bytes_per_token = static_cast<std::size_t>(width);
  const std::size_t expected = kTokenFileHeaderBytes + count * bytes_per_token;
  if (file_bytes != expected) {
    fail("token file {} has {} bytes, but its header's {} tokens need {} (1024 + {} per token): it is {}; {}", path.string(), file_bytes, count,
         expected, bytes_per_token, file_bytes < expected ? "truncated" : "longer than its header says", kFix);
  }
  file.width_ = width;
  file.count_ = count;
  // Training reads the tokens in order and more than once; tell the kernel, ignore if it declines.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  return file;
}

void TokenFile::read(std::size_t first, std::span<std::uint32_t> out) const {
  if (first > count_ || out.size() > count_ - first) {
    fail("token file {}: tokens {}..{} lie past its end ({} tokens)", path_.string(), first, first + out.size(), count_);
  }
  const auto bytes_per_token = static_cast<std::size_t>(width_);
  // uint32 ids land in `out` directly; uint16 ids are read into the back half of `out` and widened
  // from the front, which never overwrites an id not yet widened (element i is written after the
  // narrow ids 0..i were read, and narrow id i lies at byte 2·(n + i) >= 4·i).
  auto* base = reinterpret_cast<unsigned char*>(out.data());
  const std::size_t total = out.size() * bytes_per_token;
  unsigned char* p = base + (out.size_bytes() - total);
  std::size_t left = total;
  auto offset = static_cast<off_t>(kTokenFileHeaderBytes + first * bytes_per_token);
  while (left > 0) {
    const ssize_t n = ::pread(fd_, p, left, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading token file {} failed: {}", path_.string(), std::strerror(errno));
    if (n == 0) {
      fail(
          "token file {} shrank while this run reads it: it held {} tokens at the start and now ends before token {}; something "
          "truncated or rewrote it in place. Keep a file's contents fixed while a run reads it (prepare-data replaces its outputs "
          "atomically, which is safe)",
          path_.string(), count_, first + (total - left) / bytes_per_token);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
    offset += n;
  }
  if (width_ == TokenWidth::uint16) {
    const unsigned char* narrow = base + (out.size_bytes() - total);
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::uint16_t id;
      std::memcpy(&id, narrow + 2 * i, sizeof(id));
      out[i] = id;
    }
  }
}

std::vector<std::uint32_t> TokenFile::read_all() const {
  std::vector<std::uint32_t> all(count_);
  read(0, all);
  return all;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), count_(std::exchange(other.count_, 0)), width_(other.width_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    count_ = std::exchange(other.count_, 0);
    width_ = other.width_;
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
