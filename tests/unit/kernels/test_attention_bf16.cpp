// bf16-storage attention on the AVX512-BF16 path (ops/cpu/attention_bf16.cpp: vdpbf16ps tile
// products) against an fp64 naive reference (full T×T softmax, no tiles) computed from the same
// bf16 q/k/v/dout, with a per-element tolerance derived from what the kernel rounds, and the same
// cases through the generic fp32-widening path (set_cpu_bf16_attention(false)), which must meet
// the same bound.
//
// The tolerance, per element (u = 2^-8: bf16's unit roundoff; e = 2^-24: fp32's; γ_n = n·e/(1-n·e)),
// first order in the roundings, times 1.05 for the second-order terms:
//   scores    |Δs_ij| <= es_ij = scale·γ_HS·Σ_d |q_id k_jd| + e·|s_ij|       (fp32 sum of exact bf16 products)
//   P         p_ij = exp(s_ij - m_i)/l_i: relative error ep_i = 2·max_j es_ij + γ_T + 8e
//             (each score, the row's normaliser, the fp32 sum l of up to T terms, fast_exp ~ 4e)
//   out       |Δout_id| <= u·|out_id| + Σ_j P̃_ij|v_jd|·(u + ep_i + γ_T)
//             (u·|out|: the output's bf16 rounding; u·P̃_ij|v_jd|: P̃ rounded to bf16 for P·V, one
//             rounding per term; γ_T: the fp32 accumulation over at most T keys)
//   lse       |Δlse_i| <= max_j es_ij + γ_T + 8e·(1 + |lse_i|)   (no bf16 rounding reaches lse)
//   backward  P recomputed from lse: relative eb_ij = es_ij + Δlse_i + 4e;
//             dP̃_ij = dout_i·v_j: |Δ| <= γ_HS·Σ_d|dout_id v_jd|·m_ij;
//             D_i = dout_i·out_i uses the kernel's stored out: |ΔD_i| <= Σ_d |dout_id|·tol_out_id + γ_HS·Σ_d|dout_id out_id|;
//             dS_ij = P_ij(dP̃_ij - D_i)·scale: |ΔdS| <= scale·[P(|ΔdP̃| + |ΔD|) + eb·P·|dP̃ - D|] + u·|dS| (dS rounded to bf16);
//             dq_id: u·|dq_id| (the final rounding of dqkv) + Σ_j (|ΔdS_ij| + γ_GT·|dS_ij|)|k_jd|, and alike
//             dk_jd with |q_id|, dv_jd: u·|dv_jd| + Σ_i (u + eb_ij + γ_GT)·P̃_ij|dout_id|
//             (u·P̃: P̃ rounded to bf16 for Pᵀ·dout; G·T: the terms a dk/dv element sums over heads and queries).
// Subnormal flushing (vdpbf16ps flushes denormals) changes terms below 2^-126: far below these.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "kernel_test_util.h"
#include "ops/cpu/attention_bf16.h"
#include "ops/kernels/attention.h"
#include "ops/kernels/philox.h"

using namespace dstrain;
using namespace dstrain::test;

namespace {

constexpr double kU = 1.0 / 256.0;          // bf16 unit roundoff 2^-8
constexpr double kE = 1.0 / 16777216.0;     // fp32 unit roundoff 2^-24
constexpr double kSecondOrder = 1.05;
double gamma(double n) { return n * kE / (1.0 - n * kE); }

struct Bf16Case {
  const char* name;
  std::int64_t B, T, NH, NKV, HS, window;
  float dropout_p;
};
constexpr Bf16Case kCases[] = {
    {"gpt2_T1", 1, 1, 12, 12, 64, 0, 0.0f},
    {"gpt2_T7", 1, 7, 12, 12, 64, 0, 0.0f},
    {"gpt2_T64", 1, 64, 12, 12, 64, 0, 0.0f},
    {"gpt2_T257", 1, 257, 12, 12, 64, 0, 0.0f},  // a key and a query block past a multiple of 32
    {"gqa_8_of_2_HS128", 2, 45, 8, 2, 128, 0, 0.0f},
    {"HS5_odd", 2, 7, 3, 3, 5, 0, 0.0f},  // attention_cases.h's HS_odd: one head-dim pair half empty
    {"HS37_odd", 1, 70, 2, 1, 37, 0, 0.0f},
    {"HS40", 1, 50, 4, 4, 40, 0, 0.0f},  // vectors of 16 with a tail of 8
    {"HS24_kv2", 1, 33, 4, 2, 24, 0, 0.0f},
    {"window40", 1, 100, 4, 2, 32, 40, 0.0f},
    {"window5", 2, 70, 2, 2, 16, 5, 0.0f},
    {"dropout_gpt2", 1, 70, 12, 12, 64, 0, 0.2f},
    {"dropout_window_gqa", 2, 37, 4, 2, 6, 7, 0.2f},
    {"dropout_HS_max", 1, 35, 1, 1, 128, 0, 0.1f},
};

// The fp64 reference and the per-element bounds of the header comment.
struct Ref {
  std::vector<double> out, lse, dqkv, tol_out, tol_lse, tol_dqkv;
};

Ref reference(const Bf16Case& c, const std::vector<double>& qkv, const std::vector<double>& dout, const std::vector<double>& dqkv0,
              const DropoutParams& dp) {
  const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, HS = c.HS, G = NH / NKV, C = NH * HS, W = (NH + 2 * NKV) * HS;
  const std::int64_t KOFF = C, VOFF = C + NKV * HS;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const double gHS = gamma(static_cast<double>(HS) + 1), gT = gamma(static_cast<double>(T) + 1), gGT = gamma(static_cast<double>(G * T) + 1);
  auto Z = [](std::int64_t n) { return std::vector<double>(static_cast<std::size_t>(n), 0.0); };
  Ref r{Z(B * T * C), Z(B * NH * T), dqkv0, Z(B * T * C), Z(B * NH * T), Z(B * T * W)};
  std::vector<double> grad = Z(B * T * W), gtol = Z(B * T * W);  // the gradient alone and its bound before the final rounding
  auto I = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < NH; ++h) {
      const std::int64_t g = h / G, bh = b * NH + h;
      auto q = [&](std::int64_t t, std::int64_t d) { return qkv[I((b * T + t) * W + h * HS + d)]; };
      auto k = [&](std::int64_t t, std::int64_t d) { return qkv[I((b * T + t) * W + KOFF + g * HS + d)]; };
      auto v = [&](std::int64_t t, std::int64_t d) { return qkv[I((b * T + t) * W + VOFF + g * HS + d)]; };
      auto go = [&](std::int64_t t, std::int64_t d) { return dout[I((b * T + t) * C + h * HS + d)]; };
      std::vector<double> P = Z(T * T), M = Z(T * T), ES = Z(T * T);
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t j0 = c.window > 0 ? std::max<std::int64_t>(0, i - c.window + 1) : 0;
        double mx = -1e300, esmax = 0;
        std::vector<double> s = Z(T);
        for (std::int64_t j = j0; j <= i; ++j) {
          double acc = 0, mag = 0;
          for (std::int64_t d = 0; d < HS; ++d) {
            acc += q(i, d) * k(j, d);
            mag += std::abs(q(i, d) * k(j, d));
          }
          s[I(j)] = acc * scale;
          ES[I(i * T + j)] = scale * gHS * mag + kE * std::abs(s[I(j)]);
          esmax = std::max(esmax, ES[I(i * T + j)]);
          mx = std::max(mx, s[I(j)]);
        }
        double sum = 0;
        for (std::int64_t j = j0; j <= i; ++j) sum += std::exp(s[I(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[I(bh * T + i)] = lse;
        r.tol_lse[I(bh * T + i)] = esmax + gT + 8 * kE * (1 + std::abs(lse));
        for (std::int64_t j = j0; j <= i; ++j) {
          P[I(i * T + j)] = std::exp(s[I(j)] - mx) / sum;
          double m = 1.0;
          if (dp.p > 0) {
            const std::uint64_t e = static_cast<std::uint64_t>((bh * T + i) * T + j);
            const std::uint32_t bits = philox4x32_10(dp.rng.counter(e / 4), dp.rng.key()).v[e % 4];
            m = (static_cast<double>(bits >> 8) / 16777216.0 >= dp.p) ? 1.0 / (1.0 - dp.p) : 0.0;
          }
          M[I(i * T + j)] = m;
        }
        const double ep = 2 * esmax + gT + 8 * kE;
        for (std::int64_t d = 0; d < HS; ++d) {
          double acc = 0, mag = 0;
          for (std::int64_t j = j0; j <= i; ++j) {
            acc += P[I(i * T + j)] * M[I(i * T + j)] * v(j, d);
            mag += P[I(i * T + j)] * M[I(i * T + j)] * std::abs(v(j, d));
          }
          r.out[I((b * T + i) * C + h * HS + d)] = acc;
          r.tol_out[I((b * T + i) * C + h * HS + d)] = kSecondOrder * (kU * std::abs(acc) + mag * (kU + ep + gT));
        }
      }
      for (std::int64_t i = 0; i < T; ++i) {
        const std::int64_t j0 = c.window > 0 ? std::max<std::int64_t>(0, i - c.window + 1) : 0;
        // D_i from the reference out; its error bound from the out bound.
        double D = 0, eD = 0, Dmag = 0;
        for (std::int64_t d = 0; d < HS; ++d) {
          const double o = r.out[I((b * T + i) * C + h * HS + d)];
          D += go(i, d) * o;
          Dmag += std::abs(go(i, d) * o);
          eD += std::abs(go(i, d)) * r.tol_out[I((b * T + i) * C + h * HS + d)];
        }
        eD += gHS * Dmag;
        const double else_ = r.tol_lse[I(bh * T + i)];
        for (std::int64_t j = j0; j <= i; ++j) {
          const double p = P[I(i * T + j)], m = M[I(i * T + j)];
          double dPd = 0, dPmag = 0;
          for (std::int64_t d = 0; d < HS; ++d) {
            dPd += go(i, d) * v(j, d);
            dPmag += std::abs(go(i, d) * v(j, d));
          }
          dPd *= m;
          const double edP = gHS * dPmag * m;
          const double eb = ES[I(i * T + j)] + else_ + 4 * kE;
          const double ds = p * (dPd - D) * scale;
          const double eds = scale * (p * (edP + eD) + eb * p * std::abs(dPd - D)) + kU * std::abs(ds);
          for (std::int64_t d = 0; d < HS; ++d) {
            const std::size_t iq = I((b * T + i) * W + h * HS + d), ik = I((b * T + j) * W + KOFF + g * HS + d),
                              iv = I((b * T + j) * W + VOFF + g * HS + d);
            grad[iq] += ds * k(j, d);
            gtol[iq] += (eds + gT * std::abs(ds)) * std::abs(k(j, d));
            grad[ik] += ds * q(i, d);
            gtol[ik] += (eds + gGT * std::abs(ds)) * std::abs(q(i, d));
            grad[iv] += p * m * go(i, d);
            gtol[iv] += (kU + eb + gGT) * p * m * std::abs(go(i, d));
          }
        }
      }
    }
  for (std::size_t i = 0; i < grad.size(); ++i) {
    r.dqkv[i] += grad[i];
    r.tol_dqkv[i] = kSecondOrder * (kU * std::abs(r.dqkv[i]) + gtol[i]);
  }
  return r;
}

// Checks got ~ want elementwise within tol[i]; returns the largest |got - want| / tol seen.
double check(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& tol, const std::string& what) {
  double worst = 0;
  std::size_t wi = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(got[i] - want[i]);
    const double ratio = diff == 0 ? 0.0 : diff / tol[i];  // exact where nothing contributes (all dropped)
    if (!(ratio <= worst)) {
      worst = ratio;
      wi = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << wi << " is " << got[wi] << ", reference " << want[wi] << ", bound " << tol[wi];
  return worst;
}

// Restores the path the process had (the environment's choice under ctest's
// AttentionBf16GenericPath run) when a test that flips the switch ends.
struct PathGuard {
  bool saved = cpu::cpu_bf16_attention_enabled();
  PathGuard() = default;
  PathGuard(const PathGuard&) = delete;
  PathGuard& operator=(const PathGuard&) = delete;
  ~PathGuard() { cpu::set_cpu_bf16_attention(saved); }
};

struct KernelRun {
  std::vector<double> out, lse, dqkv;
};

KernelRun run_kernel(const Bf16Case& c, Buf& qkv, Buf& dout, Buf& dqkv, const DropoutParams& dp) {
  const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
  Buf out(DType::bf16, B * T * C);
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), scratch(attention_backward_scratch_elems(B, T, C, NH));
  const Tensor tl(lse.data(), DType::fp32, Shape{B, NH, T});
  attention_forward(out.tensor({B, T, C}), tl, qkv.tensor({B, T, W}), {NH, NKV}, dp, c.window);
  attention_backward(dqkv.tensor({B, T, W}), dout.tensor({B, T, C}), qkv.tensor({B, T, W}), out.tensor({B, T, C}), tl, {NH, NKV},
                     Tensor(scratch.data(), DType::fp32, Shape{static_cast<std::int64_t>(scratch.size())}), dp, c.window);
  return {out.values(), std::vector<double>(lse.begin(), lse.end()), dqkv.values()};
}

// Every case on the chosen path against the reference; prints the worst error / bound ratios.
void check_all_cases(bool dot_product_path) {
  const PathGuard guard;
  cpu::set_cpu_bf16_attention(dot_product_path);
  std::mt19937_64 rng(61);
  double worst[5] = {0, 0, 0, 0, 0};
  for (const Bf16Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
    const DropoutParams dp{c.dropout_p, RngKey{96, 5, 6, 2, 0}};
    Buf qkv(DType::bf16, B * T * W), dout(DType::bf16, B * T * C), dqkv(DType::bf16, B * T * W);
    qkv.fill_uniform(rng, -1.5, 1.5);
    dout.fill_uniform(rng, -1, 1);
    dqkv.fill(0);  // the gradient alone: an O(1) start would hide its error under the final rounding
    const Ref ref = reference(c, qkv.values(), dout.values(), dqkv.values(), dp);
    const KernelRun got = run_kernel(c, qkv, dout, dqkv, dp);
    worst[0] = std::max(worst[0], check(got.out, ref.out, ref.tol_out, "out"));
    worst[1] = std::max(worst[1], check(got.lse, ref.lse, ref.tol_lse, "lse"));
    // dq, dk, dv: the column ranges [0, C), [C, C + NKV·HS), [C + NKV·HS, W) of each dqkv row.
    const char* names[3] = {"dq", "dk", "dv"};
    const std::int64_t lo[4] = {0, C, C + NKV * c.HS, W};
    for (int part = 0; part < 3; ++part) {
      std::vector<double> g, w, t;
      for (std::int64_t bt = 0; bt < B * T; ++bt)
        for (std::int64_t col = lo[part]; col < lo[part + 1]; ++col) {
          const auto e = static_cast<std::size_t>(bt * W + col);
          g.push_back(got.dqkv[e]);
          w.push_back(ref.dqkv[e]);
          t.push_back(ref.tol_dqkv[e]);
        }
      worst[2 + part] = std::max(worst[2 + part], check(g, w, t, names[part]));
    }
  }
  std::printf("[ bf16 attention, %s path ] worst |error| / bound: out %.3f, lse %.3f, dq %.3f, dk %.3f, dv %.3f\n",
              cpu::cpu_bf16_attention_path(), worst[0], worst[1], worst[2], worst[3], worst[4]);
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

}  // namespace

// The dot-product path is the default for bf16 storage where the CPU has AVX512-BF16 (and the
// environment does not say DSTRAIN_CPU_BF16_ATTENTION=0), and the switch selects the other one.
TEST(Bf16Attention, DotProductPathTakenWhereTheCpuHasIt) {
  EXPECT_EQ(cpu::cpu_bf16_attention_supported(), cpu_has_avx512_bf16());
  const char* env = std::getenv("DSTRAIN_CPU_BF16_ATTENTION");
  const bool env_off = env != nullptr && std::string(env) == "0";
  if (!cpu_has_avx512_bf16()) {
    EXPECT_STREQ(cpu::cpu_bf16_attention_path(), "fp32");
    GTEST_SKIP() << "this CPU has no AVX512-BF16: bf16 attention takes the fp32 path";
  }
  if (!env_off) {
    EXPECT_STREQ(cpu::cpu_bf16_attention_path(), "avx512_bf16");
  } else {
    EXPECT_STREQ(cpu::cpu_bf16_attention_path(), "fp32");  // DSTRAIN_CPU_BF16_ATTENTION=0
  }
  const PathGuard guard;
  cpu::set_cpu_bf16_attention(false);
  EXPECT_STREQ(cpu::cpu_bf16_attention_path(), "fp32");
  cpu::set_cpu_bf16_attention(true);
  EXPECT_STREQ(cpu::cpu_bf16_attention_path(), "avx512_bf16");
  // The two paths round differently (P in bf16): the switch really changes the kernel.
  const Bf16Case c = kCases[2];
  std::mt19937_64 rng(62);
  const std::int64_t B = c.B, T = c.T, NH = c.NH, C = NH * c.HS, W = 3 * C;
  Buf qkv(DType::bf16, B * T * W), dout(DType::bf16, B * T * C), d1(DType::bf16, B * T * W), d2(DType::bf16, B * T * W);
  qkv.fill_uniform(rng, -1.5, 1.5);
  dout.fill_uniform(rng, -1, 1);
  const KernelRun a = run_kernel(c, qkv, dout, d1, {});
  cpu::set_cpu_bf16_attention(false);
  const KernelRun b = run_kernel(c, qkv, dout, d2, {});
  cpu::set_cpu_bf16_attention(true);
  EXPECT_NE(a.out, b.out);
  EXPECT_NE(a.dqkv, b.dqkv);
}

TEST(Bf16Attention, DotProductPathMatchesFp64Reference) {
  if (!cpu::cpu_bf16_attention_supported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  check_all_cases(true);
}

// The generic path (fp32 tiles) rounds less: it meets the same bound.
TEST(Bf16Attention, GenericPathMatchesFp64Reference) { check_all_cases(false); }

// Parallel over (b, KV head) and query blocks, dk/dv summed in head order: the dot-product path's
// results do not depend on the thread count.
TEST(Bf16Attention, DotProductPathIsThreadCountInvariant) {
  if (!cpu::cpu_bf16_attention_supported()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  const PathGuard guard;
  cpu::set_cpu_bf16_attention(true);
  const Bf16Case c{"gqa_window_dropout", 2, 80, 8, 2, 40, 50, 0.1f};
  std::mt19937_64 rng(63);
  const std::int64_t B = c.B, T = c.T, NH = c.NH, NKV = c.NKV, C = NH * c.HS, W = (NH + 2 * NKV) * c.HS;
  const DropoutParams dp{c.dropout_p, RngKey{3, 4, 5, 6, 0}};
  Buf qkv(DType::bf16, B * T * W), dout(DType::bf16, B * T * C), d(DType::bf16, B * T * W);
  qkv.fill_uniform(rng, -1.5, 1.5);
  dout.fill_uniform(rng, -1, 1);
  std::vector<KernelRun> runs;
  for (int threads : {1, 2, 3}) {
    d.fill(0);
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    runs.push_back(run_kernel(c, qkv, dout, d, dp));
    omp_set_num_threads(before);
  }
  for (std::size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(runs[r].out, runs[0].out);
    EXPECT_EQ(runs[r].lse, runs[0].lse);
    EXPECT_EQ(runs[r].dqkv, runs[0].dqkv);
  }
}
