// Files written atomically, and the temporaries such writes leave when a process dies.
//
// Every writer of a result (token files, safetensors weights, the summary JSON) writes
// "<target>.tmp.<pid>[.<n>]" next to the target, flushes it and renames it over the target, so a
// reader sees the old file or the new one, never half of one. A process killed in between leaves
// its temporary behind; the next write of the same target removes those whose process no longer
// runs (remove_stale_temp_files), so they neither pile up nor pass for results.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace dstrain {

// The temporary "<target>.tmp.<pid>.<n>" for one write of `target` (n counts this process's writes).
std::filesystem::path temp_path_for(const std::filesystem::path& target);

// True when `name` is the file name of a temporary of `target_name` ("<target_name>.tmp.<pid>" or
// "<target_name>.tmp.<pid>.<n>"); sets *pid to its process id.
bool is_temp_name_of(std::string_view name, std::string_view target_name, long* pid);

// Removes the temporaries of `target` in its folder whose process has ended. Best effort: a file
// that cannot be removed (or a folder that cannot be listed) is left alone. Returns how many went.
int remove_stale_temp_files(const std::filesystem::path& target);

// Error naming `path` when it exists but is not a regular file: a folder, a device node, a FIFO, a
// socket, or a symbolic link (lstat). The rename that ends an atomic write replaces the directory
// entry itself — it would turn /dev/null into a regular file or replace a link instead of writing
// where it points — so every writer checks its target first, and again right before the rename.
// `what` names the output in the message ("--save-weights", "the summary").
void check_replaceable(const std::filesystem::path& path, std::string_view what);

// Writes `text` to `path` atomically (temporary, fsync, rename, fsync of the folder), after
// removing stale temporaries of it. Error naming the path and the cause (disk full, EFBIG of a
// file size limit, permissions); the temporary is removed and an existing `path` keeps its old
// contents.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// The reason for an errno of a write, with the fix ("no space left on the device; free some space
// or write to another folder", "... the process's file size limit (ulimit -f)", ...).
std::string write_errno_text(int error);

// The last step of an atomic write, once `tmp` (temp_path_for(path)) is written, fsynced and closed:
// checks that `path` is still replaceable (check_replaceable, naming `what`), renames `tmp` over it
// and fsyncs the folder. On any Error `tmp` is removed and `path` is as it was.
void commit_temp_file(const std::filesystem::path& tmp, const std::filesystem::path& path, std::string_view what);

}  // namespace dstrain
