// Helpers of the io_uring engine's tests: a scratch folder on a disk-backed file system, aligned
// buffers, a byte pattern, and a plain pread reference that does not go through the engine.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::testing_io {

// A fresh folder under /tmp (disk-backed here; not /dev/shm, which the engine refuses), removed at the end.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / ("dstrain_io_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` bytes (rounded up to 4096 for the allocation) at a 4096-aligned address.
inline AlignedBytes aligned_bytes(std::size_t bytes) {
  const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
  return AlignedBytes(static_cast<std::byte*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded)));
}

// A pattern that differs at every byte of a few MiB and between seeds.
inline void fill_pattern(std::byte* p, std::size_t bytes, std::uint32_t seed) {
  std::uint32_t x = seed * 2654435761u + 12345u;
  for (std::size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<std::byte>(x >> 24);
  }
}

// The file's bytes [offset, offset + bytes) read with plain pread (the page cache), the reference.
inline std::vector<std::byte> pread_reference(const std::string& path, std::uint64_t offset, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return {};
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out.data() + done, bytes - done, static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

}  // namespace dstrain::testing_io
