// Every failure of the io_uring engine is a dstrain::Error naming the file, the offset, the byte
// count and the fix — never a crash or a hang — and the engine stays usable and closable after it
// (docs/offload.md §1.6-1.7): misaligned buffers and offsets, tmpfs (no real direct I/O), errors and
// short transfers injected at the Nth piece (the test hook, io_fault_injection.h), a full disk.
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "offload/io_error.h"
#include "offload/io_uring_engine.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using testing_io::aligned_bytes;
using testing_io::fill_pattern;
using testing_io::ScratchDir;

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

TEST(IoFaults, MisalignedBufferOrOffsetIsRefusedBeforeAnyIo) {
  ScratchDir dir("align");
  IoEngine io;
  const std::string path = dir.file("f.bin");
  IoFile f = io.open(path, IoOpen::create);
  auto buf = aligned_bytes(16384);
  const std::string b = error_of([&] { io.write(f, 0, buf.get() + 100, 4096); });
  EXPECT_TRUE(has(b, path) && has(b, "4096 bytes at offset 0") && has(b, "not aligned to 4096") && has(b, "PinnedHostAllocator")) << b;
  const std::string o = error_of([&] { io.read(f, 512, buf.get(), 4096); });
  EXPECT_TRUE(has(o, path) && has(o, "4096 bytes at offset 512") && has(o, "not a multiple of 4096")) << o;
  io.write(f, 0, buf.get(), 4096).wait();  // the engine is untouched
  EXPECT_EQ(f.size(), 4096u);
  const std::string ro = error_of([&] {
    IoFile r = io.open(path, IoOpen::read);
    io.write(r, 0, buf.get(), 4096);
  });
  EXPECT_TRUE(has(ro, "opened for reading")) << ro;
}

TEST(IoFaults, TmpfsIsRefusedWithTheNamedError) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const std::string path = "/dev/shm/dstrain_io_tmpfs_" + std::to_string(::getpid()) + ".swp";
  IoEngine io;
  const std::string e = error_of([&] { IoFile f = io.open(path, IoOpen::create); });
  EXPECT_TRUE(has(e, path) && has(e, "O_DIRECT") && has(e, "tmpfs/ramfs") && has(e, "ext4")) << e;
  EXPECT_FALSE(std::filesystem::exists(path)) << "the refused file is left behind";
  std::filesystem::remove(path);
  // The same message for a file system that refuses O_DIRECT at open (EINVAL), through the hook.
  ScratchDir dir("odirect");
  io.inject_fault(IoFault::parse("odirect@2"));
  IoFile first = io.open(dir.file("a"), IoOpen::create);
  const std::string e2 = error_of([&] { IoFile g = io.open(dir.file("b"), IoOpen::create); });
  EXPECT_TRUE(has(e2, dir.file("b")) && has(e2, "refuses direct I/O")) << e2;
}

// A request of 8 pieces whose 3rd fails: the handle names that piece's file, offset and bytes, the
// other requests complete, and the engine goes on.
void expect_injected(const char* spec, IoOp op, const std::string& what) {
  SCOPED_TRACE(spec);
  ScratchDir dir("inject");
  IoOptions o;
  o.block_size = 8192;
  o.queue_depth = 2;
  o.intra_op_parallelism = 2;
  IoEngine io(o);
  const std::string path = dir.file("f.bin");
  IoFile f = io.open(path, IoOpen::create);
  auto src = aligned_bytes(65536);
  auto dst = aligned_bytes(65536);
  fill_pattern(src.get(), 65536, 1);
  if (op == IoOp::read) io.write(f, 0, src.get(), 65536).wait();
  io.inject_fault(IoFault::parse(spec));
  IoHandle h = op == IoOp::read ? io.read(f, 0, dst.get(), 65536) : io.write(f, 0, src.get(), 65536);
  const std::string e = error_of([&] { h.wait(); });
  EXPECT_TRUE(has(e, std::string(io_op_name(op)) + " of 8192 bytes at offset 16384 of " + path) && has(e, what)) << e;
  // wait_all reports it once too, then the engine is clean.
  EXPECT_TRUE(has(error_of([&] { io.wait_all(); }), "offset 16384")) << "wait_all did not report the failure";
  EXPECT_EQ(error_of([&] { io.wait_all(); }), "(no error)");
  // Still usable: the whole range again, and the data is right.
  io.inject_fault(std::nullopt);
  io.write(f, 0, src.get(), 65536).wait();
  std::memset(dst.get(), 0, 65536);
  io.read(f, 0, dst.get(), 65536).wait();
  EXPECT_EQ(std::memcmp(dst.get(), src.get(), 65536), 0);
  f.close();
}

TEST(IoFaults, InjectedEioAtTheNthPieceIsNamed) {
  expect_injected("eio:read@3", IoOp::read, "Input/output error");
  expect_injected("eio@3", IoOp::write, "Input/output error");
}

TEST(IoFaults, InjectedShortTransferAtTheNthPieceIsNamed) {
  expect_injected("short:read@3", IoOp::read, "returned only 4096 bytes");
  expect_injected("short:write@3", IoOp::write, "stored only 4096 bytes");
}

TEST(IoFaults, InjectedEnospcNamesTheFolderAndTheSpace) {
  expect_injected("enospc:write@3", IoOp::write, "No space left on device");
  expect_injected("enospc:write@3", IoOp::write, "available now");
}

TEST(IoFaults, FaultSpecsAreParsedOrRefusedByName) {
  const IoFault f = IoFault::parse("short:write@12");
  EXPECT_EQ(f.kind, IoFault::Kind::short_transfer);
  EXPECT_EQ(f.op, IoOp::write);
  EXPECT_EQ(f.nth, 12u);
  EXPECT_EQ(IoFault::parse("enospc@1").errno_value, ENOSPC);
  for (const char* bad : {"eio", "eio@0", "eio@x", "boom@1", "eio:sideways@2", "@3"})
    EXPECT_TRUE(has(error_of([&] { IoFault::parse(bad); }), "DSTRAIN_IO_FAULT")) << bad;
}

TEST(IoFaults, ReadingPastTheEndIsAShortRead) {
  ScratchDir dir("eof");
  IoEngine io;
  const std::string path = dir.file("f.bin");
  IoFile f = io.open(path, IoOpen::create);
  auto buf = aligned_bytes(65536);
  io.write(f, 0, buf.get(), 8192).wait();
  const std::string e = error_of([&] { io.read(f, 0, buf.get(), 65536).wait(); });
  EXPECT_TRUE(has(e, "read of 65536 bytes at offset 0 of " + path) && has(e, "returned only 8192")) << e;
}

TEST(IoFaults, AllocateReportsNeededAndAvailableBytes) {
  ScratchDir dir("allocate");
  IoEngine io;
  IoFile f = io.open(dir.file("big.swp"), IoOpen::create);
  const std::int64_t available = io_available_bytes(dir.path.string());
  ASSERT_GT(available, 0);
  const std::uint64_t too_much = static_cast<std::uint64_t>(available) + (std::uint64_t{1} << 40);
  const std::string e = error_of([&] { f.allocate(too_much); });
  EXPECT_TRUE(has(e, "needs " + std::to_string(too_much) + " bytes") && has(e, "bytes available") && has(e, "nvme_path")) << e;
  EXPECT_EQ(f.size(), 0u);
  f.allocate(1 << 20);
  EXPECT_EQ(f.size(), 1u << 20);
}

// A real full disk needs a file system small enough to fill. Without root, the only one a test can
// mount is tmpfs (in a user namespace), which the engine refuses; ext4/xfs images need root for the
// loop mount. So this runs only as root with a loop device and mkfs.ext4, and skips otherwise.
TEST(IoFaults, RealFullFileSystemGivesTheNamedError) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to loop-mount a small ext4 (tmpfs, mountable without root, is refused by the engine)";
  if (!std::filesystem::exists("/dev/loop-control") || std::system("command -v mkfs.ext4 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no loop devices or mkfs.ext4 here: cannot create a small file system";
  ScratchDir dir("fullfs");
  const std::string image = dir.file("fs.img"), mnt = dir.file("mnt");
  std::filesystem::create_directories(mnt);
  const std::string setup = "truncate -s 8M " + image + " && mkfs.ext4 -q -F " + image + " && mount -o loop " + image + " " + mnt;
  if (std::system((setup + " 2>/dev/null").c_str()) != 0) GTEST_SKIP() << "cannot loop-mount an ext4 image here (" << setup << ")";
  std::string e;
  {
    IoEngine io;
    IoFile f = io.open(mnt + "/fill.swp", IoOpen::create);
    constexpr std::size_t kChunk = 1 << 20;
    auto buf = aligned_bytes(kChunk);
    e = error_of([&] {
      for (std::uint64_t off = 0; off < (64u << 20); off += kChunk) io.write(f, off, buf.get(), kChunk).wait();
    });
  }
  std::system(("umount " + mnt).c_str());
  EXPECT_TRUE(has(e, mnt + "/fill.swp") && (has(e, "No space left") || has(e, "stored only"))) << e;
}

}  // namespace
}  // namespace dstrain
