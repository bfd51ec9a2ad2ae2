#include "train/startup_times.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace dstrain {
namespace {

const auto kLoaded = std::chrono::steady_clock::now();

// The process's age from /proc: uptime minus the start time in clock ticks after boot (field 22 of
// /proc/self/stat, after the command name in parentheses, which may hold spaces). -1: unreadable.
double age_from_proc() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0.0;
  if (!std::getline(stat, line) || !(uptime >> up)) return -1.0;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return -1.0;
  std::istringstream fields(line.substr(close + 2));  // from field 3 (state) on
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) {
      const long ticks = sysconf(_SC_CLK_TCK);
      return ticks > 0 ? up - std::stod(field) / static_cast<double>(ticks) : -1.0;
    }
  }
  return -1.0;
}

}  // namespace

double seconds_since_process_start() {
  const double age = age_from_proc();
  if (age >= 0.0) return age;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kLoaded).count();
}

}  // namespace dstrain
