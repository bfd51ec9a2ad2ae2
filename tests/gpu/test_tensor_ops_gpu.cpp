// ops/kernels/tensor_ops.h on the GPU against the CPU backend, bit for bit (each is one fp32
// operation and one RNE rounding per element on both): residual add and convert in every dtype,
// zero fill, and copies host -> device -> device -> host.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "device_tensors.h"
#include "gpu_test.h"
#include "ops/kernels/tensor_ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

using namespace dstrain;
using dstrain::test::Buf;
using dstrain::test::DeviceTensors;

namespace {

constexpr std::int64_t kN = 100'003;  // not a multiple of any block size

Buf random_buf(DType t, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 3.0);
  Buf b(t, kN);
  for (std::int64_t i = 0; i < kN; ++i) b.set(i, nd(rng));
  return b;
}

void expect_same_bytes(Buf& got, Buf& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), static_cast<std::size_t>(got.size()) * dtype_size(got.dtype())), 0)
      << what << " " << dtype_name(got.dtype());
}

class TensorOpsGpu : public ::testing::Test {
 protected:
  void SetUp() override { DSTRAIN_SKIP_WITHOUT_GPU(); }
};

TEST_F(TensorOpsGpu, ResidualMatchesTheCpuBitForBit) {
  for (const DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    DeviceTensors g;
    Buf a = random_buf(t, 1), b = random_buf(t, 2), want(t, kN);
    residual_forward(want.tensor(Shape{kN}), a.tensor(Shape{kN}), b.tensor(Shape{kN}));
    const Tensor da = g.put(a, Shape{kN}), db = g.put(b, Shape{kN});
    residual_forward(da, da, db);  // in place, as the layers use it
    Buf got = DeviceTensors::get(da);
    expect_same_bytes(got, want, "residual_forward");
  }
}

TEST_F(TensorOpsGpu, ConvertMatchesTheCpuBitForBit) {
  for (const DType from : {DType::fp32, DType::fp16, DType::bf16}) {
    for (const DType to : {DType::fp32, DType::fp16, DType::bf16}) {
      DeviceTensors g;
      Buf src = random_buf(from, 3), want(to, kN), zeros(to, kN);
      convert_tensor(want.tensor(Shape{kN}), src.tensor(Shape{kN}));
      const Tensor ds = g.put(src, Shape{kN}), dd = g.put(zeros, Shape{kN});
      convert_tensor(dd, ds);
      Buf got = DeviceTensors::get(dd);
      expect_same_bytes(got, want, "convert_tensor");
    }
  }
}

TEST_F(TensorOpsGpu, CopiesAndZeroFill) {
  DeviceTensors g;
  Buf src = random_buf(DType::bf16, 4), zeros(DType::bf16, kN);
  const Tensor d1 = g.put(src, Shape{kN}), d2 = g.put(zeros, Shape{kN});
  copy_tensor(d2, d1);  // device -> device
  Buf back = DeviceTensors::get(d2);
  expect_same_bytes(back, src, "device-to-device copy");
  zero_tensor(d2);
  Buf z = DeviceTensors::get(d2);
  expect_same_bytes(z, zeros, "zero_tensor");
}

// copy_rows on the device (one cudaMemcpy2DAsync) against the CPU's, bit for bit: the strided
// packing of Ulysses' all-to-alls (models/sequence_parallel.cpp).
TEST_F(TensorOpsGpu, CopyRowsMatchesTheCpu) {
  DeviceTensors g;
  Buf src = random_buf(DType::bf16, 5), zeros(DType::bf16, kN);
  const Tensor ds = g.put(src, Shape{kN}), dd = g.put(zeros, Shape{kN});
  Buf want(DType::bf16, kN);
  for (std::int64_t i = 0; i < kN; ++i) want.set(i, 0.0);
  const Tensor hs(src.data(), DType::bf16, Shape{kN}), hd(want.data(), DType::bf16, Shape{kN});
  // 97 rows of 301 elements, read every 1000 from offset 7, written every 512 from offset 3.
  copy_rows(dd, 3, 512, ds, 7, 1000, 97, 301);
  copy_rows(hd, 3, 512, hs, 7, 1000, 97, 301);
  Buf got = DeviceTensors::get(dd);
  expect_same_bytes(got, want, "copy_rows");
}

}  // namespace
