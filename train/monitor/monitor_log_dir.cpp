#include "train/monitor/monitor_log_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "ops/error.h"

namespace dstrain {

std::filesystem::path make_monitor_log_dir(std::string_view section, const config::FileMonitorConfig& cfg) {
  const std::filesystem::path dir =
      cfg.output_path.empty() ? std::filesystem::path(cfg.job_name) : std::filesystem::path(cfg.output_path) / cfg.job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    fail(
        "{0}: cannot create the log folder '{1}' ({0}.output_path = '{2}', {0}.job_name = '{3}'): {4}; "
        "set {0}.output_path to a writable folder, or disable {0}",
        section, dir.string(), cfg.output_path, cfg.job_name, ec ? ec.message() : "a file of that name exists");
  }
  // create_directories succeeds on an existing read-only folder; only a write shows it is usable.
  const std::filesystem::path probe = dir / fmt::format(".dstrain_write_probe.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    fail(
        "{0}: the log folder '{1}' is not writable: {2}; set {0}.output_path to a writable folder, or "
        "disable {0}",
        section, dir.string(), std::strerror(err));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return dir;
}

}  // namespace dstrain
