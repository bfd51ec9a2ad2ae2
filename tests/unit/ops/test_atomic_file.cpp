// ops/atomic_file.h: the temporaries' names, the removal of those whose process has ended (and
// only those), and an atomic write that leaves the old file and no temporary when it fails.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/atomic_file.h"
#include "ops/error.h"

using namespace dstrain;
using ::testing::HasSubstr;

namespace {

struct Folder {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("dstrain_atomic_file." + std::to_string(::getpid()));
  Folder() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~Folder() { std::filesystem::remove_all(path); }
};

std::string text_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(AtomicFile, TemporaryNames) {
  long pid = 0;
  EXPECT_TRUE(is_temp_name_of("w.safetensors.tmp.1234", "w.safetensors", &pid));
  EXPECT_EQ(pid, 1234);
  EXPECT_TRUE(is_temp_name_of("w.safetensors.tmp.77.3", "w.safetensors", &pid));
  EXPECT_EQ(pid, 77);
  for (const char* other : {"w.safetensors", "w.safetensors.tmp.", "w.safetensors.tmp.x", "w.safetensors.tmp.12.", "w.safetensors.tmp.12.a",
                            "v.safetensors.tmp.12", "w.safetensors.tmp.-3", "w.safetensors.tmp.0"}) {
    EXPECT_FALSE(is_temp_name_of(other, "w.safetensors", &pid)) << other;
  }
  const std::string name = temp_path_for("/a/b/c.json").filename().string();
  EXPECT_TRUE(is_temp_name_of(name, "c.json", &pid)) << name;
  EXPECT_EQ(pid, static_cast<long>(::getpid()));
}

TEST(AtomicFile, RemovesOnlyTheTemporariesOfEndedProcesses) {
  Folder dir;
  const auto touch = [&](const std::string& name) { std::ofstream(dir.path / name) << "x"; };
  touch("c.json.tmp.2147483646");  // no such process (above any pid_max)
  touch("c.json.tmp.2147483646.12");
  const std::string mine = "c.json.tmp." + std::to_string(::getpid()) + ".5";  // this process: running
  touch(mine);
  touch("c.json.tmp.1");           // init: running
  touch("d.json.tmp.2147483646");  // another target
  touch("c.json");
  EXPECT_EQ(remove_stale_temp_files(dir.path / "c.json"), 2);
  for (const char* kept : {"c.json.tmp.1", "d.json.tmp.2147483646", "c.json"}) EXPECT_TRUE(std::filesystem::exists(dir.path / kept)) << kept;
  EXPECT_TRUE(std::filesystem::exists(dir.path / mine));
  EXPECT_FALSE(std::filesystem::exists(dir.path / "c.json.tmp.2147483646"));
}

TEST(AtomicFile, WriteReplacesWholeOrNotAtAll) {
  Folder dir;
  const auto path = dir.path / "s.json";
  write_file_atomically(path, "old");
  EXPECT_EQ(text_of(path), "old");
  std::ofstream(dir.path / "s.json.tmp.2147483646") << "{";  // a dead writer's leftover
  // A file size limit fails the write part-way (SIGXFSZ ignored, as the CLI does).
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &previous), 0);
  rlimit old_limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_file_atomically(path, std::string(5000, 'n'));
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  ::sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("ulimit -f"));
  EXPECT_EQ(text_of(path), "old");
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "the new temporary and the dead writer's leftover must both be gone";
}
