// SwapFolder: a rank's swap files on NVMe — <nvme_path>/dstrain_swap/<run>/rank<R>/ — created and
// preallocated (fallocate) when the engine initializes, so that a drive that is too small, a path
// that is missing, not a folder, not writable or on tmpfs is reported before step 1, with the bytes
// needed and available; removed again when the run ends cleanly (docs/offload.md §4).
//
// One folder per rank and run: ranks of one run, and runs sharing an nvme_path, never touch each
// other's files. DeepSpeed uses <nvme_path>/zero_stage_3/optimizer/rank<R> and keeps it; a rank
// folder here records its owner process (offload/swap_owner.h), and a later run reclaims the
// folders whose owner is gone, or names the ones it cannot when the drive is too small.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "offload/io_uring_engine.h"

namespace dstrain {

struct SwapFileSpec {
  std::string name;     // file name inside the rank folder, e.g. "exp_avg.swp"
  std::uint64_t bytes;  // rounded up to the O_DIRECT alignment when allocated
};

class SwapFolder {
 public:
  // `config_key`: the key that named `nvme_path` ("zero_optimization.offload_optimizer.nvme_path"),
  // for messages. `run`: this run's name (the same for all its ranks); empty: "<host>-<pid>".
  // Throws Error — leaving nothing behind — when the folder or its files cannot be made.
  SwapFolder(IoEngine& io, const std::string& nvme_path, const std::string& config_key, const std::string& run, int rank,
             const std::vector<SwapFileSpec>& files);
  // Closes the files and removes the rank folder (and the run folder and dstrain_swap when empty).
  ~SwapFolder();
  SwapFolder(const SwapFolder&) = delete;
  SwapFolder& operator=(const SwapFolder&) = delete;

  const std::filesystem::path& path() const { return folder_; }
  IoFile& file(std::size_t i) { return files_.at(i); }
  // Bytes preallocated (each file rounded up to its alignment).
  std::uint64_t bytes() const { return bytes_; }
  // One line for the run's log: files, bytes, folder, what was free.
  std::string describe() const;

  // The folders earlier runs left behind whose owner process is gone (SwapOwner: killed with
  // SIGKILL, crashed, before a reboot): removed, each named in what was reclaimed. The constructor
  // does this before its space check, and logs them.
  const std::vector<std::string>& reclaimed() const { return reclaimed_; }

  // "<host>-<pid>": the default run name.
  static std::string default_run_name();
  // The checks of `nvme_path` that need no model: set, exists, a folder, writable, not tmpfs/ramfs
  // (even when no file ends up there: the folder is the user's promise of a drive). Error naming
  // `config_key` and the fix. The constructor runs them first; check-config runs them too
  // (check_engine_trains), so it refuses what train would.
  static void check_path(const std::string& nvme_path, const std::string& config_key);

 private:
  void remove_folders() noexcept;

  std::filesystem::path root_, run_folder_, folder_;
  std::vector<std::string> reclaimed_;
  std::vector<IoFile> files_;
  std::uint64_t bytes_ = 0;
  std::uint64_t available_before_ = 0;
};

}  // namespace dstrain
