// ops/kernels/tensor_ops.h on the CPU: the residual add rounds once from the exact fp32 sum,
// convert_tensor rounds to nearest even (ties to even at the 16-bit boundary), copy_tensor and
// zero_tensor, and the argument errors. The CUDA versions are checked against these in
// tests/gpu/test_tensor_ops_gpu.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
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

// Host copies of a MiB and more are split over the OpenMP threads (ops/cpu/tensor_ops.cpp). Each
// must equal a byte-by-byte copy at any thread count, at sizes that are no multiple of the split's
// page-aligned blocks, from and to addresses off any alignment, without writing past either end;
// and overlapping tensors keep memmove's result.
TEST(TensorOps, LargeCopiesEqualAByteByByteCopyAtEveryThreadCount) {
  const int saved = omp_get_max_threads();
  for (const std::size_t elements : {std::size_t{3} << 18, (std::size_t{1} << 19) + 3, (std::size_t{5} << 19) + 1}) {  // 1.5, 1 + 6 B, 5 MiB + 2 B
    const std::size_t bytes = elements * 2;
    std::vector<std::uint8_t> src(bytes + 7), dst(bytes + 64);
    std::uint32_t x = 12345;
    for (auto& b : src) b = static_cast<std::uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::fill(dst.begin(), dst.end(), std::uint8_t{0xEE});
      copy_tensor(Tensor(dst.data() + 30, DType::uint16, Shape{static_cast<std::int64_t>(elements)}),
                  Tensor(src.data() + 5, DType::uint16, Shape{static_cast<std::int64_t>(elements)}));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < bytes; ++i) wrong += dst[30 + i] != src[5 + i];
      for (std::size_t i = 0; i < 30; ++i) wrong += dst[i] != 0xEE;
      for (std::size_t i = 30 + bytes; i < dst.size(); ++i) wrong += dst[i] != 0xEE;
      EXPECT_EQ(wrong, 0u) << bytes << " bytes on " << threads << " thread(s)";
      // Overlapping, either way round: what memmove gives.
      for (const std::ptrdiff_t shift : {std::ptrdiff_t{6}, std::ptrdiff_t{-6}}) {
        std::vector<std::uint8_t> buf(src.begin(), src.end()), want(src.begin(), src.end());
        const std::size_t from = shift > 0 ? 0 : 6, to = static_cast<std::size_t>(static_cast<std::ptrdiff_t>(from) + shift);
        const std::size_t n = bytes - 2;
        std::vector<std::uint8_t> moved(want.begin() + static_cast<std::ptrdiff_t>(from), want.begin() + static_cast<std::ptrdiff_t>(from + n));
        std::copy(moved.begin(), moved.end(), want.begin() + static_cast<std::ptrdiff_t>(to));
        copy_tensor(Tensor(buf.data() + to, DType::uint16, Shape{static_cast<std::int64_t>(n / 2)}),
                    Tensor(buf.data() + from, DType::uint16, Shape{static_cast<std::int64_t>(n / 2)}));
        EXPECT_TRUE(buf == want) << "overlapping copy of " << n << " bytes shifted by " << shift << " on " << threads << " thread(s)";
      }
    }
  }
  omp_set_num_threads(saved);
}

TEST(TensorOps, BadArgumentsAreErrors) {
  std::vector<float> f(4);
  std::vector<std::int32_t> i(4);
  // dtype or count mismatch
  EXPECT_THROW(copy_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4})), Error);
  EXPECT_THROW(copy_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(f.data() + 1, DType::fp32, Shape{3})), Error);
  // token ids are never converted
  EXPECT_THROW(convert_tensor(Tensor(f.data(), DType::fp32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4})), Error);
  EXPECT_THROW(residual_forward(Tensor(i.data(), DType::int32, Shape{4}), Tensor(i.data(), DType::int32, Shape{4}),
                                Tensor(i.data(), DType::int32, Shape{4})),
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

namespace {

// The naive definition of copy_rows: element by element.
void copy_rows_naive(std::vector<std::int32_t>& dst, std::int64_t dst_offset, std::int64_t dst_pitch, const std::vector<std::int32_t>& src,
                     std::int64_t src_offset, std::int64_t src_pitch, std::int64_t rows, std::int64_t width) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < width; ++k)
      dst[static_cast<std::size_t>(dst_offset + r * dst_pitch + k)] = src[static_cast<std::size_t>(src_offset + r * src_pitch + k)];
}

}  // namespace

// copy_rows (what packs Ulysses' all-to-alls): every (rows, width, offsets, pitches) of a small
// grid against the element-by-element definition, the untouched elements included; rows outside
// either tensor and pitches narrower than a row are Errors, never a write out of bounds.
TEST(TensorOps, CopyRowsEqualsTheNaiveDefinition) {
  std::vector<std::int32_t> src(200);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::int32_t>(1000 + i);
  for (std::int64_t rows : {0, 1, 3, 7})
    for (std::int64_t width : {1, 4, 5})
      for (std::int64_t src_pitch : {width, width + 3})
        for (std::int64_t dst_pitch : {width, width + 2})
          for (std::int64_t src_offset : {0, 2})
            for (std::int64_t dst_offset : {0, 1}) {
              std::vector<std::int32_t> got(120, -1), want(120, -1);
              copy_rows(Tensor(got.data(), DType::int32, Shape{120}), dst_offset, dst_pitch, Tensor(src.data(), DType::int32, Shape{200}), src_offset,
                        src_pitch, rows, width);
              copy_rows_naive(want, dst_offset, dst_pitch, src, src_offset, src_pitch, rows, width);
              EXPECT_EQ(got, want) << rows << " rows of " << width << ", pitches " << dst_pitch << "/" << src_pitch << ", offsets " << dst_offset
                                   << "/" << src_offset;
            }
  std::vector<std::int32_t> small(10);
  const Tensor t(small.data(), DType::int32, Shape{10}), s(src.data(), DType::int32, Shape{200});
  EXPECT_THROW(copy_rows(t, 0, 4, s, 0, 4, 3, 4), Error);  // 2·4 + 4 = 12 elements > 10
  EXPECT_THROW(copy_rows(t, 0, 2, s, 0, 4, 2, 4), Error);  // pitch narrower than a row
  EXPECT_THROW(copy_rows(t, 0, 4, Tensor(src.data(), DType::fp32, Shape{200}), 0, 4, 1, 4), Error);  // dtypes differ
}
