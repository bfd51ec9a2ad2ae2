// Matmul against naive double loops, finite differences, determinism and argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "matmul_cases.h"
#include "ops/kernels/matmul.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

Tol scaled(Tol t, std::int64_t K) { return Tol{t.atol * std::sqrt(static_cast<double>(K)), t.rtol}; }

}  // namespace

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, ForwardBackwardMatchReference) {
  const DType dt = GetParam();
  const Tol tol = kMatmulTols.of(dt);
  std::mt19937_64 rng(41);
  for (const MatmulCase& c : kMatmulCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t BT = c.BT, C = c.C, OC = c.OC;
    Buf x(dt, BT * C), w(dt, OC * C), b(dt, OC), y(dt, BT * OC), g(dt, BT * OC), dx(dt, BT * C), dw(dt, OC * C), db(dt, OC);
    for (Buf* p : {&x, &w, &b, &g, &dx, &dw, &db}) p->fill_uniform(rng, -1, 1);
    std::vector<float> scratch(matmul_scratch_elems(dt, C));
    Tensor s(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())});
    const auto xv = x.values(), wv = w.values(), bv = b.values(), gv = g.values();
    auto want_dx = dx.values(), want_dw = dw.values(), want_db = db.values();
    matmul_forward(y.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), c.bias ? b.tensor({OC}) : Tensor(), s);
    matmul_backward(dx.tensor({BT, C}), dw.tensor({OC, C}), c.bias ? db.tensor({OC}) : Tensor(), g.tensor({BT, OC}), x.tensor({BT, C}),
                    w.tensor({OC, C}), s);
    std::vector<double> want_y(static_cast<std::size_t>(BT * OC));
    for (std::int64_t i = 0; i < BT; ++i)
      for (std::int64_t o = 0; o < OC; ++o) {
        double acc = c.bias ? bv[static_cast<std::size_t>(o)] : 0.0;
        for (std::int64_t k = 0; k < C; ++k) acc += xv[static_cast<std::size_t>(i * C + k)] * wv[static_cast<std::size_t>(o * C + k)];
        want_y[static_cast<std::size_t>(i * OC + o)] = acc;
        const double gg = gv[static_cast<std::size_t>(i * OC + o)];
        for (std::int64_t k = 0; k < C; ++k) {
          want_dx[static_cast<std::size_t>(i * C + k)] += gg * wv[static_cast<std::size_t>(o * C + k)];
          want_dw[static_cast<std::size_t>(o * C + k)] += gg * xv[static_cast<std::size_t>(i * C + k)];
        }
        if (c.bias) want_db[static_cast<std::size_t>(o)] += gg;
      }
    expect_close(y, want_y, scaled(tol, C), "matmul out " + dtype_label(dt));
    expect_close(dx, want_dx, scaled(tol, OC), "matmul dinp " + dtype_label(dt));
    expect_close(dw, want_dw, scaled(tol, BT), "matmul dweight " + dtype_label(dt));
    expect_close(db, want_db, scaled(tol, BT), "matmul dbias " + dtype_label(dt));
  }
}

TEST_P(MatmulTest, SkippedGradientsStayUntouched) {
  const DType dt = GetParam();
  std::mt19937_64 rng(42);
  const std::int64_t BT = 4, C = 6, OC = 5;
  Buf x(dt, BT * C), w(dt, OC * C), g(dt, BT * OC), dw(dt, OC * C);
  for (Buf* p : {&x, &w, &g}) p->fill_uniform(rng, -1, 1);
  dw.fill(0.5);
  std::vector<float> scratch(matmul_scratch_elems(dt, C) + 1);
  Tensor s(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())});
  Buf dx(dt, BT * C);
  dx.fill(0.25);
  matmul_backward(dx.tensor({BT, C}), Tensor(), Tensor(), g.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), s);
  for (std::int64_t i = 0; i < OC * C; ++i) EXPECT_EQ(dw.get(i), 0.5);
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, MatmulTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Matmul, FiniteDifferences) {
  std::mt19937_64 rng(43);
  const std::int64_t BT = 3, C = 4, OC = 5;
  Buf x(DType::fp32, BT * C), w(DType::fp32, OC * C), b(DType::fp32, OC), y(DType::fp32, BT * OC), g(DType::fp32, BT * OC), dx(DType::fp32, BT * C),
      dw(DType::fp32, OC * C), db(DType::fp32, OC);
  for (Buf* p : {&x, &w, &b}) p->fill_uniform(rng, -1, 1);
  const auto proj = random_vec(rng, static_cast<std::size_t>(BT * OC));
  for (std::int64_t i = 0; i < BT * OC; ++i) g.set(i, proj[static_cast<std::size_t>(i)]);
  matmul_backward(dx.tensor({BT, C}), dw.tensor({OC, C}), db.tensor({OC}), g.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), Tensor());
  auto loss = [&] {
    matmul_forward(y.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), b.tensor({OC}), Tensor());
    double l = 0;
    for (std::int64_t i = 0; i < BT * OC; ++i) l += proj[static_cast<std::size_t>(i)] * y.get(i);
    return l;
  };
  auto probe = [&](Buf& p, Buf& grad, const char* name) {
    for (std::int64_t i = 0; i < p.size(); ++i) {
      const double fd = central_difference(static_cast<float*>(p.data()), i, 1e-2, loss);
      EXPECT_NEAR(grad.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << name << " " << i;
    }
  };
  probe(x, dx, "dinp");
  probe(w, dw, "dweight");
  probe(b, db, "dbias");
}

TEST(Matmul, BadArgumentsNameTheOpAndShapes) {
  Buf x(DType::fp32, 12), w(DType::fp32, 12), y(DType::fp32, 16), h(DType::bf16, 12);
  expect_error(
      [&] {
        matmul_forward(y.tensor({4, 4}), x.tensor({4, 3}), w.tensor({3, 4}), Tensor(), Tensor());
      },
      {"matmul_forward", "weight", "[3, 4]", "C = 3", "[4, 3]"});
  expect_error(
      [&] {
        matmul_forward(y.tensor({4, 4}), x.tensor({4, 3}), w.tensor({4, 3}), w.tensor({12}), Tensor());
      },
      {"matmul_forward", "bias", "[12]", "[4]"});
  expect_error([&] { matmul_forward(y.tensor({4, 4}), x.tensor({4, 3}), h.tensor({4, 3}), Tensor(), Tensor()); }, {"matmul_forward", "bf16", "fp32"});
  Buf hx(DType::bf16, 12), hy(DType::bf16, 16);
  expect_error(
      [&] {
        matmul_forward(hy.tensor({4, 4}), hx.tensor({4, 3}), h.tensor({4, 3}), Tensor(), Tensor());
      },
      {"matmul_forward", "scratch", "bf16"});
  Tensor gw(w.data(), DType::fp32, Shape{4, 3}, Device::cuda(0));
  expect_error([&] { matmul_forward(y.tensor({4, 4}), x.tensor({4, 3}), gw, Tensor(), Tensor()); }, {"matmul_forward", "cuda:0"});
  expect_error(
      [&] {
        matmul_backward(x.tensor({4, 3}), Tensor(), Tensor(), y.tensor({2, 8}), x.tensor({4, 3}), w.tensor({4, 3}), Tensor());
      },
      {"matmul_backward", "dout", "[2, 8]", "[4, 4]"});
}
