// NvmeStateStore (offload/nvme_state_store.h) against ResidentStateStore, the reference: the same
// sequence of acquire / update / release / prefetch gives the same values, bit for bit, with 1 to 4
// host buffers; the swap files have the size the formula says; an injected read error is named and
// nothing hangs.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "offload/nvme_state_store.h"
#include "offload/pinned_host_allocator.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using testing_io::ScratchDir;
namespace fs = std::filesystem;
const char* kKey = "zero_optimization.offload_optimizer.nvme_path";

StateStoreLayout layout_of(std::int64_t numel, std::int64_t sub_group) {
  StateStoreLayout l;
  l.numel = numel;
  l.names = {"master", "exp_avg", "exp_avg_sq"};
  l.groups = StateStoreLayout::cut(numel, sub_group);
  return l;
}

// One "step" over every group in order, prefetching the next, as the pipelined optimizer does —
// after the hint ModelStates gives while the forward and backward run (prefetch_step), twice, as
// the write-backs of the previous step finish between calls.
void step(StateStore& s, int t, bool prefetch) {
  const std::size_t groups = s.layout().groups.size();
  if (prefetch) {
    s.prefetch_step();
    s.prefetch_step();
  }
  for (std::size_t g = 0; g < groups; ++g) {
    if (prefetch && g + 1 < groups) s.prefetch(g + 1);
    std::span<const Tensor> v = s.acquire(g);
    for (std::size_t b = 0; b < v.size(); ++b) {
      float* x = static_cast<float*>(v[b].data);
      for (std::int64_t i = 0; i < v[b].numel(); ++i)
        x[i] = x[i] * 0.5f + static_cast<float>(t + 1) * static_cast<float>(b + 1) + static_cast<float>(i) * 1e-3f;
    }
    s.release(g, /*modified=*/true);
  }
  s.flush();
}

void expect_same(StateStore& a, StateStore& b) {
  for (std::size_t g = 0; g < a.layout().groups.size(); ++g) {
    std::span<const Tensor> va = a.acquire(g);
    std::span<const Tensor> vb = b.acquire(g);
    ASSERT_EQ(va.size(), vb.size());
    for (std::size_t k = 0; k < va.size(); ++k) {
      ASSERT_EQ(va[k].numel(), vb[k].numel());
      ASSERT_EQ(std::memcmp(va[k].data, vb[k].data, static_cast<std::size_t>(va[k].numel()) * 4), 0) << "group " << g << " buffer " << k;
    }
    a.release(g, false);
    b.release(g, false);
  }
}

TEST(NvmeStateStore, SameValuesAsTheResidentStoreForAnyBufferCount) {
  ScratchDir dir("nvmestore");
  IoEngine io;
  PinnedHostAllocator host(/*lock=*/false);
  CpuAllocator cpu;
  for (std::size_t slots : {1u, 2u, 3u, 4u}) {
    for (bool prefetch : {false, true}) {
      SCOPED_TRACE(testing::Message() << slots << " buffers, prefetch " << prefetch);
      const StateStoreLayout l = layout_of(10007, 1000);  // 11 groups, the last one short
      ResidentStateStore ref(l, cpu, StateHome::host);
      NvmeStateStore nvme(l, io, host, slots, dir.path.string(), kKey, "run", 0);
      for (int t = 0; t < 3; ++t) {
        step(ref, t, prefetch);
        step(nvme, t, prefetch && slots > 1);
      }
      expect_same(nvme, ref);
      // The files: the formula, independently — each group's fp32 bytes rounded up to 4096.
      std::uint64_t expected = 0;
      for (const FlatRange& r : l.groups) expected += (static_cast<std::uint64_t>(r.size()) * 4 + 4095) / 4096 * 4096;
      EXPECT_EQ(NvmeStateStore::file_bytes(l), expected);
      for (const char* name : {"master.swp", "exp_avg.swp", "exp_avg_sq.swp"})
        EXPECT_EQ(fs::file_size(nvme.folder().path() / name), expected) << name;
      EXPECT_EQ(nvme.bytes().nvme, 3 * expected);
      EXPECT_EQ(nvme.bytes().host, slots * 3 * 4096u);  // one 1000-element group padded, per buffer
      EXPECT_EQ(nvme.bytes().device, 0u);
    }
  }
  EXPECT_FALSE(fs::exists(dir.path / "dstrain_swap")) << "swap files left behind";
}

// pipeline_read / pipeline_write (DeepSpeed's keys): off, prefetch reads nothing and a release is
// on disk when it returns (checked with pread, not through the engine); on, prefetch reads ahead.
TEST(NvmeStateStore, PipelineReadAndWriteAsDeepSpeedMeansThem) {
  ScratchDir dir("nvmepipe");
  IoEngine io;
  PinnedHostAllocator host(/*lock=*/false);
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "pipelined" : "not pipelined");
    NvmeStateStore s(layout_of(4096, 1024), io, host, 3, dir.path.string(), kKey, "run", 0, NvmePipelining{on, on});
    const std::uint64_t before = io.totals().pieces;
    s.prefetch(1);
    EXPECT_EQ(io.totals().pieces - before, on ? 3u : 0u);
    std::span<const Tensor> v = s.acquire(2);
    static_cast<float*>(v[0].data)[5] = 42.0f;
    s.release(2, true);
    if (!on) {
      const auto bytes = testing_io::pread_reference((s.folder().path() / "master.swp").string(), 2 * 4096 + 5 * 4, 4);
      ASSERT_EQ(bytes.size(), 4u);
      float x = 0;
      std::memcpy(&x, bytes.data(), 4);
      EXPECT_EQ(x, 42.0f) << "release returned before the write-back reached the file";
    }
    s.flush();
  }
}

// Between steps (pipeline_read), prefetch_step reads the step's first sub-groups into every buffer
// whose I/O has finished, in visiting order, and nothing more; the step then finds them read.
TEST(NvmeStateStore, PrefetchStepReadsTheFirstSubGroupsIntoTheFreeBuffers) {
  ScratchDir dir("nvmeahead");
  IoEngine io;
  PinnedHostAllocator host(/*lock=*/false);
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "pipeline_read" : "no pipeline_read");
    // 6 groups of 1024 floats (one 4096-byte piece per buffer), 3 buffers, 4 slots.
    NvmeStateStore s(layout_of(6 * 1024, 1024), io, host, 4, dir.path.string(), kKey, "run", 0, NvmePipelining{on, on});
    step(s, 0, /*prefetch=*/false);  // every group written once; the slots hold groups 2-5
    const std::uint64_t before = io.totals().pieces;
    s.prefetch_step();
    EXPECT_EQ(io.totals().pieces - before, on ? 4u * 3u : 0u) << "groups 0-3, 3 buffers each";
    s.prefetch_step();  // nothing free: nothing more
    EXPECT_EQ(io.totals().pieces - before, on ? 4u * 3u : 0u);
    for (std::size_t g = 0; g < 4; ++g) {
      s.acquire(g);
      s.release(g, false);
    }
    EXPECT_EQ(io.totals().pieces - before, 4u * 3u) << "the step read again what was read ahead (or nothing was)";
    s.flush();
  }
}

// An allocator like CudaPinnedAllocator (ops/cuda/pinned_allocator.h): blocks aligned to 512
// bytes only, and larger alignments refused. Its blocks here are deliberately not 4096-aligned.
class Align512Allocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }
  std::size_t default_alignment() const override { return 512; }

 protected:
  void* raw_allocate(std::size_t bytes, std::size_t alignment) override {
    if (alignment > 512) throw Error("Align512Allocator: alignment above 512 refused");
    auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 512 + 4095) / 4096 * 4096));
    return p == nullptr ? nullptr : p + 512;
  }
  void raw_deallocate(void* ptr, std::size_t, std::size_t) override { std::free(static_cast<std::byte*>(ptr) - 512); }
};

TEST(NvmeStateStore, WorksWithHostMemoryAlignedTo512Only) {
  ScratchDir dir("nvme512");
  IoEngine io;
  Align512Allocator host;
  CpuAllocator cpu;
  const StateStoreLayout l = layout_of(5000, 1000);
  ResidentStateStore ref(l, cpu, StateHome::host);
  NvmeStateStore nvme(l, io, host, 2, dir.path.string(), kKey, "run", 0);
  for (int t = 0; t < 2; ++t) {
    step(ref, t, true);
    step(nvme, t, true);
  }
  expect_same(nvme, ref);
}

TEST(NvmeStateStore, TooManyAcquiredAndInjectedReadErrorsAreNamed) {
  ScratchDir dir("nvmestorebad");
  IoEngine io;
  PinnedHostAllocator host(/*lock=*/false);
  NvmeStateStore s(layout_of(4096, 1024), io, host, 2, dir.path.string(), kKey, "run", 0);
  s.acquire(0);
  s.acquire(1);
  try {
    s.acquire(2);
    ADD_FAILURE() << "a third acquire with 2 buffers succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("buffer_count"), std::string::npos) << e.what();
  }
  s.release(0, true);
  s.release(1, false);
  s.flush();
  io.inject_fault(IoFault::parse("eio:read@2"));  // group 2's second buffer (exp_avg)
  try {
    s.acquire(2);
    ADD_FAILURE() << "the injected read error was not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("exp_avg.swp"), std::string::npos) << m;
    EXPECT_NE(m.find("offset 8192"), std::string::npos) << m;
    EXPECT_NE(m.find("Input/output error"), std::string::npos) << m;
  }
  io.inject_fault(std::nullopt);
  s.acquire(2);  // the store goes on: the failed read was forgotten and is read again
  s.release(2, false);
}

// The swap files pad every sub-group to 4096 bytes per state: sub_group_size 1 made 39 GB of swap
// for 38 MB of state. The plan says both before anything is made, and a layout whose swap exceeds
// 2x the state (plus a page per file) is refused naming sub_group_size and a value that fits.
TEST(NvmeStateStore, APaddingDominatedLayoutIsRefusedBeforeAnyFileNamingSubGroupSize) {
  const NvmeSwapPlan tiny = NvmeSwapPlan::of(layout_of(3000, 1));
  EXPECT_EQ(tiny.state_bytes, 3000u * 4 * 3);
  EXPECT_EQ(tiny.swap_bytes, 3000u * 4096 * 3);  // one page per element and state
  EXPECT_EQ(tiny.groups, 3000u);
  EXPECT_FALSE(tiny.fits());
  const NvmeSwapPlan half_page = NvmeSwapPlan::of(layout_of(8192, 512));  // 2048 bytes padded to 4096: exactly 2x
  EXPECT_EQ(half_page.swap_bytes, 2 * half_page.state_bytes);
  EXPECT_TRUE(half_page.fits());
  EXPECT_TRUE(NvmeSwapPlan::of(layout_of(10, 1000)).fits());       // a tiny model: one partial page per file
  EXPECT_FALSE(NvmeSwapPlan::of(layout_of(100000, 256)).fits());   // 1024 bytes a page: 4x
  EXPECT_EQ(NvmeSwapPlan::of(layout_of(100000, 1024)).swap_bytes,  // whole pages: no padding
            100000u / 1024 * 4096 * 3 + (100000u % 1024 * 4 + 4095) / 4096 * 4096 * 3);

  ScratchDir dir("nvmestoreplan");
  IoEngine io;
  PinnedHostAllocator host(/*lock=*/false);
  try {
    NvmeStateStore s(layout_of(3000, 1), io, host, 2, dir.path.string(), kKey, "run", 0);
    ADD_FAILURE() << "a layout of 3000 one-element sub-groups was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("zero_optimization.sub_group_size"), std::string::npos) << m;
    EXPECT_NE(m.find("at least 1024"), std::string::npos) << m;
    EXPECT_NE(m.find("3000 sub-group(s)"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir.path / "dstrain_swap")) << "files made before the refusal";
  NvmeStateStore ok(layout_of(4096, 1024), io, host, 2, dir.path.string(), kKey, "run", 0);
  EXPECT_NE(ok.describe().find("NVMe swap: 3 file(s)"), std::string::npos) << ok.describe();
  EXPECT_NE(ok.describe().find("4 sub-group(s) of at most 1024 elements"), std::string::npos) << ok.describe();
}

}  // namespace
}  // namespace dstrain
