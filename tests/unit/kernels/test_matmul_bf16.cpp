// bf16 matmuls on the CPU (ops/cpu/cpu_bf16_gemm.h): the oneDNN path and the widened fp32-sgemm
// path, each against an fp64 reference computed from the same bf16 inputs, within a bound derived
// from the arithmetic (not tuned):
//
//   Every output is one rounding to bf16 of an fp32 sum s of n terms t_i: the K products a_i·b_i
//   (exact in fp32: two 8-bit significands give at most 16 bits) plus, where there is one, the
//   bias (forward) or the old bf16 destination (the gradients' +=), so n = K or K + 1. Summed in
//   fp32 in any order (vdpbf16ps, AMX, sgemm's blocking, a K-split reduction),
//       |s − ref| <= γ_n · Σ|t_i|,   γ_n = n·u32 / (1 − n·u32),  u32 = 2^-24,
//   and the one rounding of s to bf16 adds at most u16·|s|, u16 = 2^-8, with |s| <= |ref| + γ_n·Σ|t_i|:
//       |got − ref| <= u16·|ref| + (1 + u16)·γ_n·Σ|t_i|  (+ the fp64 reference's own γ_n(2^-53)·Σ|t_i|).
//   (The inputs are in [-1, 1]: no partial sum is subnormal, so the flush-to-zero of vdpbf16ps
//   does not enter.)
//
// Shapes: every GEMM of GPT-2 d12 (C = 768: qkv 768→2304, attention projection 768→768, fc
// 768→3072, fc projection 3072→768, the LM head 768→50304) at BT = 64, and odd sizes 1, 3, 7, 17,
// 129, 1000 in each of BT, C and OC; forward (with bias), dinp += and dweight += into non-zero
// destinations, and matmul_gelu forward and backward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "ops/cpu/cpu_bf16_gemm.h"
#include "ops/kernels/gelu.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/matmul_gelu.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

constexpr double kU16 = 1.0 / 256.0;              // bf16 unit roundoff, 2^-8
constexpr double kU32 = 1.0 / 16777216.0;         // fp32 unit roundoff, 2^-24
constexpr double kU64 = 1.0 / 9007199254740992.0;  // fp64 unit roundoff, 2^-53

double gamma(double n, double u) { return n * u / (1.0 - n * u); }

// The bound of the file comment for a sum of n terms whose absolute values sum to abs_sum.
double bf16_dot_bound(double ref, double abs_sum, std::int64_t n) {
  const double nd = static_cast<double>(n);
  return kU16 * std::abs(ref) + (1.0 + kU16) * gamma(nd, kU32) * abs_sum + gamma(nd, kU64) * abs_sum;
}

// Element (r, c) of a bf16 buffer read as a matrix with strides (rs, cs): a transposed operand is
// the same buffer with its strides swapped (no copies: the LM head's weight is 38.6M elements).
struct View {
  const Buf* b;
  std::int64_t rs, cs;
  double at(std::int64_t r, std::int64_t c) const { return b->get(r * rs + c * cs); }
};
View rows(const Buf& b, std::int64_t cols) { return {&b, cols, 1}; }     // row-major (., cols)
View cols(const Buf& b, std::int64_t cols) { return {&b, 1, cols}; }     // its transpose

// got (M, N) against ref(i, j) = extra(i, j) + Σ_k A(i, k)·Bt(j, k). Every entry when the
// reference costs at most kBudget multiply-adds, else an evenly spread sample (an odd stride over
// the flat index, so the sampled columns move from row to row). Returns the violations.
constexpr std::int64_t kBudget = std::int64_t{1} << 22;

std::int64_t count_violations(const Buf& got, View A, View Bt, const Buf* extra, std::int64_t M, std::int64_t N, std::int64_t K,
                              const std::string& what) {
  std::int64_t stride = std::max<std::int64_t>(1, M * N * K / kBudget);
  stride |= 1;
  std::int64_t bad = 0;
  for (std::int64_t idx = 0; idx < M * N; idx += stride) {
    const std::int64_t i = idx / N, j = idx % N;
    double ref = 0, abs_sum = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      const double t = A.at(i, k) * Bt.at(j, k);
      ref += t;
      abs_sum += std::abs(t);
    }
    std::int64_t n = K;
    if (extra) {
      const double e = extra->get(idx);
      ref += e;
      abs_sum += std::abs(e);
      ++n;
    }
    const double g = got.get(idx);
    const double bound = bf16_dot_bound(ref, abs_sum, n);
    if (!(std::abs(g - ref) <= bound)) {
      if (bad < 3) {
        ADD_FAILURE() << what << ": (" << i << ", " << j << ") got " << g << ", reference " << ref << ", |error| " << std::abs(g - ref)
                      << " > bound " << bound;
      }
      ++bad;
    }
  }
  return bad;
}

// (M, N) with row i = v: a bias broadcast over the rows.
Buf bias_rows(const Buf& bias, std::int64_t M, std::int64_t N) {
  Buf out(DType::bf16, M * N);
  for (std::int64_t i = 0; i < M * N; ++i) out.set(i, bias.get(i % N));
  return out;
}

struct Shape3 {
  std::int64_t BT, C, OC;
};

std::string label(const Shape3& s, CpuBf16Gemm path) {
  return std::string(cpu_bf16_gemm_name(path)) + " BT=" + std::to_string(s.BT) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC);
}

// matmul_forward and matmul_backward (dinp += and dweight += into non-zero destinations).
void check_matmul(const Shape3& s, CpuBf16Gemm path, std::uint64_t seed) {
  const std::int64_t BT = s.BT, C = s.C, OC = s.OC;
  const std::string what = label(s, path);
  std::mt19937_64 rng(seed);
  Buf x(DType::bf16, BT * C), w(DType::bf16, OC * C), b(DType::bf16, OC), y(DType::bf16, BT * OC), g(DType::bf16, BT * OC),
      dx(DType::bf16, BT * C), dw(DType::bf16, OC * C);
  for (Buf* p : {&x, &w, &b, &g, &dx, &dw}) p->fill_uniform(rng, -1, 1);
  std::vector<float> scratch(matmul_scratch_elems(DType::bf16, C));
  const Tensor sc(scratch.data(), DType::fp32, dstrain::Shape{static_cast<std::int64_t>(scratch.size())});
  const Buf dx0 = dx, dw0 = dw;

  matmul_forward(y.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), b.tensor({OC}), sc);
  const Buf bias = bias_rows(b, BT, OC);
  EXPECT_EQ(count_violations(y, rows(x, C), rows(w, C), &bias, BT, OC, C, what + " out"), 0);

  matmul_backward(dx.tensor({BT, C}), dw.tensor({OC, C}), Tensor(), g.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), sc);
  // dinp (BT, C) = dx0 + g (BT, OC) · w (OC, C);  dweight (OC, C) = dw0 + gᵀ (OC, BT) · x (BT, C)
  EXPECT_EQ(count_violations(dx, rows(g, OC), cols(w, C), &dx0, BT, C, OC, what + " dinp"), 0);
  EXPECT_EQ(count_violations(dw, cols(g, OC), cols(x, C), &dw0, OC, C, BT, what + " dweight"), 0);
}

// matmul_gelu_forward / backward: the GEMMs within the bound, the GELU applied to exactly what
// the GEMM stored (the op is the composition of the two on the CPU).
void check_matmul_gelu(const Shape3& s, CpuBf16Gemm path, std::uint64_t seed) {
  const std::int64_t BT = s.BT, C = s.C, OC = s.OC;
  const std::string what = label(s, path) + " matmul_gelu";
  std::mt19937_64 rng(seed);
  Buf x(DType::bf16, BT * C), w(DType::bf16, OC * C), b(DType::bf16, OC), pre(DType::bf16, BT * OC), out(DType::bf16, BT * OC);
  for (Buf* p : {&x, &w, &b}) p->fill_uniform(rng, -1, 1);
  std::vector<float> scratch(matmul_scratch_elems(DType::bf16, std::max(C, OC)));
  const Tensor sc(scratch.data(), DType::fp32, dstrain::Shape{static_cast<std::int64_t>(scratch.size())});
  matmul_gelu_forward(out.tensor({BT, OC}), pre.tensor({BT, OC}), x.tensor({BT, C}), w.tensor({OC, C}), b.tensor({OC}), sc);
  const Buf bias = bias_rows(b, BT, OC);
  EXPECT_EQ(count_violations(pre, rows(x, C), rows(w, C), &bias, BT, OC, C, what + " pre"), 0);
  Buf want_out(DType::bf16, BT * OC);
  gelu_forward(want_out.tensor({BT, OC}), pre.tensor({BT, OC}));
  EXPECT_EQ(out.values(), want_out.values()) << what << " out";

  // Backward of a following y = out · w2ᵀ, w2 (C, OC): dweight2 += dyᵀ · out, d(out) = dy · w2.
  Buf w2(DType::bf16, C * OC), dy(DType::bf16, BT * C), dw2(DType::bf16, C * OC), dpre(DType::bf16, BT * OC), dout(DType::bf16, BT * OC);
  for (Buf* p : {&w2, &dy, &dw2}) p->fill_uniform(rng, -1, 1);
  const Buf dw20 = dw2;
  matmul_gelu_backward(dpre.tensor({BT, OC}), dw2.tensor({C, OC}), Tensor(), dy.tensor({BT, C}), out.tensor({BT, OC}), pre.tensor({BT, OC}),
                       w2.tensor({C, OC}), dout.tensor({BT, OC}), sc);
  EXPECT_EQ(count_violations(dw2, cols(dy, C), cols(out, OC), &dw20, C, OC, BT, what + " dweight"), 0);
  // On the CPU dout_scratch holds d(out) = 0 + dy · w2 (zeroed, then accumulated).
  Buf zeros(DType::bf16, BT * OC);
  zeros.fill(0);
  EXPECT_EQ(count_violations(dout, rows(dy, C), cols(w2, OC), &zeros, BT, OC, C, what + " d(out)"), 0);
  Buf want_dpre(DType::bf16, BT * OC);
  want_dpre.fill(0);
  gelu_backward(want_dpre.tensor({BT, OC}), pre.tensor({BT, OC}), dout.tensor({BT, OC}));
  EXPECT_EQ(dpre.values(), want_dpre.values()) << what << " dpre";
}

// GPT-2 d12's GEMMs (C = 768, 4·C = 3072, vocabulary padded to 50304) at BT = 64.
const std::vector<Shape3> kGpt2Shapes = {{64, 768, 2304}, {64, 768, 768}, {64, 768, 3072}, {64, 3072, 768}, {64, 768, 50304}};

// Odd sizes: each of 1, 3, 7, 17, 129, 1000 in each dimension, every (BT, C) pair once, OC cycling.
std::vector<Shape3> odd_shapes() {
  const std::int64_t v[] = {1, 3, 7, 17, 129, 1000};
  std::vector<Shape3> out;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) out.push_back({v[i], v[j], v[(i + j) % 6]});
  return out;
}

// The paths that can run here; restores the one in use before.
class Bf16Paths {
 public:
  Bf16Paths() : before_(cpu_bf16_gemm()) {
    if (cpu_bf16_gemm_supported(CpuBf16Gemm::onednn)) paths_.push_back(CpuBf16Gemm::onednn);
    paths_.push_back(CpuBf16Gemm::widened);
  }
  ~Bf16Paths() { set_cpu_bf16_gemm(before_); }
  const std::vector<CpuBf16Gemm>& paths() const { return paths_; }
  CpuBf16Gemm before() const { return before_; }

 private:
  CpuBf16Gemm before_;
  std::vector<CpuBf16Gemm> paths_;
};

TEST(MatmulBf16, Gpt2ShapesWithinTheDerivedBound) {
  Bf16Paths p;
  for (const CpuBf16Gemm path : p.paths()) {
    set_cpu_bf16_gemm(path);
    std::uint64_t seed = 100;
    for (const Shape3& s : kGpt2Shapes) check_matmul(s, path, ++seed);
  }
}

TEST(MatmulBf16, OddShapesWithinTheDerivedBound) {
  Bf16Paths p;
  for (const CpuBf16Gemm path : p.paths()) {
    set_cpu_bf16_gemm(path);
    std::uint64_t seed = 200;
    for (const Shape3& s : odd_shapes()) check_matmul(s, path, ++seed);
  }
}

TEST(MatmulBf16, MatmulGeluWithinTheDerivedBound) {
  Bf16Paths p;
  for (const CpuBf16Gemm path : p.paths()) {
    set_cpu_bf16_gemm(path);
    std::uint64_t seed = 300;
    for (const Shape3& s : {Shape3{64, 768, 3072}, Shape3{17, 129, 7}, Shape3{1, 3, 1000}, Shape3{129, 1000, 17}}) check_matmul_gelu(s, path, ++seed);
  }
}

// The bound is not vacuous: a result two bf16 ulps off, or one that forgot the bias, is rejected.
TEST(MatmulBf16, TheBoundRejectsWrongResults) {
  const std::int64_t M = 64, N = 96, K = 768;
  std::mt19937_64 rng(7);
  Buf a(DType::bf16, M * K), bt(DType::bf16, N * K), bias(DType::bf16, M * N), exact(DType::bf16, M * N), off(DType::bf16, M * N),
      no_bias(DType::bf16, M * N);
  for (Buf* p : {&a, &bt, &bias}) p->fill_uniform(rng, -1, 1);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (std::int64_t k = 0; k < K; ++k) acc += a.get(i * K + k) * bt.get(j * K + k);
      const std::int64_t o = i * N + j;
      exact.set(o, acc + bias.get(o));
      no_bias.set(o, acc);
      off.set(o, exact.get(o) + 2 * std::ldexp(1.0, std::ilogb(exact.get(o)) - 7));  // two bf16 ulps (8-bit significand)
    }
  EXPECT_EQ(count_violations(exact, rows(a, K), rows(bt, K), &bias, M, N, K, "exact"), 0);
  ::testing::TestPartResultArray failures;
  std::int64_t bad_off = 0, bad_no_bias = 0;
  {
    ::testing::ScopedFakeTestPartResultReporter quiet(::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    bad_off = count_violations(off, rows(a, K), rows(bt, K), &bias, M, N, K, "two ulps off");
    bad_no_bias = count_violations(no_bias, rows(a, K), rows(bt, K), &bias, M, N, K, "bias dropped");
  }
  // Not every entry: where |ref| is small (a few units, ~10% of these sums of 768 products of
  // U(-1, 1)), the fp32 term γ_n·Σ|t_i| ≈ 0.009 of the bound spans more than two bf16 ulps.
  EXPECT_GT(bad_off, M * N * 3 / 4);
  EXPECT_GT(bad_no_bias, M * N / 2);
}

// On a CPU with bf16 dot products, a build with oneDNN takes the oneDNN path.
TEST(MatmulBf16, OneDnnPathIsTakenWhereTheCpuHasBf16) {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  const bool cpu_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#else
  const bool cpu_bf16 = false;
#endif
  if (!cpu_bf16) GTEST_SKIP() << "this CPU has no avx512_bf16: " << cpu_bf16_gemm_path();
  if (!cpu_bf16_gemm_supported(CpuBf16Gemm::onednn)) {
    const std::string path = cpu_bf16_gemm_path();
    EXPECT_EQ(path.rfind("widened fp32 sgemm (", 0), 0u) << path;
    if (path.find("built without oneDNN") != std::string::npos) GTEST_SKIP() << path;
    FAIL() << "the CPU has avx512_bf16 but oneDNN's bf16 matmul is not supported: " << path;
  }
  Bf16Paths p;
  set_cpu_bf16_gemm(CpuBf16Gemm::widened);
  EXPECT_EQ(cpu_bf16_gemm_path(), "widened fp32 sgemm (set_cpu_bf16_gemm)");
  set_cpu_bf16_gemm(CpuBf16Gemm::onednn);
  const std::string path = cpu_bf16_gemm_path();
  EXPECT_TRUE(path == "onednn avx512_core_bf16" || path == "onednn avx512_core_amx") << path;
  // And the default choice (unless DSTRAIN_CPU_BF16_GEMM=0 is set for this process) is oneDNN.
  const char* env = std::getenv("DSTRAIN_CPU_BF16_GEMM");
  if (env == nullptr || std::string(env) != "0") {
    EXPECT_EQ(p.before(), CpuBf16Gemm::onednn);
  }
}

}  // namespace
