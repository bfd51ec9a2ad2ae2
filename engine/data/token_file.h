// llm.c's token file (dev/data/data_common.py, llmc/dataloader.h), the format `--data` reads.
//
//   bytes 0..1023   header: 256 little-endian int32; [0] = 20240520 (magic), [1] = 1 (version),
//                   [2] = number of tokens N, the rest 0
//   bytes 1024..    N little-endian uint16 token ids
//
// A file's size is therefore exactly 1024 + 2·N, which the reader checks, so a truncated copy is
// caught at open instead of feeding garbage to training.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace dstrain {

inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::int32_t kTokenFileVersion = 1;
inline constexpr std::size_t kTokenFileHeaderBytes = 1024;

// Writes `tokens` to `path` atomically: a temporary file next to it, fsync, rename over `path`, fsync
// of the folder. On any failure (a token outside 0..65535, more than 2^31-1 tokens, disk full, no
// permission) throws Error naming the path, and neither `path` nor the temporary file is left changed
// or behind: an existing file at `path` keeps its old contents.
void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens);

// A token file open for reading. Move-only; closes on destruction.
//
// Tokens are read with pread, not through a memory mapping: a file truncated or rewritten in place
// while a run reads it (another job regenerating it, a full disk) then gives an Error naming the
// file at the next read, where a mapping would kill the process with SIGBUS.
class TokenFile {
 public:
  // Opens and validates `path` (magic, version, token count, size = 1024 + 2·count). Throws Error
  // naming the file, what is wrong, and how to regenerate it.
  static TokenFile open(const std::filesystem::path& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  // Copies tokens [first, first + out.size()) into `out`. Throws Error naming the file when the
  // range lies past size(), or the file no longer holds it (it shrank since open()).
  void read(std::size_t first, std::span<std::uint16_t> out) const;
  // Every token (size() of them).
  std::vector<std::uint16_t> read_all() const;
  std::size_t size() const { return count_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  TokenFile() = default;
  void close() noexcept;

  std::filesystem::path path_;
  int fd_ = -1;
  std::size_t count_ = 0;
};

}  // namespace dstrain
