#include "data/run_files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <iterator>
#include <map>
#include <system_error>

#include "ops/atomic_file.h"
#include "ops/error.h"

#include <fmt/format.h>

namespace dstrain {

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const std::filesystem::path ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a, ea), ea);
  const std::filesystem::path cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b, eb), eb);
  if (ea || eb) return std::filesystem::absolute(a).lexically_normal() == std::filesystem::absolute(b).lexically_normal();
  return ca == cb;
}

bool is_inside(const std::filesystem::path& path, const std::filesystem::path& folder) {
  std::error_code ea, eb;
  const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ea), ea);
  const std::filesystem::path f = std::filesystem::weakly_canonical(std::filesystem::absolute(folder, eb), eb);
  if (ea || eb) return false;
  const auto [fi, pi] = std::mismatch(f.begin(), f.end(), p.begin(), p.end());
  // Every component of the folder is a leading component of the path ("a/b/" ends in an empty one).
  return fi == f.end() || (std::next(fi) == f.end() && fi->empty());
}

void check_outputs_spare_inputs(const std::vector<RunFile>& inputs, const std::vector<RunFile>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const RunFile& out = outputs[i];
    if (out.path.empty() || out.folder) continue;
    for (const RunFile& in : inputs) {
      if (in.path.empty()) continue;
      if (in.folder && is_inside(out.path, in.path)) {
        fail("{} {} lies inside {} {}: writing it could replace a file this run reads; give {} a path outside that folder", out.role,
             out.path.string(), in.role, in.path.string(), out.role);
      }
      if (!in.folder && same_file(out.path, in.path)) {
        fail("{} {} is the file given as {}: writing it would destroy an input of this run; give {} another path", out.role, out.path.string(),
             in.role, out.role);
      }
    }
    for (std::size_t j = 0; j < outputs.size(); ++j) {
      const RunFile& other = outputs[j];
      if (j == i || other.path.empty()) continue;
      if (other.folder && is_inside(out.path, other.path)) {
        fail("{} {} lies inside {} {}, where the run writes files of its own (a checkpoint, `latest`); give {} a path outside it", out.role,
             out.path.string(), other.role, other.path.string(), out.role);
      }
      if (j < i && !other.folder && same_file(out.path, other.path)) {
        fail("{} {} is the file given as {}: one output would overwrite the other; give them different paths", out.role, out.path.string(),
             other.role);
      }
    }
  }
}

void prove_writable(const RunFile& output) {
  const std::filesystem::path& path = output.path;
  if (path.empty() || !path.has_filename() || path.filename() == "." || path.filename() == "..") {
    fail("{} '{}' does not name a file: give a file path", output.role, path.string());
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("{} {} is a folder: give the path of a file to write", output.role, path.string());
  check_replaceable(path, output.role);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("{} {}: cannot create its folder {}: {}", output.role, path.string(), dir.string(), ec.message());
  // The writers write a temporary beside the file and rename it: prove exactly that is allowed.
  const std::filesystem::path probe = temp_path_for(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("{} {}: cannot create a file in {}: {}", output.role, path.string(), dir.string(), write_errno_text(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

OutputRoom output_room(const std::filesystem::path& folder) {
  OutputRoom room;
  struct statvfs vfs {};
  if (::statvfs(folder.c_str(), &vfs) == 0) room.free_bytes = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  struct stat st {};
  if (::stat(folder.c_str(), &st) == 0) room.device = static_cast<std::uint64_t>(st.st_dev);
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) room.file_size_limit = static_cast<double>(limit.rlim_cur);
  return room;
}

std::string format_output_bytes(double bytes) {
  if (bytes < 1024.0 * 1024.0) return fmt::format("{:.0f} bytes", bytes);
  return fmt::format("{:.1f} MiB ({:.0f} bytes)", bytes / (1024.0 * 1024.0), bytes);
}

void check_outputs_fit(const std::vector<OutputSize>& outputs, const std::function<OutputRoom(const std::filesystem::path&)>& room_of) {
  struct FileSystem {
    OutputRoom room;
    double bytes = 0.0;
    std::vector<const OutputSize*> outputs;
  };
  std::map<std::uint64_t, FileSystem> systems;
  std::vector<std::uint64_t> order;  // the file systems as the outputs name them first
  for (const OutputSize& out : outputs) {
    if (out.file.path.empty()) continue;
    const OutputRoom room = room_of(out.folder);
    // A file larger than RLIMIT_FSIZE would stop its write with EFBIG (or SIGXFSZ) at the end of the run.
    if (room.file_size_limit && out.largest_file > *room.file_size_limit) {
      fail(
          "{} {}: it will write a file of at least {} ({}), but this process may write files of at most {} (the file size limit, ulimit -f); "
          "raise the limit (ulimit -f unlimited) or drop {}",
          out.file.role, out.file.path.string(), format_output_bytes(out.largest_file), out.what, format_output_bytes(*room.file_size_limit),
          out.file.role);
    }
    auto [it, fresh] = systems.try_emplace(room.device);
    if (fresh) {
      it->second.room = room;
      order.push_back(room.device);
    }
    it->second.bytes += out.bytes;
    it->second.outputs.push_back(&out);
  }
  for (const std::uint64_t device : order) {
    const FileSystem& fsys = systems.at(device);
    if (!fsys.room.free_bytes || fsys.bytes <= *fsys.room.free_bytes) continue;
    std::string needs;
    for (const OutputSize* out : fsys.outputs) {
      needs += fmt::format("{}{} {} needs {} ({})", needs.empty() ? "" : "; ", out->file.role, out->file.path.string(),
                           format_output_bytes(out->bytes), out->what);
    }
    const OutputSize& first = *fsys.outputs.front();
    fail("the outputs will not fit: {}{} — but the file system of {} has {} free; free some space there, or write {} elsewhere", needs,
         fsys.outputs.size() > 1 ? fmt::format(", {} together", format_output_bytes(fsys.bytes)) : std::string(), first.folder.string(),
         format_output_bytes(*fsys.room.free_bytes), fsys.outputs.size() > 1 ? std::string("them") : first.file.role);
  }
}

}  // namespace dstrain
