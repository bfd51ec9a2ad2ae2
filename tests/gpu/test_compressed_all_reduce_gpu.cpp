// all_to_all and compressed_all_reduce on device memory (label gpu): W = 2, 3, 4 local ranks
// sharing one GPU. The device path (buffers copied to the host for the arithmetic, the bits through
// device memory: a workspace, as NCCL needs) must give exactly the bits of the host path on the same
// inputs, call after call, errors included; the host path is tested against DeepSpeed's algorithm
// in tests/unit/zero/test_compressed_all_reduce.cpp. Skipped, with the reason, without a GPU.
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "device_buf.h"
#include "gpu_test.h"
#include "tests/unit/zero/comm_test_util.h"
#include "zero/local_communicator.h"

using namespace dstrain;
using dstrain::testing_comm::DeviceBuf;
using dstrain::testing_comm::HostBuf;

namespace {

HostBuf random_fp32(int rank, int call, std::int64_t n) {
  HostBuf h(DType::fp32, n);
  std::mt19937 gen(static_cast<unsigned>(977 * rank + 31 * call + 5));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::int64_t i = 0; i < n; ++i) h.set(i, i % 9 == 0 ? 0.0 : d(gen));
  return h;
}

TEST(CompressedAllReduceGpu, DeviceBuffersGiveTheHostBits) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  constexpr int kCalls = 3;
  for (int w : {2, 3, 4}) {
    const std::int64_t chunk = 8 * 37, n = chunk * w;
    run_local_ranks(w, [&](Communicator& c) {
      const int r = c.rank();
      HostBuf hwe(DType::fp32, n), hse(DType::fp32, chunk);
      for (std::int64_t i = 0; i < n; ++i) hwe.set(i, 0.0);
      for (std::int64_t i = 0; i < chunk; ++i) hse.set(i, 0.0);
      DeviceBuf dwe(hwe), dse(hse), ws(DType::int32, c.compressed_workspace_numel(n));
      for (int k = 0; k < kCalls; ++k) {
        HostBuf hx = random_fp32(r, k, n);
        DeviceBuf dx(hx);
        c.compressed_all_reduce(hx.tensor(), hwe.tensor(), hse.tensor());
        c.compressed_all_reduce(dx.tensor(), dwe.tensor(), dse.tensor(), ws.tensor());
        const HostBuf got = dx.to_host();
        for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got.bits(i), hx.bits(i)) << "W " << w << " rank " << r << " call " << k << " i " << i;
      }
      const HostBuf we = dwe.to_host(), se = dse.to_host();
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(we.bits(i), hwe.bits(i)) << "worker error " << i;
      for (std::int64_t i = 0; i < chunk; ++i) ASSERT_EQ(se.bits(i), hse.bits(i)) << "server error " << i;
    });
  }
}

TEST(CompressedAllReduceGpu, AllToAllOnDeviceMemory) {
  DSTRAIN_SKIP_WITHOUT_GPU();
  for (int w : {2, 4}) {
    const std::int64_t n = 5;
    run_local_ranks(w, [&](Communicator& c) {
      const int r = c.rank();
      HostBuf send(DType::int32, w * n);
      for (std::int64_t i = 0; i < w * n; ++i) send.set(i, r * 1000 + i);
      DeviceBuf ds(send), dr(DType::int32, w * n);
      c.all_to_all(ds.tensor(), dr.tensor());
      c.synchronize();
      const HostBuf got = dr.to_host();
      for (int i = 0; i < w; ++i)
        for (std::int64_t k = 0; k < n; ++k) EXPECT_EQ(got.get(i * n + k), i * 1000 + r * n + k);
    });
  }
}

}  // namespace
