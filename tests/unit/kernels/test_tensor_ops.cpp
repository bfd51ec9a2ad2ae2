// ops/kernels/tensor_ops.h on the CPU: the residual add rounds once from the exact fp32 sum,
// convert_tensor rounds to nearest even (ties to even at the 16-bit boundary), copy_tensor and
// zero_tensor, and the argument errors. The CUDA versions are checked against these in
// tests/gpu/test_tensor_ops_gpu.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

using namespace dstrain;
using dstrain::test::Buf;

namespace {

// a + b where the exact sum needs more than 16 bits: 1 + 2^-9 + 2^-12 is between bf16 neighbours
// 1 + 2^-8·k; the result must be the RNE of the fp32 sum, not the sum of rounded halves.
TEST(TensorOps, ResidualRoundsTheFp32SumOnce) {
  for (const DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    Buf a(t, 3), b(t, 3), out(t, 3);
    const double av[3] = {1.0, -2.5, 1e-3}, bv[3] = {0.00390625 + 0.000244140625, 0.75, -3e-3};
    for (int i = 0; i < 3; ++i) {
      a.set(i, av[i]);
      b.set(i, bv[i]);
    }
    residual_forward(out.tensor(Shape{3}), a.tensor(Shape{3}), b.tensor(Shape{3}));
    for (int i = 0; i < 3; ++i) {
      Buf want(t, 1);
      want.set(0, static_cast<double>(static_cast<float>(a.get(i)) + static_cast<float>(b.get(i))));
      EXPECT_EQ(out.get(i), want.get(0)) << dtype_name(t) << " element " << i;
    }
    // In place: out aliases a.
    residual_forward(a.tensor(Shape{3}), a.tensor(Shape{3}), b.tensor(Shape{3}));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a.get(i), out.get(i));
  }
}

TEST(TensorOps, ConvertRoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between the bf16 values 1 and 1 + 2^-7: ties go to even (1);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
  std::vector<float> src{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f, 65520.0f, 1e-3f};
  Buf bf(DType::bf16, 5), fp(DType::fp16, 5);
  convert_tensor(bf.tensor(Shape{5}), Tensor(src.data(), DType::fp32, Shape{5}));
  convert_tensor(fp.tensor(Shape{5}), Tensor(src.data(), DType::fp32, Shape{5}));
  EXPECT_EQ(bf.get(0), 1.0);
  EXPECT_EQ(bf.get(1), 1.0 + 0x1p-6);
  EXPECT_TRUE(std::signbit(bf.get(2)));
  EXPECT_TRUE(std::isinf(fp.get(3)));  // 65520 rounds past fp16's largest finite value (65504)
  EXPECT_NEAR(fp.get(4), 1e-3, 1e-3 * 0x1p-11);
  // And back: fp16 -> fp32 is exact.
  std::vector<float> back(5);
  convert_tensor(Tensor(back.data(), DType::fp32, Shape{5}), fp.tensor(Shape{5}));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back[static_cast<std::size_t>(i)], static_cast<float>(fp.get(i)));
}

TEST(TensorOps, CopyAndZero) {
  std::vector<std::int32_t> a{1, 2, 3, 4}, b(4, 9);
  copy_tensor(Tensor(b.data(), DType::int32, Shape{2, 2}), Tensor(a.data(), DType::int32, Shape{4}));  // shapes may differ
  EXPECT_EQ(b, a);
  zero_tensor(Tensor(b.data(), DType::int32, Shape{4}));
  EXPECT_EQ(b, (std::vector<std::int32_t>{0, 0, 0, 0}));
}

TEST(TensorOps, BadArgumentsAreErrors) {
  std::vector<float> f(4);
  std::vector<std::int32_t> i(4);
  // dtype or count mismatch
  EXPECT_THROW(copy_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4})), Error);
  EXPECT_THROW(copy_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(f.data() + 1, DType::fp32, Shape{3})), Error);
  // token ids are never converted
  EXPECT_THROW(convert_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4})), Error);
  EXPECT_THROW(residual_forward(Tensor(i.data(), DType::int32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4})),
               Error);
  // a device this machine has no kernels for, or no GPU: an Error, not a crash
  try {
    convert_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(i.data(), DType::bf16, Shape{4}, Device::cuda(0)));
    ADD_FAILURE() << "mixed devices accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
  }
}

}  // namespace
