// The reductions of every backward (and the forward rows) are split so that no result depends on
// how many threads ran: same bits with 1 thread and with 2 (shapes large enough to go parallel).
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/encoder.h"
#include "ops/kernels/layernorm.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/rmsnorm.h"
#include "ops/kernels/softmax_cross_entropy.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

// Runs `run` (which resets and fills `outs`) with 1 and with 2 threads; expects identical bytes.
void expect_thread_count_invariant(const std::function<void()>& run, const std::vector<Buf*>& outs) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run();
  std::vector<std::vector<double>> one;
  for (Buf* b : outs) one.push_back(b->values());
  omp_set_num_threads(2);
  run();
  omp_set_num_threads(saved);
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const auto two = outs[k]->values();
    ASSERT_EQ(one[k].size(), two.size());
    EXPECT_EQ(std::memcmp(one[k].data(), two.data(), two.size() * sizeof(double)), 0) << "output " << k << " differs between 1 and 2 threads";
  }
}

}  // namespace

class DeterminismTest : public ::testing::TestWithParam<DType> {};

TEST_P(DeterminismTest, LayernormBackward) {
  const DType dt = GetParam();
  const std::int64_t B = 4, T = 64, C = 200;
  std::mt19937_64 rng(81);
  Buf x(dt, B * T * C), w(dt, C), b(dt, C), g(dt, B * T * C), dx(dt, B * T * C), dw(dt, C), db(dt, C), y(dt, B * T * C);
  for (Buf* p : {&x, &w, &b, &g}) p->fill_uniform(rng, -1, 1);
  std::vector<float> mean(static_cast<std::size_t>(B * T)), rstd(mean.size());
  Tensor tm(mean.data(), DType::fp32, Shape{B, T}), tr(rstd.data(), DType::fp32, Shape{B, T});
  expect_thread_count_invariant(
      [&] {
        dx.fill(0);
        dw.fill(0);
        db.fill(0);
        layernorm_forward(y.tensor({B, T, C}), tm, tr, x.tensor({B, T, C}), w.tensor({C}), b.tensor({C}));
        layernorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), db.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}), tm, tr);
      },
      {&y, &dx, &dw, &db});
}

TEST_P(DeterminismTest, RmsnormBackward) {
  const DType dt = GetParam();
  const std::int64_t B = 4, T = 64, C = 200;
  std::mt19937_64 rng(85);
  Buf x(dt, B * T * C), w(dt, C), g(dt, B * T * C), dx(dt, B * T * C), dw(dt, C), y(dt, B * T * C);
  for (Buf* p : {&x, &w, &g}) p->fill_uniform(rng, -1, 1);
  std::vector<float> rstd(static_cast<std::size_t>(B * T));
  Tensor tr(rstd.data(), DType::fp32, Shape{B, T});
  expect_thread_count_invariant(
      [&] {
        dx.fill(0);
        dw.fill(0);
        rmsnorm_forward(y.tensor({B, T, C}), tr, x.tensor({B, T, C}), w.tensor({C}));
        rmsnorm_backward(dx.tensor({B, T, C}), dw.tensor({C}), g.tensor({B, T, C}), x.tensor({B, T, C}), w.tensor({C}), tr);
      },
      {&y, &dx, &dw});
}

TEST_P(DeterminismTest, EncoderBackward) {
  const DType dt = GetParam();
  const std::int64_t B = 4, T = 64, C = 160, V = 37;
  std::mt19937_64 rng(82);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(B * T));
  std::uniform_int_distribution<std::int32_t> d(0, V - 1);
  for (auto& t : tok) t = d(rng);
  Buf g(dt, B * T * C), dwte(dt, V * C), dwpe(dt, T * C);
  g.fill_uniform(rng, -1, 1);
  std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, V));
  expect_thread_count_invariant(
      [&] {
        dwte.fill(0);
        dwpe.fill(0);
        encoder_backward(dwte.tensor({V, C}), dwpe.tensor({T, C}), g.tensor({B, T, C}), Tensor(tok.data(), DType::int32, Shape{B, T}),
                         Tensor(scratch.data(), DType::int32, Shape{static_cast<std::int64_t>(scratch.size())}));
      },
      {&dwte, &dwpe});
}

TEST_P(DeterminismTest, MatmulBackward) {
  const DType dt = GetParam();
  const std::int64_t BT = 300, C = 70, OC = 270;
  std::mt19937_64 rng(83);
  Buf x(dt, BT * C), w(dt, OC * C), g(dt, BT * OC), dx(dt, BT * C), dw(dt, OC * C), db(dt, OC);
  for (Buf* p : {&x, &w, &g}) p->fill_uniform(rng, -1, 1);
  std::vector<float> scratch(matmul_scratch_elems(dt, C));
  Tensor s(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())});
  expect_thread_count_invariant(
      [&] {
        dx.fill(0);
        dw.fill(0);
        db.fill(0);
        matmul_backward(dx.tensor({BT, C}), dw.tensor({OC, C}), db.tensor({OC}), g.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), s);
      },
      {&db});  // dinp/dweight come from OpenBLAS, whose own threading is outside our control
}

TEST_P(DeterminismTest, AttentionForwardBackward) {
  const DType dt = GetParam();
  const std::int64_t B = 2, T = 40, C = 64, NH = 4;
  std::mt19937_64 rng(84);
  Buf qkv(dt, B * T * 3 * C), out(dt, B * T * C), g(dt, B * T * C), dqkv(dt, B * T * 3 * C);
  qkv.fill_uniform(rng, -1, 1);
  g.fill_uniform(rng, -1, 1);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
  const DropoutParams dp{0.1f, RngKey{3, 4, 5, 6, 0}};
  expect_thread_count_invariant(
      [&] {
        dqkv.fill(0);
        attention_forward(out.tensor({B, T, C}), Tensor(lse.data(), DType::fp32, Shape{B, NH, T}), qkv.tensor({B, T, 3 * C}), NH, dp);
        attention_backward(dqkv.tensor({B, T, 3 * C}), g.tensor({B, T, C}), qkv.tensor({B, T, 3 * C}), out.tensor({B, T, C}),
                           Tensor(lse.data(), DType::fp32, Shape{B, NH, T}), NH,
                           Tensor(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())}), dp);
      },
      {&out, &dqkv});
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, DeterminismTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);
