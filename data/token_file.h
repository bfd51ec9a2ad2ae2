// llm.c's token file (dev/data/data_common.py, llmc/dataloader.h), the format `--data` reads, and
// its version 2 for vocabularies above 65,536 ids (docs/data.md §1).
//
//   bytes 0..1023   header: 256 little-endian int32; [0] = 20240520 (magic), [1] = version,
//                   [2] = number of tokens N, [3] = bytes per token (version 2 only), the rest 0
//   version 1       bytes 1024..: N little-endian uint16 token ids (llm.c's own files)
//   version 2       bytes 1024..: N little-endian ids of [3] = 2 (uint16) or 4 (uint32) bytes each
//
// A file's size is therefore exactly 1024 + width·N, which the reader checks, so a truncated copy is
// caught at open instead of feeding garbage to training. The writer keeps version 1 for uint16 ids,
// so GPT-2-sized files stay readable by llm.c itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace dstrain {

inline constexpr std::int32_t kTokenFileMagic = 20240520;
inline constexpr std::int32_t kTokenFileVersionUint16 = 1;  // llm.c's: uint16 ids, no width field
inline constexpr std::int32_t kTokenFileVersionWidth = 2;   // header[3] gives the bytes per id
inline constexpr std::size_t kTokenFileHeaderBytes = 1024;

// Bytes per stored token id.
enum class TokenWidth : std::int32_t { uint16 = 2, uint32 = 4 };

// The narrowest width that holds every id of a vocabulary of `vocab_size` ids (ids < vocab_size).
TokenWidth token_width_for_vocab(std::int64_t vocab_size);

// Writes `tokens` to `path` atomically: a temporary file next to it, fsync, rename over `path`, fsync
// of the folder. TokenWidth::uint16 writes version 1 (llm.c's format), uint32 version 2. On any
// failure (a negative token or one that does not fit `width`, more than 2^31-1 tokens, disk full, no
// permission) throws Error naming the path, and neither `path` nor the temporary file is left changed
// or behind: an existing file at `path` keeps its old contents.
void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens, TokenWidth width = TokenWidth::uint16);

// A token file open for reading. Move-only; closes on destruction.
//
// Tokens are read with pread, not through a memory mapping: a file truncated or rewritten in place
// while a run reads it (another job regenerating it, a full disk) then gives an Error naming the
// file at the next read, where a mapping would kill the process with SIGBUS.
class TokenFile {
 public:
  // Opens and validates `path` (magic, version, width, token count, size = 1024 + width·count).
  // Throws Error naming the file, what is wrong, and how to regenerate it.
  static TokenFile open(const std::filesystem::path& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  // Copies tokens [first, first + out.size()) into `out`. Throws Error naming the file when the
  // range lies past size(), or the file no longer holds it (it shrank since open()).
  // Ids are widened to uint32 whatever the file's width.
  void read(std::size_t first, std::span<std::uint32_t> out) const;
  // Every token (size() of them).
  std::vector<std::uint32_t> read_all() const;
  std::size_t size() const { return count_; }
  TokenWidth width() const { return width_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  TokenFile() = default;
  void close() noexcept;

  std::filesystem::path path_;
  int fd_ = -1;
  std::size_t count_ = 0;
  TokenWidth width_ = TokenWidth::uint16;
};

}  // namespace dstrain
