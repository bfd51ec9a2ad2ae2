// For the readers that take a path: the fuzz input written to a private temporary file.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace dstrain::fuzz {

inline std::filesystem::path input_file(const std::uint8_t* data, std::size_t size, const char* suffix) {
  static const std::filesystem::path path = std::filesystem::temp_directory_path() / ("dstrain_fuzz_" + std::to_string(::getpid()) + suffix);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace dstrain::fuzz
