// LocalCommunicator on device memory (label gpu): W ranks as threads sharing one GPU. Every
// collective, dtype and op, W = 2, 3 and 4, out of place and in place, gives exactly the bits the
// same collective gives on host copies of the same inputs through the same LocalCommunicator (the
// host path is the reference, tested against independent expectations in
// tests/unit/zero/test_local_collectives.cpp). Inputs are random across magnitudes, so the fp32
// accumulation order and the single 16-bit rounding matter, with inf, −inf, NaN, ±0 and
// subnormals mixed in. One exception: a NaN that a sum creates (inf − inf, NaN + x) has the
// hardware's bits, which differ between x86 and the GPU; there both results must be NaN.
// Plus: stream ordering under load (producers before, a write-after-read overwrite right after
// the call), a split's pairs on device memory, a send/recv ring on device memory, device mismatch
// between ranks (collectives and send/recv), and a host pointer labelled cuda. Skipped, with the
// reason, without a GPU.
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "device_buf.h"
#include "gpu_test.h"
#include "ops/cuda/cuda_check.h"
#include "ops/error.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::DeviceBuf;
using dstrain::testing_comm::HostBuf;
using ::testing::HasSubstr;

namespace {

// Rank r's inputs: reproducible, random sign and magnitude over many binades (the sums round),
// with ~2% special values. int32: the full range (sums wrap).
HostBuf random_inputs(int rank, DType dt, std::int64_t n, std::uint32_t salt) {
  HostBuf h(dt, n);
  std::mt19937 gen(1234u + 7919u * static_cast<std::uint32_t>(rank) + salt);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-20, 12), pick(0, 99);
  std::uniform_int_distribution<std::int32_t> any_int(INT32_MIN, INT32_MAX);
  const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1e-40f, -3e-39f, 65504.0f, 3.0e38f};
  for (std::int64_t i = 0; i < n; ++i) {
    if (dt == DType::int32) {
      const std::int32_t k = any_int(gen);
      std::memcpy(h.at(i), &k, 4);
      continue;
    }
    const int p = pick(gen);
    float v = std::ldexp(mant(gen), expo(gen)) * (pick(gen) < 50 ? -1.0f : 1.0f);
    if (p < 2) v = specials[static_cast<std::size_t>(pick(gen)) % std::size(specials)];
    h.set(i, v);
  }
  return h;
}

bool is_nan_bits(DType dt, std::uint64_t b) {
  switch (dt) {
    case DType::fp32:
      return (b & 0x7fffffffu) > 0x7f800000u;
    case DType::fp16:
      return (b & 0x7fffu) > 0x7c00u;
    case DType::bf16:
      return (b & 0x7fffu) > 0x7f80u;
    default:
      return false;
  }
}

enum class Kind { all_reduce, reduce_scatter, all_gather, broadcast };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce:
      return "all_reduce";
    case Kind::reduce_scatter:
      return "reduce_scatter";
    case Kind::all_gather:
      return "all_gather";
    case Kind::broadcast:
      return "broadcast";
  }
  return "?";
}

struct Case {
  Kind kind;
  int world;
  DType dtype;
  ReduceOp op;
  std::int64_t n;  // all_reduce/broadcast: the buffer; reduce_scatter: recv; all_gather: send
  bool in_place;
  int root;
};

std::string describe(const Case& c) {
  return fmt::format("{} W={} {} {} n={}{} root {}", kind_name(c.kind), c.world, dtype_name(c.dtype), reduce_op_name(c.op), c.n,
                     c.in_place ? " in place" : "", c.root);
}

// Runs the case on W local ranks, on the host (device = false) or on the GPU, from the same
// inputs; returns each rank's result buffer (all_reduce/broadcast: the buffer; reduce_scatter:
// recv; all_gather: recv).
std::vector<HostBuf> run_case(const Case& c, bool device) {
  const std::int64_t full = static_cast<std::int64_t>(c.world) * c.n;
  const std::int64_t in_n = c.kind == Kind::reduce_scatter ? full : c.kind == Kind::all_gather && c.in_place ? full : c.n;
  std::vector<HostBuf> inputs, results(static_cast<std::size_t>(c.world));
  for (int r = 0; r < c.world; ++r) inputs.push_back(random_inputs(r, c.dtype, in_n, static_cast<std::uint32_t>(c.n)));
  run_local_ranks(c.world, [&](Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    HostBuf host_in = inputs[r];  // the host run works on copies: inputs stay for the device run
    HostBuf host_out(c.dtype, c.kind == Kind::all_gather ? full : c.n);
    std::optional<DeviceBuf> dev_in, dev_out;
    Tensor in_t = host_in.tensor(), out_t = host_out.tensor();
    if (device) {
      dev_in.emplace(host_in);
      dev_out.emplace(host_out);
      in_t = dev_in->tensor();
      out_t = dev_out->tensor();
    }
    switch (c.kind) {
      case Kind::all_reduce:
        comm.all_reduce(in_t, c.op);
        break;
      case Kind::broadcast:
        comm.broadcast(in_t, c.root);
        break;
      case Kind::reduce_scatter:
        comm.reduce_scatter(in_t, c.in_place ? shard_of(in_t, comm.rank(), c.world) : out_t, c.op);
        break;
      case Kind::all_gather:
        comm.all_gather(c.in_place ? shard_of(in_t, comm.rank(), c.world) : in_t, c.in_place ? in_t : out_t);
        break;
    }
    comm.synchronize();
    HostBuf got = device ? (c.kind == Kind::all_reduce || c.kind == Kind::broadcast || c.in_place ? dev_in : dev_out)->to_host()
                         : (c.kind == Kind::all_reduce || c.kind == Kind::broadcast || c.in_place ? host_in : host_out);
    if (c.kind == Kind::reduce_scatter && c.in_place) {  // the rank's shard of its send buffer
      HostBuf shard(c.dtype, c.n);
      if (c.n > 0) std::memcpy(shard.at(0), got.at(static_cast<std::int64_t>(r) * c.n), static_cast<std::size_t>(c.n) * dtype_size(c.dtype));
      got = shard;
    }
    results[r] = got;
  });
  return results;
}

void expect_same(const Case& c) {
  const std::vector<HostBuf> want = run_case(c, false), got = run_case(c, true);
  const bool sum_like = (c.kind == Kind::all_reduce || c.kind == Kind::reduce_scatter) && c.op != ReduceOp::max;
  for (int r = 0; r < c.world; ++r) {
    const HostBuf& w = want[static_cast<std::size_t>(r)];
    const HostBuf& g = got[static_cast<std::size_t>(r)];
    ASSERT_EQ(w.n, g.n) << describe(c);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < w.n && bad < 5; ++i) {
      const std::uint64_t wb = w.bits(i), gb = g.bits(i);
      if (wb == gb) continue;
      if (sum_like && is_nan_bits(c.dtype, wb) && is_nan_bits(c.dtype, gb)) continue;  // NaN made by arithmetic
      ++bad;
      ADD_FAILURE() << describe(c) << ": rank " << r << " element " << i << ": host bits 0x" << std::hex << wb << " (" << w.get(i)
                    << "), device bits 0x" << gb << std::dec << " (" << g.get(i) << ")";
    }
  }
}

constexpr DType kDtypes[] = {DType::fp32, DType::fp16, DType::bf16, DType::int32};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};
// 1, 1003 (no W divides it: uneven all-reduce chunks), 70001 (many blocks of the kernel's grid).
constexpr std::int64_t kSizes[] = {1, 1003, 70001};

class LocalCommGpu : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommGpu, AllReduceMatchesHost) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kDtypes)
    for (const ReduceOp op : kOps) {
      if (dt == DType::int32 && op == ReduceOp::avg) continue;  // not defined for int32
      for (const std::int64_t n : kSizes) expect_same({Kind::all_reduce, GetParam(), dt, op, n, false, 0});
    }
}

TEST_P(LocalCommGpu, ReduceScatterMatchesHost) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kDtypes)
    for (const ReduceOp op : kOps) {
      if (dt == DType::int32 && op == ReduceOp::avg) continue;
      for (const std::int64_t n : kSizes)
        for (const bool in_place : {false, true}) expect_same({Kind::reduce_scatter, GetParam(), dt, op, n, in_place, 0});
    }
}

TEST_P(LocalCommGpu, AllGatherMatchesHost) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kDtypes)
    for (const std::int64_t n : kSizes)
      for (const bool in_place : {false, true}) expect_same({Kind::all_gather, GetParam(), dt, ReduceOp::sum, n, in_place, 0});
}

TEST_P(LocalCommGpu, BroadcastMatchesHost) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (const DType dt : kDtypes)
    for (const int root : {0, GetParam() - 1})
      for (const std::int64_t n : kSizes) expect_same({Kind::broadcast, GetParam(), dt, ReduceOp::sum, n, false, root});
}

std::string world_name(const ::testing::TestParamInfo<int>& p) { return fmt::format("W{}", p.param); }
INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommGpu, ::testing::Values(2, 3, 4), world_name);

// Ordering on the shared legacy stream, under load: each rank's producer (a memset of a large
// buffer) is enqueued just before the collective, and an overwrite of its send buffer right after
// it returns (a write-after-read against the other ranks' copies). Every gathered shard must hold
// its rank's value of that iteration, never the overwrite.
TEST(LocalCommGpuOrdering, ProducersBeforeAndOverwritesAfterTheCollective) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 4;
  constexpr std::int64_t kN = std::int64_t{8} << 20;  // 8 MiB per shard (uint8 viewed as 2M fp32)
  constexpr int kIters = 20;
  run_local_ranks(kWorld, [&](Communicator& comm) {
    DeviceBuf send(DType::fp32, kN / 4), recv(DType::fp32, kWorld * kN / 4);
    std::vector<unsigned char> host(static_cast<std::size_t>(kWorld * kN));
    for (int it = 0; it < kIters; ++it) {
      const int value = 1 + (it * kWorld + comm.rank()) % 250;
      DSTRAIN_CUDA_CHECK(cudaMemsetAsync(send.ptr, value, send.bytes(), cudaStreamLegacy));
      comm.all_gather(send.tensor(), recv.tensor());
      DSTRAIN_CUDA_CHECK(cudaMemsetAsync(send.ptr, 0xFF, send.bytes(), cudaStreamLegacy));
      comm.synchronize();
      DSTRAIN_CUDA_CHECK(cudaMemcpy(host.data(), recv.ptr, host.size(), cudaMemcpyDeviceToHost));
      for (int q = 0; q < kWorld; ++q) {
        const int want = 1 + (it * kWorld + q) % 250;
        for (std::int64_t i = 0; i < kN; i += 4099)
          ASSERT_EQ(host[static_cast<std::size_t>(q * kN + i)], want)
              << "iteration " << it << " rank " << comm.rank() << " shard " << q << " byte " << i;
        ASSERT_EQ(host[static_cast<std::size_t>(q * kN + kN - 1)], want) << "iteration " << it << " shard " << q << " last byte";
      }
    }
  });
}

// An all-reduce right after each rank's producer, and a reader of the result (a device copy) right
// after the call: part of the result is written by the other rank's kernel, which must be queued
// before this rank returns. The sum of W memset patterns, checked from the host every iteration;
// the next iteration's memset overwrites a buffer the other rank's kernel reads (no barrier).
TEST(LocalCommGpuOrdering, AllReduceSeesEveryProducer) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 2;
  constexpr std::int64_t kN = std::int64_t{4} << 20;  // int32 elements
  run_local_ranks(kWorld, [&](Communicator& comm) {
    DeviceBuf buf(DType::int32, kN), copy(DType::int32, kN);
    std::vector<std::int32_t> host(static_cast<std::size_t>(kN));
    for (int it = 0; it < 10; ++it) {
      // Each byte = it + rank + 1: the int32 is that byte repeated 4 times.
      DSTRAIN_CUDA_CHECK(cudaMemsetAsync(buf.ptr, it + comm.rank() + 1, buf.bytes(), cudaStreamLegacy));
      comm.all_reduce(buf.tensor(), ReduceOp::sum);
      DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(copy.ptr, buf.ptr, buf.bytes(), cudaMemcpyDeviceToDevice, cudaStreamLegacy));
      DSTRAIN_CUDA_CHECK(cudaMemcpy(host.data(), copy.ptr, copy.bytes(), cudaMemcpyDeviceToHost));
      std::int32_t want = 0;
      for (int r = 0; r < kWorld; ++r) {
        const std::uint32_t b = static_cast<std::uint32_t>(it + r + 1);
        want = static_cast<std::int32_t>(static_cast<std::uint32_t>(want) + (b | b << 8 | b << 16 | b << 24));
      }
      for (std::int64_t i = 0; i < kN; i += 997) ASSERT_EQ(host[static_cast<std::size_t>(i)], want) << "iteration " << it << " element " << i;
      ASSERT_EQ(host.back(), want) << "iteration " << it;
    }
  });
}

// A split on device memory: 4 ranks on one GPU in pairs whose keys reverse them; each pair's
// all-reduce and all-gather on the GPU against sums and shards the test computes from the pairs'
// members (small integers: exact). The child is a LocalCommunicator of the same kind.
TEST(LocalCommGpuSplit, PairsCommunicateDeviceMemory) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 4;
  constexpr std::int64_t kN = 1003;
  std::vector<HostBuf> sums(kWorld), gathered(kWorld);
  std::vector<int> child_rank(kWorld, -1);
  run_local_ranks(kWorld, [&](Communicator& comm) {
    const int r = comm.rank();
    std::unique_ptr<Communicator> pair = comm.split(r / 2, -r);
    child_rank[static_cast<std::size_t>(r)] = pair->rank();
    HostBuf h(DType::fp32, kN);
    for (std::int64_t i = 0; i < kN; ++i) h.set(i, static_cast<double>(r * 1000 + i % 97));
    DeviceBuf d(h), all(DType::fp32, 2 * kN);
    pair->all_reduce(d.tensor(), ReduceOp::sum);
    DeviceBuf mine(h);
    pair->all_gather(mine.tensor(), all.tensor());
    pair->synchronize();
    sums[static_cast<std::size_t>(r)] = d.to_host();
    gathered[static_cast<std::size_t>(r)] = all.to_host();
  });
  for (int r = 0; r < kWorld; ++r) {
    const int partner = r ^ 1;
    const int hi = (r / 2) * 2 + 1, lo = (r / 2) * 2;  // the pair's order: the higher rank first (keys -r)
    EXPECT_EQ(child_rank[static_cast<std::size_t>(r)], r == hi ? 0 : 1) << "rank " << r;
    for (std::int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(sums[static_cast<std::size_t>(r)].get(i), static_cast<double>(r * 1000 + partner * 1000 + 2 * (i % 97))) << "rank " << r << " " << i;
      ASSERT_EQ(gathered[static_cast<std::size_t>(r)].get(i), static_cast<double>(hi * 1000 + i % 97)) << "rank " << r << " " << i;
      ASSERT_EQ(gathered[static_cast<std::size_t>(r)].get(kN + i), static_cast<double>(lo * 1000 + i % 97)) << "rank " << r << " " << i;
    }
  }
}

// Point-to-point on device memory: a ring of 3 ranks on one GPU (even ranks send first), each
// send buffer written by a memset queued just before the send and overwritten right after it
// returns (the write-after-read the receiver's queued copy must win), the received buffer read
// from the host after synchronize(). Every iteration's values are the sender's of that iteration.
TEST(LocalCommGpuPointToPoint, RingOnDeviceMemoryIsOrderedOnTheStream) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 3;
  constexpr std::int64_t kN = std::int64_t{1} << 20;  // bytes, viewed as int32
  run_local_ranks(kWorld, [&](Communicator& comm) {
    const int r = comm.rank(), next = (r + 1) % kWorld, prev = (r + kWorld - 1) % kWorld;
    DeviceBuf out(DType::int32, kN / 4), in(DType::int32, kN / 4);
    std::vector<unsigned char> host(static_cast<std::size_t>(kN));
    for (int it = 0; it < 10; ++it) {
      DSTRAIN_CUDA_CHECK(cudaMemsetAsync(out.ptr, 1 + (it * kWorld + r) % 250, out.bytes(), cudaStreamLegacy));
      if (r % 2 == 0) {
        comm.send(out.tensor(), next);
        DSTRAIN_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xFF, out.bytes(), cudaStreamLegacy));
        comm.recv(in.tensor(), prev);
      } else {
        comm.recv(in.tensor(), prev);
        comm.send(out.tensor(), next);
        DSTRAIN_CUDA_CHECK(cudaMemsetAsync(out.ptr, 0xFF, out.bytes(), cudaStreamLegacy));
      }
      comm.synchronize();
      DSTRAIN_CUDA_CHECK(cudaMemcpy(host.data(), in.ptr, host.size(), cudaMemcpyDeviceToHost));
      const int want = 1 + (it * kWorld + prev) % 250;
      for (std::int64_t i = 0; i < kN; i += 4099)
        ASSERT_EQ(host[static_cast<std::size_t>(i)], want) << "iteration " << it << " rank " << r << " byte " << i;
      ASSERT_EQ(host.back(), want) << "iteration " << it << " rank " << r;
    }
    EXPECT_EQ(comm.stats().bytes_sent(CollectiveKind::send), 10u * static_cast<std::uint64_t>(kN));
  });
}

std::string run_expecting_error(int world, const std::function<void(Communicator&)>& fn) {
  try {
    run_local_ranks(world, fn, std::chrono::milliseconds(10'000));
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LocalCommGpuFailures, RanksOnDifferentDevicesFailNamingBoth) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  HostBuf host(DType::fp32, 16);
  const std::string err = run_expecting_error(2, [&](Communicator& c) {
    DeviceBuf dev(DType::fp32, 16);
    c.all_reduce(c.rank() == 0 ? dev.tensor() : host.tensor(), ReduceOp::sum);
  });
  EXPECT_THAT(err, HasSubstr("rank 0's buffers are on cuda:0 but rank 1's on cpu"));
}

TEST(LocalCommGpuFailures, SendAndRecvOnDifferentDevicesFailNamingBoth) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  HostBuf host(DType::fp32, 16);
  const std::string err = run_expecting_error(2, [&](Communicator& c) {
    DeviceBuf dev(DType::fp32, 16);
    if (c.rank() == 0) {
      c.send(dev.tensor(), 1);
    } else {
      c.recv(host.tensor(), 0);
    }
  });
  EXPECT_THAT(err, HasSubstr("rank 0's buffer is on cuda:0 but rank 1's (recv #1 from rank 0 on rank 1 (fp32, 16 elements)) on cpu"));
}

TEST(LocalCommGpuFailures, HostPointerLabelledCudaIsRejected) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  HostBuf host(DType::fp32, 16);
  const std::string err = run_expecting_error(1, [&](Communicator& c) {
    c.all_reduce(Tensor(host.tensor().data, DType::fp32, Shape{16}, Device::cuda(0)), ReduceOp::sum);
  });
  EXPECT_THAT(err, HasSubstr("is not device memory of cuda:0"));
}

}  // namespace
