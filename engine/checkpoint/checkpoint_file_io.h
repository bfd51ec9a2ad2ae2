// File helpers the checkpoint's commit (checkpoint_files.cpp), writer (checkpoint_writer.cpp) and
// reader (checkpoint_reader.cpp) share: a path quoted for messages, O_DIRECT's block arithmetic, a
// durable close, whole small files read.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "config_schema/field_spec.h"  // config::Json

namespace dstrain::checkpoint_io {

inline constexpr std::size_t kBlock = 4096;  // O_DIRECT's unit of offset, size and address

inline std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// 'path', as every checkpoint message names a file.
inline std::string q(const std::filesystem::path& p) { return fmt::format("'{}'", p.string()); }

// fsync, then close: an Error naming the file when either fails (the previous checkpoint is untouched).
void fsync_close(int fd, const std::filesystem::path& path);
// A checkpoint's JSON file (`what`: "manifest", "index"): an Error naming it when missing or not JSON.
config::Json read_json_file(const std::filesystem::path& path, const char* what);
// A small text file whole ("" when unreadable).
std::string read_text(const std::filesystem::path& path);

}  // namespace dstrain::checkpoint_io
