// Files for the checkpoint tests (test_checkpoint*.cpp): a scratch folder removed at the end of its
// scope, and a file's bytes.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>

#include <fmt/format.h>
#include <unistd.h>

namespace dstrain::checkpoint_testing {

// <temp>/dstrain_ckpt_<name>_<pid>, made empty; removed with its contents at the end of the scope.
// The pid keeps test programs running side by side apart; within one program the names do.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / fmt::format("dstrain_ckpt_{}_{}", name, ::getpid());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

inline std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace dstrain::checkpoint_testing
