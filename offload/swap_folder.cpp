#include "offload/swap_folder.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "offload/io_error.h"
#include "offload/swap_owner.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/stop_request.h"
#include "ops/memory_stats.h"

namespace dstrain {

namespace fs = std::filesystem;

std::string SwapFolder::default_run_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "host");
  return fmt::format("{}-{}", host, ::getpid());
}

void SwapFolder::check_path(const std::string& nvme_path, const std::string& config_key) {
  std::error_code ec;
  if (nvme_path.empty()) fail("{} is empty: set it to a folder on the NVMe drive", config_key);
  if (!fs::exists(nvme_path, ec))
    fail("{} \"{}\" does not exist: create it on the NVMe drive (mkdir -p {}) or fix the path", config_key, nvme_path, nvme_path);
  if (!fs::is_directory(nvme_path, ec)) fail("{} \"{}\" is not a folder: point it at a folder on the NVMe drive", config_key, nvme_path);
  if (::access(nvme_path.c_str(), W_OK | X_OK) != 0)
    fail("{} \"{}\" is not writable by this user ({}): choose a folder you may write to, or fix its permissions", config_key, nvme_path,
         std::strerror(errno));
  // tmpfs / ramfs: the engine refuses its files there at open (io_uring_engine.cpp says why), but a
  // store that swaps nothing (every unit within max_in_cpu, or persistent) opens none, and would
  // train on a path that can never work once the model grows: refused here, before any file.
  struct statfs s {};
  if (::statfs(nvme_path.c_str(), &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC))
    fail("{} \"{}\": {}", config_key, nvme_path, io_memory_file_system_message(nvme_path));
}

namespace {

// Bytes a folder holds on the drive (allocated blocks: preallocated swap files count in full).
std::uint64_t bytes_on_drive(const fs::path& folder) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(folder, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += static_cast<std::uint64_t>(st.st_blocks) * 512;
  }
  return total;
}

// Every rank folder under <nvme_path>/dstrain_swap: <run>/<rank>.
std::vector<fs::path> rank_folders(const fs::path& swap_root) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (auto run = fs::directory_iterator(swap_root, ec); !ec && run != fs::directory_iterator(); run.increment(ec)) {
    std::error_code e2;
    if (!run->is_directory(e2)) continue;
    for (auto rank = fs::directory_iterator(run->path(), e2); !e2 && rank != fs::directory_iterator(); rank.increment(e2)) {
      std::error_code e3;
      if (rank->is_directory(e3)) found.push_back(rank->path());
    }
  }
  return found;
}

// Removes the rank folders whose owner is gone (and their run folders when that empties them).
std::vector<std::string> reclaim_stale_folders(const fs::path& swap_root) {
  std::vector<std::string> reclaimed;
  for (const fs::path& folder : rank_folders(swap_root)) {
    const std::optional<SwapOwner> owner = SwapOwner::read(folder);
    if (!owner || owner->liveness() != SwapOwner::Liveness::gone) continue;
    const std::uint64_t bytes = bytes_on_drive(folder);
    std::error_code ec;
    fs::remove_all(folder, ec);
    if (ec) continue;                      // named by the space check if it matters
    fs::remove(folder.parent_path(), ec);  // only when empty
    reclaimed.push_back(fmt::format("{} ({}; its owner, {}, is gone)", folder.string(), format_bytes(bytes), owner->describe()));
  }
  return reclaimed;
}

// The other runs' folders still there, for the space check's message: where the room went.
std::string other_folders(const fs::path& swap_root) {
  std::string text;
  std::size_t count = 0;
  for (const fs::path& folder : rank_folders(swap_root)) {
    const std::uint64_t bytes = bytes_on_drive(folder);
    const std::optional<SwapOwner> owner = SwapOwner::read(folder);
    std::string whose = "no owner recorded (an older dstrain's, or not a run's)";
    if (owner) {
      const SwapOwner::Liveness l = owner->liveness();
      whose = fmt::format("owner {}, {}", owner->describe(),
                          l == SwapOwner::Liveness::alive     ? "running"
                          : l == SwapOwner::Liveness::unknown ? "another host"
                                                              : "gone");
    }
    if (count++ < 8) text += fmt::format("{}{} ({}, {})", text.empty() ? "" : "; ", folder.string(), format_bytes(bytes), whose);
  }
  if (count > 8) text += fmt::format("; and {} more", count - 8);
  return text;
}

}  // namespace

SwapFolder::SwapFolder(IoEngine& io, const std::string& nvme_path, const std::string& config_key, const std::string& run, int rank,
                       const std::vector<SwapFileSpec>& files)
    : root_(nvme_path) {
  std::error_code ec;
  check_path(nvme_path, config_key);

  // Folders a killed run left behind take room nothing will ever free: reclaimed first, and said.
  reclaimed_ = reclaim_stale_folders(root_ / "dstrain_swap");
  for (const std::string& r : reclaimed_) log_warning("reclaimed the swap folder {}", r);

  // The space check comes first, before anything is created: the bytes every file needs, rounded up
  // to the O_DIRECT alignment (a multiple of 4096; the device may ask more, checked at open).
  std::uint64_t needed = 0;
  for (const SwapFileSpec& f : files) needed += (f.bytes + IoEngine::kMinAlignment - 1) / IoEngine::kMinAlignment * IoEngine::kMinAlignment;
  const std::int64_t available = io_available_bytes(nvme_path);
  available_before_ = available < 0 ? 0 : static_cast<std::uint64_t>(available);
  if (available >= 0 && needed > static_cast<std::uint64_t>(available)) {
    const std::string others = other_folders(root_ / "dstrain_swap");
    fail(
        "rank {}'s swap files need {} ({} bytes, {} files) under {} \"{}\", but its file system has {} ({} bytes) "
        "available: free {} bytes there, point {} at a larger drive, or offload less (device \"cpu\", a smaller model, "
        "more ranks){}",
        rank, format_bytes(needed), needed, files.size(), config_key, nvme_path, format_bytes(static_cast<std::uint64_t>(available)), available,
        needed - static_cast<std::uint64_t>(available), config_key,
        others.empty() ? std::string() : fmt::format(". Swap folders of other runs are there: {} — remove those no run uses", others));
  }

  run_folder_ = root_ / "dstrain_swap" / (run.empty() ? default_run_name() : run);
  folder_ = run_folder_ / fmt::format("rank{}", rank);
  // Unnamed runs of one process (engines made one after another, or side by side in tests) take the
  // next free "<host>-<pid>-N"; a named run's folder must be free.
  for (int n = 2; run.empty() && fs::exists(folder_, ec) && n < 10000; ++n) {
    run_folder_ = root_ / "dstrain_swap" / fmt::format("{}-{}", default_run_name(), n);
    folder_ = run_folder_ / fmt::format("rank{}", rank);
  }
  if (fs::exists(folder_, ec))
    fail(
        "the swap folder {} exists already: another run with the same name is using it, or one that crashed left it; "
        "remove it if no run uses it, or give this run another name",
        folder_.string());
  // Another rank or run may remove an empty run folder or dstrain_swap (its clean end, a reclaim)
  // between our mkdirs: tried again when a parent vanished.
  for (int attempt = 0; attempt < 10; ++attempt) {
    ec.clear();
    fs::create_directories(folder_, ec);
    if (ec != std::errc::no_such_file_or_directory) break;
  }
  if (ec) fail("cannot create the swap folder {}: {}; check {} \"{}\"", folder_.string(), ec.message(), config_key, nvme_path);
  (void)SwapOwner::self().write(folder_);  // best effort: without it, a crash leaves a folder that is named, not reclaimed
  try {
    for (const SwapFileSpec& f : files) {
      throw_if_stop_overdue("preallocating the swap files in " + folder_.string());
      files_.push_back(io.open((folder_ / f.name).string(), IoOpen::create));
      IoFile& file = files_.back();
      const std::uint64_t rounded = (f.bytes + file.alignment() - 1) / file.alignment() * file.alignment();
      file.allocate(rounded);
      bytes_ += rounded;
    }
  } catch (const StopRequested&) {
    files_.clear();
    remove_folders();
    throw;  // the trainer's to report, as it is
  } catch (const Error& e) {
    files_.clear();
    remove_folders();
    // The engine's open errors (tmpfs, no O_DIRECT) name the file; the user fixes the key.
    const std::string what = e.what();
    if (what.find(config_key) != std::string::npos) throw;
    throw Error(fmt::format("{} \"{}\": {}", config_key, nvme_path, what));
  } catch (...) {
    files_.clear();
    remove_folders();
    throw;
  }
}

SwapFolder::~SwapFolder() {
  files_.clear();  // closes them, after their requests
  remove_folders();
}

void SwapFolder::remove_folders() noexcept {
  std::error_code ec;
  fs::remove_all(folder_, ec);
  // The run folder and dstrain_swap only when empty: other ranks of the run, other runs, keep theirs.
  fs::remove(run_folder_, ec);
  fs::remove(root_ / "dstrain_swap", ec);
}

std::string SwapFolder::describe() const {
  return fmt::format("NVMe swap: {} file(s), {} preallocated in {} ({} were free)", files_.size(), format_bytes(bytes_), folder_.string(),
                     format_bytes(available_before_));
}

}  // namespace dstrain
