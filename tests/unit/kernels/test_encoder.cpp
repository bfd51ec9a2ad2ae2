// Encoder (token + position embedding) against a naive double reference and finite differences.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "encoder_cases.h"
#include "kernel_test_util.h"
#include "ops/kernels/encoder.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::int64_t n, std::int64_t V) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(V - 1));
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

}  // namespace

class EncoderTest : public ::testing::TestWithParam<DType> {};

TEST_P(EncoderTest, MatchesReference) {
  const DType dt = GetParam();
  const Tol tol = kEncoderTols.of(dt);
  std::mt19937_64 rng(21);
  for (const EncoderCase& c : kEncoderCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, C = c.C, V = c.V, maxT = c.maxT;
    auto tok = random_tokens(rng, B * T, V);
    Tensor tokens(tok.data(), DType::int32, Shape{B, T});
    Buf wte(dt, V * C), wpe(dt, maxT * C), out(dt, B * T * C), dout(dt, B * T * C), dwte(dt, V * C), dwpe(dt, maxT * C);
    wte.fill_uniform(rng, -1, 1);
    wpe.fill_uniform(rng, -1, 1);
    dout.fill_uniform(rng, -1, 1);
    dwte.fill_uniform(rng, -1, 1);
    dwpe.fill_uniform(rng, -1, 1);
    const auto we = wte.values(), wp = wpe.values(), g = dout.values();
    auto want_dwte = dwte.values(), want_dwpe = dwpe.values();
    std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, V));
    encoder_forward(out.tensor({B, T, C}), tokens, wte.tensor({V, C}), wpe.tensor({maxT, C}));
    encoder_backward(dwte.tensor({V, C}), dwpe.tensor({maxT, C}), dout.tensor({B, T, C}), tokens,
                     Tensor(scratch.data(), DType::int32, Shape{static_cast<std::int64_t>(scratch.size())}));
    std::vector<double> want_out(static_cast<std::size_t>(B * T * C));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t ch = 0; ch < C; ++ch) {
          const std::size_t i = static_cast<std::size_t>((b * T + t) * C + ch);
          const std::int64_t v = tok[static_cast<std::size_t>(b * T + t)];
          want_out[i] = we[static_cast<std::size_t>(v * C + ch)] + wp[static_cast<std::size_t>(t * C + ch)];
          want_dwte[static_cast<std::size_t>(v * C + ch)] += g[i];
          want_dwpe[static_cast<std::size_t>(t * C + ch)] += g[i];
        }
    expect_close(out, want_out, tol, "encoder out " + dtype_label(dt));
    // The sums have up to B*T terms: scale the absolute tolerance with it.
    const Tol gtol{tol.atol * static_cast<double>(B * T) / 4 + tol.atol, tol.rtol};
    expect_close(dwte, want_dwte, gtol, "encoder dwte " + dtype_label(dt));
    expect_close(dwpe, want_dwpe, gtol, "encoder dwpe " + dtype_label(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, EncoderTest, ::testing::ValuesIn(kFloatDTypes), dtype_param_name);

TEST(Encoder, BackwardIsDeterministic) {
  std::mt19937_64 rng(22);
  const std::int64_t B = 4, T = 64, C = 200, V = 7;
  auto tok = random_tokens(rng, B * T, V);
  Tensor tokens(tok.data(), DType::int32, Shape{B, T});
  Buf dout(DType::bf16, B * T * C), d1(DType::bf16, V * C), d2(DType::bf16, V * C), p1(DType::bf16, T * C), p2(DType::bf16, T * C);
  dout.fill_uniform(rng, -1, 1);
  std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, V));
  Tensor s(scratch.data(), DType::int32, Shape{static_cast<std::int64_t>(scratch.size())});
  encoder_backward(d1.tensor({V, C}), p1.tensor({T, C}), dout.tensor({B, T, C}), tokens, s);
  encoder_backward(d2.tensor({V, C}), p2.tensor({T, C}), dout.tensor({B, T, C}), tokens, s);
  for (std::int64_t i = 0; i < V * C; ++i) ASSERT_EQ(d1.get(i), d2.get(i));
}

TEST(Encoder, FiniteDifferences) {
  std::mt19937_64 rng(23);
  const std::int64_t B = 2, T = 3, C = 5, V = 4, maxT = 4;
  auto tok = random_tokens(rng, B * T, V);
  Tensor tokens(tok.data(), DType::int32, Shape{B, T});
  Buf wte(DType::fp32, V * C), wpe(DType::fp32, maxT * C), out(DType::fp32, B * T * C), dout(DType::fp32, B * T * C), dwte(DType::fp32, V * C),
      dwpe(DType::fp32, maxT * C);
  wte.fill_uniform(rng, -1, 1);
  wpe.fill_uniform(rng, -1, 1);
  const auto w = random_vec(rng, static_cast<std::size_t>(B * T * C));
  for (std::int64_t i = 0; i < B * T * C; ++i) dout.set(i, w[static_cast<std::size_t>(i)]);
  std::vector<std::int32_t> scratch(encoder_backward_scratch_elems(B, T, V));
  encoder_backward(dwte.tensor({V, C}), dwpe.tensor({maxT, C}), dout.tensor({B, T, C}), tokens,
                   Tensor(scratch.data(), DType::int32, Shape{static_cast<std::int64_t>(scratch.size())}));
  auto loss = [&] {
    encoder_forward(out.tensor({B, T, C}), tokens, wte.tensor({V, C}), wpe.tensor({maxT, C}));
    double l = 0;
    for (std::int64_t i = 0; i < B * T * C; ++i) l += w[static_cast<std::size_t>(i)] * out.get(i);
    return l;
  };
  for (std::int64_t i = 0; i < V * C; ++i) {
    const double fd = central_difference(static_cast<float*>(wte.data()), i, 1e-2, loss);
    EXPECT_NEAR(dwte.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dwte " << i;
  }
  for (std::int64_t i = 0; i < maxT * C; ++i) {
    const double fd = central_difference(static_cast<float*>(wpe.data()), i, 1e-2, loss);
    EXPECT_NEAR(dwpe.get(i), fd, kFdTol.atol + kFdTol.rtol * std::abs(fd)) << "dwpe " << i;
  }
}

TEST(Encoder, BadArgumentsNameTheOpAndShapes) {
  std::vector<std::int32_t> tok = {0, 1, 2, 9};
  Tensor tokens(tok.data(), DType::int32, Shape{2, 2});
  Buf wte(DType::fp32, 4 * 8), wpe(DType::fp32, 4 * 8), out(DType::fp32, 2 * 2 * 8), half(DType::fp16, 4 * 8);
  expect_error(
      [&] {
        encoder_forward(out.tensor({2, 2, 8}), tokens, wte.tensor({4, 8}), wpe.tensor({4, 8}));
      },
      {"encoder_forward", "token 9", "[0, 4)"});
  tok[3] = 3;
  expect_error(
      [&] {
        encoder_forward(out.tensor({2, 2, 8}), tokens, wte.tensor({8, 4}), wpe.tensor({4, 8}));
      },
      {"encoder_forward", "wte", "[8, 4]", "(V, C)"});
  expect_error(
      [&] {
        encoder_forward(out.tensor({2, 2, 8}), tokens, wte.tensor({4, 8}), wpe.tensor({2, 16}));
      },
      {"encoder_forward", "wpe", "[2, 16]"});
  expect_error([&] { encoder_forward(out.tensor({2, 2, 8}), tokens, half.tensor({4, 8}), wpe.tensor({4, 8})); }, {"encoder_forward", "fp16", "fp32"});
  Tensor ftok(wte.data(), DType::fp32, Shape{2, 2});
  expect_error([&] { encoder_forward(out.tensor({2, 2, 8}), ftok, wte.tensor({4, 8}), wpe.tensor({4, 8})); }, {"encoder_forward", "tokens", "int32"});
  Tensor gpu(out.data(), DType::fp32, Shape{2, 2, 8}, Device::cuda(0));
  expect_error([&] { encoder_forward(gpu, tokens, wte.tensor({4, 8}), wpe.tensor({4, 8})); }, {"encoder_forward", "cuda:0"});
  std::vector<std::int32_t> small(3);
  expect_error(
      [&] {
        encoder_backward(wte.tensor({4, 8}), wpe.tensor({4, 8}), out.tensor({2, 2, 8}), tokens, Tensor(small.data(), DType::int32, Shape{3}));
      },
      {"encoder_backward", "scratch", "B*T + V + 1 = 9"});
}
