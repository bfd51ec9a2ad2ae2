// SwapOwner: the process a swap folder belongs to — host, boot, pid and the pid's start time — written
// into the rank folder when it is made, so that a later run can tell a folder whose process is gone
// (killed with SIGKILL, lost to a crash or a reboot: nothing removed it) from one in use, and reclaim
// the first (docs/offload.md §4).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace dstrain {

struct SwapOwner {
  std::string host;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: a pid of another boot is another process
  std::int64_t pid = 0;
  std::uint64_t start_time = 0;  // the pid's start, in clock ticks since boot (/proc/PID/stat): a reused pid has another

  // The file inside a rank folder that records its owner.
  static constexpr const char* kFileName = "dstrain_owner";

  // This process.
  static SwapOwner self();
  // The owner recorded in `folder`; nullopt when there is none or it cannot be read (a folder of an
  // older dstrain, or not a run's).
  static std::optional<SwapOwner> read(const std::filesystem::path& folder);
  // Records this owner in `folder`; false when the file cannot be written (the folder then cannot be
  // reclaimed automatically, only named).
  bool write(const std::filesystem::path& folder) const;

  enum class Liveness {
    alive,    // this host and boot, and the pid runs and started when recorded
    gone,     // this host, and another boot, no such pid, or the pid started at another time
    unknown,  // another host: its processes cannot be seen from here
  };
  Liveness liveness() const;
  // "pid 1234 on host h".
  std::string describe() const;
};

}  // namespace dstrain
