// IoEngine (offload/io_uring_engine.h): what it writes reads back, byte for byte, and matches what
// a plain pread of the file sees (the reference: the page cache, not the engine) — at unaligned
// sizes (docs/offload.md §1.4), with many requests in flight, over the whole range of the aio keys.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "offload/io_uring_engine.h"
#include "offload/pinned_host_allocator.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using testing_io::aligned_bytes;
using testing_io::fill_pattern;
using testing_io::pread_reference;
using testing_io::ScratchDir;

bool same(const std::byte* a, const std::byte* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

// Writes `bytes` at `offset`, checks the file against pread, reads it back through the engine.
void round_trip(IoEngine& io, const std::string& path, std::uint64_t offset, std::size_t bytes, std::uint32_t seed) {
  auto src = aligned_bytes(bytes);
  auto dst = aligned_bytes(bytes);
  fill_pattern(src.get(), bytes, seed);
  std::memset(dst.get(), 0xEE, bytes);
  {
    IoFile f = io.open(path, IoOpen::read_write);
    io.write(f, offset, src.get(), bytes).wait();
  }
  const std::vector<std::byte> ref = pread_reference(path, offset, bytes);
  ASSERT_EQ(ref.size(), bytes) << path;
  ASSERT_TRUE(same(ref.data(), src.get(), bytes)) << "the file's bytes differ from those written, " << bytes << " at " << offset;
  IoFile f = io.open(path, IoOpen::read);
  io.read(f, offset, dst.get(), bytes).wait();
  ASSERT_TRUE(same(dst.get(), src.get(), bytes)) << "read back differs, " << bytes << " at " << offset;
}

TEST(IoEngine, ReadsBackWhatItWroteAtUnalignedSizes) {
  ScratchDir dir("sizes");
  IoOptions o;
  o.block_size = 64 * 1024;
  IoEngine io(o);
  const std::string path = dir.file("f.bin");
  { IoFile create = io.open(path, IoOpen::create); }
  std::uint32_t seed = 1;
  // Aligned offsets (4096 multiples), any size: the last partial block goes through the buffered
  // descriptor. Sizes around the alignment and the block size, and several blocks plus a tail.
  for (std::size_t bytes : {std::size_t{1}, std::size_t{511}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097}, std::size_t{65535},
                            std::size_t{65536}, std::size_t{65537}, std::size_t{3 * 65536 + 7}, std::size_t{1 << 20}})
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{4096}, std::uint64_t{1 << 20}}) round_trip(io, path, offset, bytes, seed++);
  // A write that ends the file at an unaligned size leaves it exactly that long.
  const std::string tail_path = dir.file("tail.bin");
  IoFile t = io.open(tail_path, IoOpen::create);
  auto src = aligned_bytes(10000);
  fill_pattern(src.get(), 10000, 99);
  io.write(t, 8192, src.get(), 10000).wait();
  EXPECT_EQ(t.size(), 18192u);
}

TEST(IoEngine, ManyRequestsInFlightAcrossRings) {
  ScratchDir dir("inflight");
  IoOptions o;
  o.block_size = 16 * 1024;
  o.queue_depth = 4;
  o.intra_op_parallelism = 3;
  IoEngine io(o);
  const std::string path = dir.file("f.bin");
  constexpr std::size_t kRequests = 200, kBytes = 40 * 1024 + 4096;  // 3 pieces each
  auto src = aligned_bytes(kRequests * kBytes);
  auto dst = aligned_bytes(kRequests * kBytes);
  fill_pattern(src.get(), kRequests * kBytes, 7);
  IoFile f = io.open(path, IoOpen::create);
  f.allocate(kRequests * kBytes);
  std::vector<IoHandle> writes;
  for (std::size_t i = 0; i < kRequests; ++i) writes.push_back(io.write(f, i * kBytes, src.get() + i * kBytes, kBytes));
  io.wait_all();
  for (const IoHandle& h : writes) EXPECT_TRUE(h.done());
  // Reads submitted in reverse order, all before any wait.
  std::vector<IoHandle> reads;
  for (std::size_t i = kRequests; i-- > 0;) reads.push_back(io.read(f, i * kBytes, dst.get() + i * kBytes, kBytes));
  for (const IoHandle& h : reads) h.wait();
  EXPECT_TRUE(same(dst.get(), src.get(), kRequests * kBytes));
  EXPECT_EQ(io.totals().pieces, 2 * kRequests * 3);
  const std::vector<std::byte> ref = pread_reference(path, 0, kRequests * kBytes);
  ASSERT_EQ(ref.size(), kRequests * kBytes);
  EXPECT_TRUE(same(ref.data(), src.get(), kRequests * kBytes));
}

// Every queue depth and block size of the config's range (aio.queue_depth 1..32768, block_size
// 1..1 GiB, sampled at its edges and around the alignment), with both submission modes: the data
// survives, and a request is cut into exactly the pieces the rule says (docs/offload.md §1.3).
TEST(IoEngine, EveryQueueDepthAndBlockSizeInTheConfigRange) {
  ScratchDir dir("sweep");
  const std::string path = dir.file("f.bin");
  constexpr std::size_t kBytes = 256 * 1024 + 4096 + 100;  // several blocks, an aligned rest, a tail
  auto src = aligned_bytes(kBytes);
  auto dst = aligned_bytes(kBytes);
  std::uint32_t seed = 11;
  const std::uint64_t blocks[] = {1, 512, 4095, 4096, 4097, 6000, 65536, 1 << 20, std::uint64_t{1} << 30};
  const unsigned depths[] = {1, 2, 3, 8, 31, 128, 32768};
  for (std::uint64_t block : blocks) {
    for (unsigned depth : depths) {
      for (int mode = 0; mode < 4; ++mode) {
        if (mode != 0 && depth != 3) continue;  // the submission modes at one depth keep the test quick
        IoOptions o;
        o.block_size = block;
        o.queue_depth = depth;
        o.single_submit = (mode & 1) != 0;
        o.overlap_events = (mode & 2) == 0;
        o.intra_op_parallelism = depth == 3 ? 2 : 1;
        SCOPED_TRACE(testing::Message() << "block_size " << block << " queue_depth " << depth << " single_submit " << o.single_submit
                                        << " overlap_events " << o.overlap_events);
        IoEngine io(o);
        fill_pattern(src.get(), kBytes, seed++);
        std::memset(dst.get(), 0, kBytes);
        IoFile f = io.open(path, IoOpen::create);
        io.write(f, 4096, src.get(), kBytes).wait();
        io.read(f, 4096, dst.get(), kBytes).wait();
        ASSERT_TRUE(same(dst.get(), src.get(), kBytes));
        // The rule, independently: blocks rounded up to 4096, capped at 1 GiB; the tail apart.
        const std::uint64_t eff = std::min<std::uint64_t>((block + 4095) / 4096 * 4096, std::uint64_t{1} << 30);
        const std::uint64_t aligned = kBytes / 4096 * 4096;
        const std::uint64_t pieces = (aligned + eff - 1) / eff + 1;
        EXPECT_EQ(io.totals().pieces, 2 * pieces);
      }
    }
  }
}

TEST(IoEngine, OptionsOutsideTheRangeNameTheAioKey) {
  const auto message = [](IoOptions o) {
    try {
      IoEngine io(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  IoOptions o;
  o.queue_depth = 0;
  EXPECT_NE(message(o).find("aio.queue_depth is 0"), std::string::npos) << message(o);
  o.queue_depth = IoOptions::kMaxQueueDepth + 1;
  EXPECT_NE(message(o).find("aio.queue_depth is 32769"), std::string::npos) << message(o);
  o = IoOptions{};
  o.intra_op_parallelism = 0;
  EXPECT_NE(message(o).find("aio.intra_op_parallelism is 0"), std::string::npos) << message(o);
  o.intra_op_parallelism = IoOptions::kMaxIntraOpParallelism + 1;
  EXPECT_NE(message(o).find("aio.intra_op_parallelism is 257"), std::string::npos) << message(o);
  // A piece moves at most 1 GiB: a larger block_size is refused, naming the range (it was capped silently).
  o = IoOptions{};
  o.block_size = std::uint64_t{1} << 40;
  EXPECT_NE(message(o).find("aio.block_size is 1099511627776: it must be 1 to 1073741824 bytes"), std::string::npos) << message(o);
}

TEST(IoEngine, RegisteredBuffersCarryTheTransfers) {
  ScratchDir dir("fixed");
  IoOptions o;
  o.intra_op_parallelism = 2;
  o.block_size = 128 * 1024;
  IoEngine io(o);
  PinnedHostAllocator host(/*lock=*/false);
  constexpr std::size_t kBytes = 1 << 20;  // within the default 8 MiB locked-memory limit
  auto* a = static_cast<std::byte*>(host.allocate(kBytes, MemoryPurpose::buffers));
  auto* b = static_cast<std::byte*>(host.allocate(kBytes, MemoryPurpose::buffers));
  if (!io.register_buffer(a, kBytes) || !io.register_buffer(b, kBytes)) {
    host.deallocate(a);
    host.deallocate(b);
    GTEST_SKIP() << "the kernel refused to register 1 MiB buffers here (ulimit -l too small)";
  }
  fill_pattern(a, kBytes, 5);
  IoFile f = io.open(dir.file("f.bin"), IoOpen::create);
  io.write(f, 0, a, kBytes).wait();
  // A sub-range of a registered buffer, at an offset inside it.
  io.read(f, 4096, b + 8192, kBytes - 8192).wait();
  EXPECT_TRUE(same(b + 8192, a + 4096, kBytes - 8192));
  io.unregister_buffer(a);
  io.unregister_buffer(b);
  io.read(f, 0, b, kBytes).wait();  // unregistered now: plain transfers
  EXPECT_TRUE(same(b, a, kBytes));
  host.deallocate(a);
  host.deallocate(b);
}

TEST(IoEngine, EndsCleanlyWithRequestsInFlightAndFilesOpen) {
  ScratchDir dir("end");
  auto src = aligned_bytes(8 << 20);
  fill_pattern(src.get(), 8 << 20, 3);
  std::vector<IoHandle> handles;
  IoFile survivor;
  {
    IoOptions o;
    o.block_size = 64 * 1024;
    IoEngine io(o);
    survivor = io.open(dir.file("f.bin"), IoOpen::create);
    for (int i = 0; i < 16; ++i) handles.push_back(io.write(survivor, std::uint64_t(i) << 20, src.get(), 512 * 1024));
  }  // the engine waits for its requests
  for (const IoHandle& h : handles) {
    EXPECT_TRUE(h.done());
    h.wait();
  }
  EXPECT_EQ(survivor.size(), (15u << 20) + 512 * 1024);
  survivor.close();
  EXPECT_FALSE(survivor.is_open());
}

}  // namespace
}  // namespace dstrain
