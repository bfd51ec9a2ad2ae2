// CudaAllocator: statistics (hand-worked sequence, and equal to the CPU allocator's), alignment,
// real device memory, misuse, OOM, the cache (reuse, empty_cache, OOM flush). CudaPinnedAllocator
// and CudaCopyStream round trips.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu_test.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/kernels/copy_stream.h"
#include "ops/cuda/copy_stream.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_allocator.h"
#include "ops/cuda/pinned_allocator.h"
#include "ops/error.h"

using namespace dstrain;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

// Same script as the CPU test: per-purpose peaks 100/200/50 while the total peaks at 300.
TEST(CudaAllocator, ScriptedSequence) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  EXPECT_EQ(a.device(), Device::cuda(0));
  void* p1 = a.allocate(100, MemoryPurpose::params);
  void* g = a.allocate(200, MemoryPurpose::grads);
  a.deallocate(p1);
  void* act = a.allocate(50, MemoryPurpose::activations);
  void* p2 = a.allocate(30, MemoryPurpose::params);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s[MemoryPurpose::params].current, 30u);
  EXPECT_EQ(s[MemoryPurpose::params].peak, 100u);
  EXPECT_EQ(s[MemoryPurpose::grads].peak, 200u);
  EXPECT_EQ(s[MemoryPurpose::activations].current, 50u);
  EXPECT_EQ(s.total.current, 280u);
  EXPECT_EQ(s.total.peak, 300u);
  EXPECT_EQ(s.total.allocations, 4u);
  EXPECT_EQ(s.total.frees, 1u);
  for (void* p : {g, act, p2}) a.deallocate(p);
  EXPECT_EQ(a.stats().total.current, 0u);
  EXPECT_EQ(a.stats().total.frees, 4u);
}

TEST(CudaAllocator, DeviceMemoryAlignedAndUsable) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  void* p = a.allocate(1 << 20, MemoryPurpose::buffers);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0u);
  cudaPointerAttributes attr{};
  DSTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, 0);
  DSTRAIN_CUDA_CHECK(cudaMemset(p, 0x5a, 1 << 20));
  unsigned char last = 0;
  DSTRAIN_CUDA_CHECK(cudaMemcpy(&last, static_cast<char*>(p) + (1 << 20) - 1, 1, cudaMemcpyDeviceToHost));
  EXPECT_EQ(last, 0x5a);
  EXPECT_THROW(a.allocate(64, MemoryPurpose::buffers, 4096), Error);  // cudaMalloc gives 256 only
  EXPECT_EQ(a.allocate(0, MemoryPurpose::buffers), nullptr);
  a.deallocate(p);
  EXPECT_EQ(a.stats().total.current, 0u);
}

TEST(CudaAllocator, MisuseAndOutOfMemory) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  void* p = a.allocate(4096, MemoryPurpose::params);
  a.deallocate(p);
  EXPECT_THROW(a.deallocate(p), Error);
  int host = 0;
  EXPECT_THROW(a.deallocate(&host), Error);
  void* held = a.allocate(1000, MemoryPurpose::grads);
  try {
    a.allocate(std::size_t{1} << 50, MemoryPurpose::activations);  // 1 PiB
    ADD_FAILURE() << "1 PiB allocation succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "out of cuda:0 memory")) << msg;
    EXPECT_TRUE(contains(msg, "1125899906842624 bytes")) << msg;
    EXPECT_TRUE(contains(msg, "for activations")) << msg;
    EXPECT_TRUE(contains(msg, "grads 1000 B")) << msg;
    EXPECT_TRUE(contains(msg, "free of")) << msg;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the OOM left no error behind
  a.deallocate(held);
  EXPECT_EQ(a.stats().total.current, 0u);
}

TEST(CudaAllocator, ThreadsAndBuffers) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, t] {
      std::vector<Buffer> live;
      for (int i = 0; i < 200; ++i) {
        live.emplace_back(a, static_cast<std::size_t>(1 + (i * 37 + t) % 100000), MemoryPurpose::activations);
        if (i % 3 == 2) live.erase(live.begin());
      }
    });
  }
  for (auto& th : threads) th.join();
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.total.current, 0u);
  EXPECT_EQ(s.total.allocations, 800u);
  EXPECT_EQ(s.total.frees, 800u);
  Buffer b(a, 1024, MemoryPurpose::params);
  const Tensor t = b.tensor(DType::bf16, Shape{512});
  EXPECT_EQ(t.device, Device::cuda(0));
  EXPECT_THROW(b.tensor(DType::fp32, Shape{512}), Error);
}

// ---- the cache ----

// A freed block is reused for the same size without cudaMalloc; the per-step transient pattern
// stops calling cudaMalloc / cudaFree after the first step.
TEST(CudaAllocator, CachingReuse) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  void* p = a.allocate(1 << 20, MemoryPurpose::buffers);
  const std::uint64_t mallocs = a.cuda_malloc_calls();
  EXPECT_EQ(mallocs, 1u);
  a.deallocate(p);
  EXPECT_EQ(a.cuda_free_calls(), 0u);
  EXPECT_GT(a.cached_bytes(), 0u);
  void* q = a.allocate(1 << 20, MemoryPurpose::grads);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.cuda_malloc_calls(), mallocs);
  EXPECT_EQ(a.cache_hits(), 1u);
  a.deallocate(q);

  // Transient buffers of a "step", allocated and freed in the same order every step.
  const std::vector<std::size_t> sizes = {4 << 20, 300, 96 << 20, 64 << 10, 12 << 20, 1 << 20, 7};
  std::uint64_t after_first = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<Buffer> held;
    for (std::size_t s : sizes) held.emplace_back(a, s, MemoryPurpose::buffers);
    held.clear();
    if (step == 0) after_first = a.cuda_malloc_calls();
  }
  EXPECT_EQ(a.cuda_malloc_calls(), after_first);
  EXPECT_EQ(a.cuda_free_calls(), 0u);
  EXPECT_EQ(a.stats().total.current, 0u);
  EXPECT_GE(a.reserved_bytes(), std::size_t{96} << 20);
}

// The per-purpose statistics are those of the CPU allocator for the same sequence: the cache
// (rounding, reserved bytes) is invisible in them.
TEST(CudaAllocator, StatsEqualTheCpuAllocators) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator gpu(0);
  CpuAllocator cpu;
  std::vector<std::pair<void*, void*>> live;
  std::uint64_t x = 88172645463325252ull;  // xorshift: the same sequence on both
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || next() % 100 < 55) {
      const auto purpose = kAllMemoryPurposes[next() % kNumMemoryPurposes];
      const std::size_t bytes = 1 + next() % (next() % 8 == 0 ? (std::size_t{24} << 20) : (std::size_t{256} << 10));
      live.emplace_back(gpu.allocate(bytes, purpose), cpu.allocate(bytes, purpose));
    } else {
      const std::size_t k = next() % live.size();
      gpu.deallocate(live[k].first);
      cpu.deallocate(live[k].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    if (i % 500 == 250) {
      gpu.reset_peaks();
      cpu.reset_peaks();
    }
  }
  const MemoryStats g = gpu.stats(), c = cpu.stats();
  for (MemoryPurpose p : kAllMemoryPurposes) {
    EXPECT_EQ(g[p].current, c[p].current) << memory_purpose_name(p);
    EXPECT_EQ(g[p].peak, c[p].peak) << memory_purpose_name(p);
    EXPECT_EQ(g[p].allocations, c[p].allocations) << memory_purpose_name(p);
    EXPECT_EQ(g[p].frees, c[p].frees) << memory_purpose_name(p);
  }
  EXPECT_EQ(g.total.current, c.total.current);
  EXPECT_EQ(g.total.peak, c.total.peak);
  EXPECT_GE(gpu.reserved_bytes(), g.total.current);
  for (auto& [gp, cp] : live) {
    gpu.deallocate(gp);
    cpu.deallocate(cp);
  }
}

TEST(CudaAllocator, EmptyCache) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  void* kept = a.allocate(1000, MemoryPurpose::params);  // its 2 MiB segment stays
  void* big = a.allocate(std::size_t{64} << 20, MemoryPurpose::buffers);
  void* small = a.allocate(5000, MemoryPurpose::buffers);
  a.deallocate(big);
  a.deallocate(small);
  EXPECT_EQ(a.reserved_bytes(), (std::size_t{64} << 20) + (std::size_t{2} << 20));
  EXPECT_EQ(a.empty_cache(), std::size_t{64} << 20);
  EXPECT_EQ(a.reserved_bytes(), std::size_t{2} << 20);
  EXPECT_EQ(a.cuda_free_calls(), 1u);
  DSTRAIN_CUDA_CHECK(cudaMemset(kept, 1, 1000));  // the live block is untouched and usable
  DSTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  a.deallocate(kept);
  EXPECT_EQ(a.empty_cache(), std::size_t{2} << 20);
  EXPECT_EQ(a.reserved_bytes(), 0u);
  EXPECT_EQ(a.stats().total.current, 0u);
}

// Out of memory frees the cache first (cudaFree of the unused segments), retries once, then
// reports with the base class's message and what the pool reserves.
TEST(CudaAllocator, OutOfMemoryFreesTheCacheFirst) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator a(0);
  void* held = a.allocate(1000, MemoryPurpose::grads);
  a.deallocate(a.allocate(std::size_t{256} << 20, MemoryPurpose::buffers));  // 256 MiB cached
  EXPECT_EQ(a.reserved_bytes(), (std::size_t{256} << 20) + (std::size_t{2} << 20));
  try {
    a.allocate(std::size_t{1} << 50, MemoryPurpose::activations);
    ADD_FAILURE() << "1 PiB allocation succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "out of cuda:0 memory")) << msg;
    EXPECT_TRUE(contains(msg, "for activations")) << msg;
    EXPECT_TRUE(contains(msg, "grads 1000 B")) << msg;
    EXPECT_TRUE(contains(msg, "reserves 2.00 MiB from CUDA")) << msg;
    EXPECT_TRUE(contains(msg, "free of")) << msg;
  }
  EXPECT_EQ(a.pool_stats().cache_flushes, 1u);
  EXPECT_EQ(a.cuda_free_calls(), 1u);
  EXPECT_EQ(a.reserved_bytes(), std::size_t{2} << 20);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // Still usable after the failure.
  void* p = a.allocate(std::size_t{8} << 20, MemoryPurpose::buffers);
  DSTRAIN_CUDA_CHECK(cudaMemset(p, 0, std::size_t{8} << 20));
  a.deallocate(p);
  a.deallocate(held);
}

// ---- pinned host memory ----

TEST(CudaPinnedAllocator, RoundTripThroughTheGpu) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaPinnedAllocator pinned(0);
  CudaAllocator dev(0);
  EXPECT_EQ(pinned.device(), Device::cpu());
  constexpr std::size_t n = std::size_t{3} << 20;
  Buffer src(pinned, n, MemoryPurpose::activations);
  Buffer back(pinned, n, MemoryPurpose::activations);
  Buffer d(dev, n, MemoryPurpose::activations);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(src.data()) % CudaPinnedAllocator::kDefaultAlignment, 0u);
  cudaPointerAttributes attr{};
  DSTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attr, src.data()));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);  // page-locked, known to CUDA
  auto* s = static_cast<unsigned char*>(src.data());
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<unsigned char>(i * 31 + 7);
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(d.data(), src.data(), n, cudaMemcpyHostToDevice, nullptr));
  DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(back.data(), d.data(), n, cudaMemcpyDeviceToHost, nullptr));
  DSTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
  const auto* b = static_cast<const unsigned char*>(back.data());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < n; ++i) mismatches += b[i] != s[i];
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(pinned.stats()[MemoryPurpose::activations].current, 2 * n);
  // Cached: freeing and allocating the same size pins nothing new.
  const std::uint64_t calls = pinned.cuda_host_alloc_calls();
  void* first = src.data();
  src.reset();
  Buffer again(pinned, n, MemoryPurpose::activations);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pinned.cuda_host_alloc_calls(), calls);
  EXPECT_THROW(pinned.allocate(64, MemoryPurpose::buffers, 4096), Error);
}

// ---- the copy stream (activation checkpointing, offload) ----

TEST(CudaCopyStream, RoundTripDeviceHostDevice) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator dev(0);
  CudaPinnedAllocator pinned(0);
  const std::unique_ptr<CopyStream> t = make_copy_stream(Device::cuda(0), "test");
  ASSERT_NE(dynamic_cast<CudaCopyStream*>(t.get()), nullptr);
  const Shape shape{4, 64, 1024};
  const std::size_t bytes = static_cast<std::size_t>(shape.numel()) * sizeof(float);
  Buffer a(dev, bytes, MemoryPurpose::activations), b(dev, bytes, MemoryPurpose::activations);
  Buffer host(pinned, bytes, MemoryPurpose::activations);
  const Tensor ta = a.tensor(DType::fp32, shape), tb = b.tensor(DType::fp32, shape), th = host.tensor(DType::fp32, shape);
  std::vector<float> want(static_cast<std::size_t>(shape.numel()));
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i) * 0.5f - 3.0f;
  DSTRAIN_CUDA_CHECK(cudaMemcpy(a.data(), want.data(), bytes, cudaMemcpyHostToDevice));
  DSTRAIN_CUDA_CHECK(cudaMemset(b.data(), 0, bytes));

  const CopyStream::Ticket down = t->to_host(th, ta);
  EXPECT_GT(down, 0u);
  t->wait(down);
  // Issued after the wait on the compute stream: must not change what the copy read.
  DSTRAIN_CUDA_CHECK(cudaMemsetAsync(a.data(), 0xff, bytes, nullptr));
  const CopyStream::Ticket up = t->to_device(tb, th);
  t->wait(up);
  std::vector<float> got(want.size());
  DSTRAIN_CUDA_CHECK(cudaMemcpy(got.data(), b.data(), bytes, cudaMemcpyDeviceToHost));  // legacy stream: after the wait
  EXPECT_EQ(got, want);
  t->synchronize();
  EXPECT_EQ(t->synchronizations(), 1u);
  EXPECT_EQ(0, std::memcmp(host.data(), want.data(), bytes));
  EXPECT_EQ(t->bytes_to_host(), bytes);
  EXPECT_EQ(t->bytes_to_device(), bytes);

  // Many tickets (more than the event ring): old tickets still wait correctly.
  std::vector<CopyStream::Ticket> tickets;
  for (std::size_t i = 0; i < 3 * CudaCopyStream::kEvents; ++i) tickets.push_back(t->to_host(th, tb));
  for (auto tk : tickets) t->wait(tk);
  t->wait(0);
  EXPECT_THROW(t->wait(tickets.back() + 1), Error);
  // Misuse: dtype or size mismatch, sides swapped.
  EXPECT_THROW(t->to_host(host.tensor(DType::fp16, shape), ta), Error);
  EXPECT_THROW(t->to_host(ta, th), Error);
  EXPECT_THROW(t->to_device(th, ta), Error);
  t->synchronize();
}

// Pageable host memory works too (slower: the device-to-host copy blocks the host).
TEST(CudaCopyStream, PageableHostMemory) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator dev(0);
  CudaCopyStream t(0);
  std::vector<float> host(1000, 0.0f), want(1000);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i);
  Buffer a(dev, sizeof(float) * 1000, MemoryPurpose::activations);
  DSTRAIN_CUDA_CHECK(cudaMemcpy(a.data(), want.data(), sizeof(float) * 1000, cudaMemcpyHostToDevice));
  const Tensor ta = a.tensor(DType::fp32, Shape{1000});
  const Tensor th{host.data(), DType::fp32, Shape{1000}, Device::cpu()};
  t.wait(t.to_host(th, ta));
  t.synchronize();
  EXPECT_EQ(host, want);
}

// wait_host: the host may read a to_host destination, or overwrite a to_device source, once it
// returns — with no device synchronize. The copy also sees compute-stream work queued before it.
TEST(CudaCopyStream, WaitHostLetsTheHostUseItsSideOfTheCopy) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  CudaAllocator dev(0);
  CudaPinnedAllocator pinned(0);
  CudaCopyStream t(0);
  const std::int64_t n = 16 << 20;  // 64 MiB of fp32: long enough that a missing wait is seen
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  Buffer a(dev, bytes, MemoryPurpose::buffers), b(dev, bytes, MemoryPurpose::buffers);
  Buffer host(pinned, bytes, MemoryPurpose::buffers);
  const Tensor ta = a.tensor(DType::fp32, Shape{n}), tb = b.tensor(DType::fp32, Shape{n}), th = host.tensor(DType::fp32, Shape{n});
  std::memset(host.data(), 0, bytes);
  DSTRAIN_CUDA_CHECK(cudaMemsetAsync(a.data(), 0x3f, bytes, nullptr));  // compute stream: 0x3f3f3f3f
  const CopyStream::Ticket down = t.to_host(th, ta);
  t.wait_host(down);
  const auto* h = static_cast<const unsigned char*>(host.data());
  EXPECT_EQ(h[0], 0x3f);
  EXPECT_EQ(h[bytes - 1], 0x3f);
  // to_device, wait_host, then overwrite the source: the device keeps what was sent.
  std::memset(host.data(), 0x11, bytes);
  const CopyStream::Ticket up = t.to_device(tb, th);
  t.wait_host(up);
  std::memset(host.data(), 0x22, bytes);
  t.wait(up);
  std::vector<unsigned char> got(bytes);
  DSTRAIN_CUDA_CHECK(cudaMemcpy(got.data(), b.data(), bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got.front(), 0x11);
  EXPECT_EQ(got.back(), 0x11);
  EXPECT_EQ(std::count(got.begin(), got.end(), 0x11), static_cast<std::ptrdiff_t>(bytes));
  t.wait_host(0);
  EXPECT_THROW(t.wait_host(up + 1), Error);
  EXPECT_EQ(t.synchronizations(), 0u);
}
