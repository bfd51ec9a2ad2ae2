#include "offload/io_error.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace dstrain {
namespace {

std::string folder_of(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

std::string available_text(const std::string& path) {
  const std::int64_t free_bytes = io_available_bytes(folder_of(path));
  return free_bytes < 0 ? std::string("unknown") : fmt::format("{} bytes", free_bytes);
}

// What the errno means here and what to do about it.
std::string fix_for(int e, const std::string& path) {
  switch (e) {
    case EIO:
      return "the device reported an I/O error: check the drive (dmesg, smartctl -a); the bytes of this range are not "
             "to be trusted — move nvme_path / the checkpoint folder to a healthy drive";
    case ENOSPC:
      return fmt::format(
          "the file system holding {} is full ({} available now): free space there or point nvme_path "
          "(or the checkpoint folder) at a drive with room",
          folder_of(path), available_text(path));
    case EDQUOT:
      return fmt::format("your disk quota on the file system holding {} is used up: free space or raise the quota", folder_of(path));
    case EFBIG:
      return "the file would exceed the process's file size limit (ulimit -f) or the file system's largest file: "
             "raise the limit";
    case EINVAL:
      return "the kernel refused the O_DIRECT transfer: the device's logical block size is probably larger than the "
             "alignment used; put the file on a drive with 512-byte or 4 KiB sectors, or report it";
    case EROFS:
      return "the file system is read-only: remount it read-write or choose another folder";
    case EBADF:
      return "the file is not open for this operation: open it for reading and writing";
    default:
      return "see the errno above; if the drive is healthy, report it";
  }
}

}  // namespace

std::int64_t io_available_bytes(const std::string& path) {
  struct statvfs s {};
  if (::statvfs(path.c_str(), &s) != 0) return -1;
  return static_cast<std::int64_t>(s.f_bavail) * static_cast<std::int64_t>(s.f_frsize);
}

std::string io_failure_message(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t bytes, int error_number) {
  return fmt::format("{} of {} bytes at offset {} of {} failed: {} ({}); {}", io_op_name(op), bytes, offset, path, std::strerror(error_number),
                     error_number, fix_for(error_number, path));
}

std::string io_short_message(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t bytes, std::uint64_t done) {
  if (op == IoOp::read)
    return fmt::format(
        "read of {} bytes at offset {} of {} returned only {} bytes: the file ends before the range "
        "(truncated, or never written whole); write it again (for a swap file: remove the swap folder "
        "and restart; for a checkpoint: use another checkpoint)",
        bytes, offset, path, done);
  return fmt::format(
      "write of {} bytes at offset {} of {} stored only {} bytes: the file system is probably full "
      "({} available now) or a file size limit was reached; free space or point the folder at a "
      "larger drive",
      bytes, offset, path, done, available_text(path));
}

std::string io_memory_file_system_message(const std::string& path) {
  return fmt::format(
      "cannot use {} for O_DIRECT I/O: it is on tmpfs/ramfs, memory rather than a drive (older kernels "
      "refuse O_DIRECT there; newer ones accept it and go through the page cache, using the RAM that "
      "offloading is meant to free); put the folder on a disk-backed file system (ext4, xfs on an NVMe "
      "drive), not /dev/shm or a tmpfs /tmp",
      path);
}

std::string io_open_message(const std::string& path, bool writing, int error_number) {
  if (error_number == EINVAL)
    return fmt::format(
        "cannot open {} with O_DIRECT: its file system refuses direct I/O ({}); NVMe offload and "
        "fast checkpoint writes bypass the page cache, so put the folder on a disk-backed file system "
        "(ext4, xfs on an NVMe drive), not tmpfs (/dev/shm, /tmp on some systems) or a network or FUSE "
        "mount",
        path, std::strerror(error_number));
  if (error_number == ENOENT)
    return fmt::format("cannot open {}: {}; {}", path, std::strerror(error_number),
                       writing ? "create its folder first (mkdir -p) or fix the path" : "fix the path, or write the file first");
  if (error_number == EACCES || error_number == EPERM)
    return fmt::format("cannot open {} for {}: {}; choose a folder you may write to, or fix its permissions", path, writing ? "writing" : "reading",
                       std::strerror(error_number));
  if (error_number == EROFS)
    return fmt::format("cannot open {} for writing: the file system is read-only; choose a folder on a writable drive", path);
  if (error_number == EEXIST)
    return fmt::format(
        "cannot create {}: a file of that name exists, and dstrain never overwrites a file it did not create; remove it if it "
        "is a leftover of an earlier run, or give another folder",
        path);
  return fmt::format("cannot open {} for {} with O_DIRECT: {} ({}); {}", path, writing ? "writing" : "reading", std::strerror(error_number),
                     error_number, fix_for(error_number, path));
}

}  // namespace dstrain
