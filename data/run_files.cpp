#include "data/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <system_error>

#include "ops/atomic_file.h"
#include "ops/error.h"

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

}  // namespace dstrain
