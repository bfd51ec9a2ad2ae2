// The files a command reads and writes, checked against each other before any work starts: an
// output never replaces an input (train --save-weights onto the data file, --summary-json onto the
// config, prepare-data a.txt -o a.txt), two outputs are never one file, and every output's folder
// exists (created if need be) and takes a new file — so a mistake is found before training, not
// after it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dstrain {

struct RunFile {
  std::filesystem::path path;
  std::string role;  // how the user gave it, e.g. "--data", "--save-weights", "the config file"
  // A folder the run reads (a checkpoint folder, a model folder) or writes its own files into (the
  // --save-dir): no output file may be it or lie inside it.
  bool folder = false;
};

// True when a and b name the same file: the same device and inode when both exist, else the same
// absolute normal path (following the symbolic links that exist).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// True when `path` is `folder` or lies inside it, both resolved (absolute, the links that exist
// followed).
bool is_inside(const std::filesystem::path& path, const std::filesystem::path& folder);

// Throws Error naming both roles and the path when an output is one of the inputs, two outputs are
// the same file, or an output file is or lies inside an input folder or another output's folder.
void check_outputs_spare_inputs(const std::vector<RunFile>& inputs, const std::vector<RunFile>& outputs);

// Creates the folders above `output` and proves a file can be created next to it (a temporary of
// ops/atomic_file.h, created and removed). Throws Error naming the role, the folder and the cause
// (no permission, read-only file system, a file where a folder should be), or when `output`
// exists and is not a regular file (a device, a FIFO, a link: the write's rename would replace it).
void prove_writable(const RunFile& output);

// The room a folder's file system has for new files, and the largest file this process may write.
struct OutputRoom {
  std::optional<double> free_bytes;       // statvfs: bytes available to an unprivileged writer; nullopt: unknown
  std::optional<double> file_size_limit;  // getrlimit(RLIMIT_FSIZE), `ulimit -f`; nullopt: unlimited
  std::uint64_t device = 0;               // the file system (st_dev): outputs on one share its free space
};
OutputRoom output_room(const std::filesystem::path& folder);

// What an output will write, known before step 1: `bytes` in all into `folder` (several files, or
// several checkpoints kept at once), the largest of them one file of at least `largest_file` bytes.
// Both lower bounds: the data, not the headers. `what` says where the figure comes from, for the
// message ("3 checkpoints of 1.2 MiB kept at once").
struct OutputSize {
  RunFile file;
  std::filesystem::path folder;  // an existing folder the output goes into
  double bytes = 0.0;
  double largest_file = 0.0;
  std::string what;
};

// Throws Error naming the output, the size needed and the room found when the outputs on one file
// system need more than it has free, or one file exceeds the file size limit — before the run
// spends hours to lose them at the end. `room_of` finds a folder's room (output_room; tests inject
// their own). The writers still check every write: the disk may fill while the run goes on.
void check_outputs_fit(const std::vector<OutputSize>& outputs, const std::function<OutputRoom(const std::filesystem::path&)>& room_of = output_room);

// "12.3 MiB (12897484 bytes)", for the messages above.
std::string format_output_bytes(double bytes);

}  // namespace dstrain
