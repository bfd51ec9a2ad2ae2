#include "offload/swap_owner.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace dstrain {
namespace {

std::string first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "host";
  return host;
}

// Field 22 of /proc/PID/stat (starttime); nullopt when the process does not exist. The command name
// (field 2) is in parentheses and may hold spaces, so the fields are counted after its last ')'.
std::optional<std::uint64_t> process_start_time(std::int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  if (!in) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t paren = text.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return std::nullopt;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

SwapOwner SwapOwner::self() {
  SwapOwner o;
  o.host = host_name();
  o.boot_id = first_line("/proc/sys/kernel/random/boot_id");
  o.pid = ::getpid();
  o.start_time = process_start_time(o.pid).value_or(0);
  return o;
}

std::optional<SwapOwner> SwapOwner::read(const std::filesystem::path& folder) {
  std::ifstream in(folder / kFileName);
  if (!in) return std::nullopt;
  SwapOwner o;
  bool has_pid = false;
  std::string key;
  while (in >> key) {
    std::string value;
    std::getline(in >> std::ws, value);
    try {
      if (key == "host") o.host = value;
      if (key == "boot_id") o.boot_id = value;
      if (key == "pid") {
        o.pid = std::stoll(value);
        has_pid = true;
      }
      if (key == "start_time") o.start_time = std::stoull(value);
    } catch (...) {
      return std::nullopt;
    }
  }
  if (!has_pid || o.host.empty()) return std::nullopt;
  return o;
}

bool SwapOwner::write(const std::filesystem::path& folder) const {
  std::ofstream out(folder / kFileName);
  out << "host " << host << "\nboot_id " << boot_id << "\npid " << pid << "\nstart_time " << start_time << "\n";
  out.flush();
  return static_cast<bool>(out);
}

SwapOwner::Liveness SwapOwner::liveness() const {
  const SwapOwner me = self();
  if (host != me.host) return Liveness::unknown;
  if (!boot_id.empty() && !me.boot_id.empty() && boot_id != me.boot_id) return Liveness::gone;
  const std::optional<std::uint64_t> started = process_start_time(pid);
  if (!started) return Liveness::gone;
  if (start_time != 0 && *started != start_time) return Liveness::gone;  // the pid was given to another process
  return Liveness::alive;
}

std::string SwapOwner::describe() const { return fmt::format("pid {} on host {}", pid, host); }

}  // namespace dstrain
