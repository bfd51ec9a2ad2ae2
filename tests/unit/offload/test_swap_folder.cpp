// SwapFolder (offload/swap_folder.h): a rank's swap files, one folder per rank and run, preallocated
// — checked against the file's size and the blocks the kernel says it holds (stat) — and removed at
// the end; a bad nvme_path (missing, not a folder, not writable, tmpfs, too small) is a named error
// before anything is created.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "offload/io_error.h"
#include "offload/swap_folder.h"
#include "offload/swap_owner.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using testing_io::aligned_bytes;
using testing_io::fill_pattern;
using testing_io::ScratchDir;

namespace fs = std::filesystem;
const char* kKey = "zero_optimization.offload_optimizer.nvme_path";

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SwapFolder, OneFolderPerRankPreallocatedAndRemovedAtTheEnd) {
  ScratchDir dir("swap");
  IoEngine io;
  {
    SwapFolder r0(io, dir.path.string(), kKey, "run1", 0, {{"master.swp", 10000}, {"exp_avg.swp", 1 << 20}});
    SwapFolder r1(io, dir.path.string(), kKey, "run1", 1, {{"master.swp", 4096}});
    EXPECT_EQ(r0.path(), dir.path / "dstrain_swap" / "run1" / "rank0");
    EXPECT_EQ(r0.bytes(), 12288u + (1u << 20));  // 10000 rounded up to 4096s
    struct stat st {};
    ASSERT_EQ(::stat((r0.path() / "master.swp").c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 12288);
    EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 12288u) << "not preallocated";
    ASSERT_EQ(::stat((r0.path() / "exp_avg.swp").c_str(), &st), 0);
    EXPECT_GE(static_cast<std::uint64_t>(st.st_blocks) * 512, 1u << 20) << "not preallocated";
    EXPECT_TRUE(has(r0.describe(), "2 file(s)") && has(r0.describe(), r0.path().string())) << r0.describe();
    // The files work with the engine: a round trip through rank 0's second file.
    auto src = aligned_bytes(1 << 20), dst = aligned_bytes(1 << 20);
    fill_pattern(src.get(), 1 << 20, 4);
    io.write(r0.file(1), 0, src.get(), 1 << 20).wait();
    io.read(r0.file(1), 0, dst.get(), 1 << 20).wait();
    EXPECT_EQ(std::memcmp(src.get(), dst.get(), 1 << 20), 0);
    // The same run and rank twice: refused, naming the folder.
    const std::string again = error_of([&] { SwapFolder dup(io, dir.path.string(), kKey, "run1", 1, {{"x", 1}}); });
    EXPECT_TRUE(has(again, (dir.path / "dstrain_swap" / "run1" / "rank1").string()) && has(again, "exists already")) << again;
    EXPECT_TRUE(fs::exists(r1.path() / "master.swp")) << "the refused duplicate removed the other's files";
  }
  EXPECT_FALSE(fs::exists(dir.path / "dstrain_swap")) << "swap folders left behind at a clean end";
  EXPECT_TRUE(fs::exists(dir.path));
}

TEST(SwapFolder, BadNvmePathsAreNamedErrorsBeforeStepOne) {
  ScratchDir dir("swapbad");
  IoEngine io;
  const std::string missing = (dir.path / "nope").string();
  std::string e = error_of([&] { SwapFolder f(io, missing, kKey, "r", 0, {{"a", 4096}}); });
  EXPECT_TRUE(has(e, kKey) && has(e, missing) && has(e, "does not exist") && has(e, "mkdir -p")) << e;
  std::ofstream(dir.file("plain")) << "x";
  e = error_of([&] { SwapFolder f(io, dir.file("plain"), kKey, "r", 0, {{"a", 4096}}); });
  EXPECT_TRUE(has(e, kKey) && has(e, "is not a folder")) << e;
  if (fs::is_directory("/dev/shm")) {
    const std::string shm = "/dev/shm/dstrain_swap_test_" + std::to_string(::getpid());
    fs::create_directories(shm);
    e = error_of([&] { SwapFolder f(io, shm, kKey, "r", 0, {{"a", 4096}}); });
    EXPECT_TRUE(has(e, "tmpfs") && has(e, shm)) << e;
    EXPECT_TRUE(fs::is_empty(shm)) << "a refused swap folder was left on tmpfs";
    fs::remove_all(shm);
  }
  if (::geteuid() != 0) {  // root may write anywhere
    const fs::path ro = dir.path / "readonly";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    e = error_of([&] { SwapFolder f(io, ro.string(), kKey, "r", 0, {{"a", 4096}}); });
    EXPECT_TRUE(has(e, kKey) && has(e, "not writable")) << e;
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST(SwapFolder, ADriveTooSmallIsReportedWithBytesNeededAndAvailable) {
  ScratchDir dir("swapsmall");
  IoEngine io;
  const std::int64_t available = io_available_bytes(dir.path.string());
  ASSERT_GT(available, 0);
  const std::uint64_t half = (static_cast<std::uint64_t>(available) / 2 + (std::uint64_t{1} << 40)) / 4096 * 4096;
  const std::string e = error_of([&] { SwapFolder f(io, dir.path.string(), kKey, "r", 3, {{"a", half}, {"b", half}}); });
  EXPECT_TRUE(has(e, "rank 3") && has(e, std::to_string(2 * half) + " bytes, 2 files") && has(e, "available") && has(e, kKey)) << e;
  EXPECT_FALSE(fs::exists(dir.path / "dstrain_swap")) << "files created before the space check";
}

// A rank folder records its owner; after a kill -9 the folder stays, and the next run reclaims it
// (saying so) when its owner is gone — a pid that no longer runs, or one given to another process
// (another start time) — and keeps the others: one whose owner runs, one with no owner recorded.
// When the drive is still too small, the space check names the folders that remain.
TEST(SwapFolder, FoldersOfGoneOwnersAreReclaimedAndTheOthersNamedWhenSpaceIsShort) {
  ScratchDir dir("swapstale");
  const fs::path swap = dir.path / "dstrain_swap";
  const auto plant = [&](const std::string& run, const std::optional<SwapOwner>& owner) {
    const fs::path f = swap / run / "rank0";
    fs::create_directories(f);
    std::ofstream(f / "master.swp") << std::string(8192, 'x');
    if (owner) EXPECT_TRUE(owner->write(f));
    return f;
  };
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // reaped: its pid no longer runs
  SwapOwner dead = SwapOwner::self();
  dead.pid = child;
  SwapOwner reused = SwapOwner::self();  // this pid, but a process that started at another time
  reused.start_time += 1;
  const fs::path gone1 = plant("killed", dead), gone2 = plant("reused", reused);
  const fs::path live = plant("running", SwapOwner::self()), legacy = plant("legacy", std::nullopt);
  EXPECT_EQ(dead.liveness(), SwapOwner::Liveness::gone);
  EXPECT_EQ(SwapOwner::self().liveness(), SwapOwner::Liveness::alive);

  IoEngine io;
  {
    SwapFolder f(io, dir.path.string(), kKey, "next", 0, {{"master.swp", 4096}});
    ASSERT_EQ(f.reclaimed().size(), 2u);
    const std::string all = f.reclaimed()[0] + "\n" + f.reclaimed()[1];
    EXPECT_TRUE(has(all, gone1.string()) && has(all, gone2.string()) && has(all, "is gone") && has(all, std::to_string(child))) << all;
    EXPECT_FALSE(fs::exists(gone1.parent_path())) << "the reclaimed run folder stayed";
    EXPECT_FALSE(fs::exists(gone2));
    EXPECT_TRUE(fs::exists(live / "master.swp") && fs::exists(legacy / "master.swp"));
    const std::optional<SwapOwner> mine = SwapOwner::read(f.path());
    ASSERT_TRUE(mine.has_value()) << "the new folder records no owner";
    EXPECT_EQ(mine->pid, ::getpid());
  }
  const std::int64_t available = io_available_bytes(dir.path.string());
  const std::uint64_t too_much = (static_cast<std::uint64_t>(available) + (std::uint64_t{1} << 40)) / 4096 * 4096;
  const std::string e = error_of([&] { SwapFolder f(io, dir.path.string(), kKey, "big", 0, {{"a", too_much}}); });
  EXPECT_TRUE(has(e, "available") && has(e, live.string()) && has(e, "running") && has(e, legacy.string()) && has(e, "no owner recorded") &&
              has(e, "remove those no run uses"))
      << e;
}

}  // namespace
}  // namespace dstrain
