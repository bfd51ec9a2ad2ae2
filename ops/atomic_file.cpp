#include "ops/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {

std::filesystem::path temp_path_for(const std::filesystem::path& target) {
  static std::atomic<unsigned> counter{0};
  std::filesystem::path p = target;
  p += fmt::format(".tmp.{}.{}", ::getpid(), counter.fetch_add(1));
  return p;
}

bool is_temp_name_of(std::string_view name, std::string_view target_name, long* pid) {
  const std::string prefix = std::string(target_name) + ".tmp.";
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return false;
  std::string_view rest = name.substr(prefix.size());
  long p = 0;
  const auto r = std::from_chars(rest.data(), rest.data() + rest.size(), p);
  if (r.ec != std::errc() || r.ptr == rest.data() || p <= 0) return false;
  rest.remove_prefix(static_cast<std::size_t>(r.ptr - rest.data()));
  if (!rest.empty()) {  // ".<n>"
    if (rest[0] != '.' || rest.size() < 2) return false;
    for (const char c : rest.substr(1)) {
      if (c < '0' || c > '9') return false;
    }
  }
  if (pid != nullptr) *pid = p;
  return true;
}

int remove_stale_temp_files(const std::filesystem::path& target) {
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  const std::string target_name = target.filename().string();
  if (target_name.empty()) return 0;
  int removed = 0;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return 0;
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    long pid = 0;
    const std::string name = it->path().filename().string();
    if (!is_temp_name_of(name, target_name, &pid)) continue;
    // A process that still runs may be writing it right now (another dstrain, or this one).
    if (pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (std::filesystem::remove(it->path(), rm)) ++removed;
  }
  return removed;
}

std::string write_errno_text(int error) {
  if (error == ENOSPC) return "no space left on the device; free some space or write to another folder";
  if (error == EDQUOT) return "disk quota exceeded; free some space or write to another folder";
  if (error == EFBIG) return "file too large for this file system or the process's file size limit (ulimit -f); raise the limit or write less";
  if (error == EACCES || error == EPERM || error == EROFS) return std::string(std::strerror(error)) + "; choose a folder you may write";
  if (error == ENOENT) return "no such folder; create the folder first";
  return std::strerror(error);
}

void check_replaceable(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent (or unreadable: the write will say why)
  if (S_ISREG(st.st_mode)) return;
  const char* kind = S_ISDIR(st.st_mode)    ? "a folder"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  fail(
      "{} '{}' is {}: dstrain writes its results atomically (a temporary renamed over the target), which would replace it rather than "
      "write into it; give the path of a regular file{}",
      what, path.string(), kind, S_ISLNK(st.st_mode) ? " (the path the link points to, if that is the file you mean)" : "");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  check_replaceable(path, "the output");
  remove_stale_temp_files(path);
  const std::filesystem::path tmp = temp_path_for(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create {} (to write {}): {}", tmp.string(), path.string(), write_errno_text(errno));
  const auto give_up = [&](const char* what, int error) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail("{} {} failed: {} (an existing {} is untouched)", what, path.string(), write_errno_text(error), path.filename().string());
  };
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) give_up("writing", n < 0 ? errno : EIO);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) give_up("flushing", errno);
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    fail("writing {} failed: {}", path.string(), write_errno_text(error));
  }
  commit_temp_file(tmp, path, "the output");
}

void commit_temp_file(const std::filesystem::path& tmp, const std::filesystem::path& path, std::string_view what) {
  try {
    check_replaceable(path, what);  // what may have appeared there while writing
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    fail("cannot move {} to {} '{}': {}", tmp.string(), what, path.string(), write_errno_text(error));
  }
  // Make the rename itself durable (best effort: some file systems refuse a folder's fsync).
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace dstrain
