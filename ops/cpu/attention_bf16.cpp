// Causal self-attention for bf16 storage with AVX512-BF16 tile products (vdpbf16ps: 32 bf16
// pairs dot-producted into 16 fp32 lanes, twice the fp32 FMA rate). The same flash-style
// schedule as ops/cpu/attention.cpp (forward: a block of kQB queries against blocks of kKB keys
// with an online softmax; backward: key blocks outer, parallel over (b, KV head), the query heads
// of a group adding into one dk/dv tile in head order), but the tiles stay bf16:
//   forward   S = Q·Kᵀ (q, k as stored), scaled by 1/sqrt(HS) in fp32; O += bf16(P̃)·V
//   backward  S = Q·Kᵀ and dP̃ = dO·Vᵀ (as stored); dV += bf16(P̃)ᵀ·dO, dK += bf16(dS)ᵀ·Q,
//             dQ += bf16(dS)·K
// with every accumulator, the running max/sum, lse and the softmax itself in fp32 (what it rounds
// is stated in ops/kernels/attention.h). vdpbf16ps computes acc + a0·b0 + a1·b1 per lane with the
// products exact in fp32, round-to-nearest-even, denormal inputs and outputs flushed to zero.
//
// Operand layouts: vdpbf16ps multiplies pairs of adjacent bf16 (one 32-bit lane) of one vector
// with the pairs of another, so the operand that is broadcast holds a pair along the reduced
// dimension and the operand that is loaded holds, per 32-bit lane, the pair of the same two
// reduced indices for one output column. Forward scores run transposed, a lane per query: q's
// head-dim pairs transposed once per task (qt[d/2][query]), k's pairs broadcast straight from
// qkv, so the online softmax is 16 queries wide; P̃ᵀ then holds pairs of consecutive keys per
// query (pt[key/2][query]) against v in key pairs (vp[key/2][d]). Backward: k and v in head-dim
// pairs with a lane per key (kp[d/2][key], for S and dP̃, packed once per key block for every
// query head and block), q and dout in head-dim pairs per query (broadcast), and in query pairs
// (qpk[query/2][d], for dK, dV), k in key pairs (kpk[key/2][d], for dQ). Odd HS, a key or query
// block cut short by T, and masked probabilities are zero-padded pairs: a zero times a finite
// pad adds nothing, and no pad is ever left uninitialised (0·NaN would poison a lane).
//
// The kernels are compiled for AVX512-BF16 through a target pragma, not -mavx512bf16 on the file
// (the reason is in ops/cpu/isa_target.h: inline header functions must keep the baseline ISA);
// the OpenMP drivers stay outside the pragma and call per-task functions inside it.
#include "ops/cpu/attention_bf16.h"
#include "ops/error.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "ops/kernels/attention.h"

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10))
#define DSTRAIN_ATTENTION_BF16_KERNELS 1
#include <immintrin.h>
#else
#define DSTRAIN_ATTENTION_BF16_KERNELS 0
#endif

namespace dstrain::cpu {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_enabled{kUnset};

// DSTRAIN_CPU_BF16_ATTENTION: unset or 1 (the default), or 0; anything else is refused, naming the
// variable, as DSTRAIN_CPU_BF16_GEMM is (the run's start line reads it, so before step 1).
bool env_enabled() {
  const char* e = std::getenv("DSTRAIN_CPU_BF16_ATTENTION");
  if (e == nullptr || std::string_view(e) == "1") return true;
  if (std::string_view(e) == "0") return false;
  fail("DSTRAIN_CPU_BF16_ATTENTION={}: use 0 (bf16 attention on fp32 tiles) or 1 (AVX512-BF16 dot products where the CPU has them; the default)",
       e);
}

}  // namespace

bool cpu_bf16_attention_supported() {
#if DSTRAIN_ATTENTION_BF16_KERNELS
  // libgcc's CPU model also checks that the OS saves the ZMM state (XGETBV).
  static const bool ok = __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512bw") != 0 &&
                         __builtin_cpu_supports("avx512vl") != 0 && __builtin_cpu_supports("avx512bf16") != 0;
  return ok;
#else
  return false;
#endif
}

bool cpu_bf16_attention_enabled() {
  int v = g_enabled.load(std::memory_order_acquire);
  if (v == kUnset) {
    g_enabled.compare_exchange_strong(v, env_enabled() ? 1 : 0, std::memory_order_acq_rel);
    v = g_enabled.load(std::memory_order_acquire);
  }
  return v != 0 && cpu_bf16_attention_supported();
}

void set_cpu_bf16_attention(bool enabled) { g_enabled.store(enabled ? 1 : 0, std::memory_order_release); }

const char* cpu_bf16_attention_path() { return cpu_bf16_attention_enabled() ? "avx512_bf16" : "fp32"; }

}  // namespace dstrain::cpu

#if DSTRAIN_ATTENTION_BF16_KERNELS

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,prefer-vector-width=512")
// GCC 12's AVX-512 intrinsics (_mm512_max_ps, ...) pass _mm512_undefined_ps() (a self-initialised
// variable) as the unused merge source: a false -Wmaybe-uninitialized once inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dstrain::cpu::avx512bf16 {
namespace {

using u32 = std::uint32_t;
using u16 = std::uint16_t;

constexpr std::int64_t kMaxHS = kAttentionMaxHeadSize;
constexpr std::int64_t kMaxHP = kMaxHS / 2;  // head-dim pairs
constexpr std::int64_t kQB = 16;             // queries per block (the dot tiles are 16 rows)
constexpr std::int64_t kKB = 32;             // keys per block (two 16-lane vectors of scores)

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// Two bf16 (bits) as one vdpbf16ps pair: lo is the even element.
inline u32 pair(u16 lo, u16 hi) { return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16); }

// S[r][0..32) = sum_p A[r·as + p] · B[p][0..32) for r < 16 (pairs, fp32 accumulation): the rows of
// A (queries; pairs along the head dimension) against 32 columns of B (keys).
inline void dot_tile(float (*S)[kKB], const u32* A, std::int64_t as, const u32 (*B)[kKB], std::int64_t np) {
  for (std::int64_t r0 = 0; r0 < kQB; r0 += 4) {
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(), c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    const u32* a = A + r0 * as;
    for (std::int64_t p = 0; p < np; ++p) {
      const __m512bh b0 = as_bh(_mm512_load_si512(B[p])), b1 = as_bh(_mm512_load_si512(B[p] + 16));
      const __m512bh a0 = as_bh(_mm512_set1_epi32(static_cast<int>(a[p])));
      const __m512bh a1 = as_bh(_mm512_set1_epi32(static_cast<int>(a[as + p])));
      const __m512bh a2 = as_bh(_mm512_set1_epi32(static_cast<int>(a[2 * as + p])));
      const __m512bh a3 = as_bh(_mm512_set1_epi32(static_cast<int>(a[3 * as + p])));
      c00 = _mm512_dpbf16_ps(c00, a0, b0);
      c01 = _mm512_dpbf16_ps(c01, a0, b1);
      c10 = _mm512_dpbf16_ps(c10, a1, b0);
      c11 = _mm512_dpbf16_ps(c11, a1, b1);
      c20 = _mm512_dpbf16_ps(c20, a2, b0);
      c21 = _mm512_dpbf16_ps(c21, a2, b1);
      c30 = _mm512_dpbf16_ps(c30, a3, b0);
      c31 = _mm512_dpbf16_ps(c31, a3, b1);
    }
    _mm512_store_ps(S[r0], c00);
    _mm512_store_ps(S[r0] + 16, c01);
    _mm512_store_ps(S[r0 + 1], c10);
    _mm512_store_ps(S[r0 + 1] + 16, c11);
    _mm512_store_ps(S[r0 + 2], c20);
    _mm512_store_ps(S[r0 + 2] + 16, c21);
    _mm512_store_ps(S[r0 + 3], c30);
    _mm512_store_ps(S[r0 + 3] + 16, c31);
  }
}

// Acc[r][0..16·NV) += sum_p A[r·as + p·ps] · B[p][0..16·NV) for r < rows (a multiple of 4): rows
// of pairs along the reduced dimension against B's pairs, 4 rows × NV vectors per register block.
template <int NV>
inline void accum_block(float* acc, std::int64_t cs, const u32* A, std::int64_t as, const u32* B, std::int64_t bs, std::int64_t rows, std::int64_t np,
                        std::int64_t ps) {
  for (std::int64_t r = 0; r < rows; r += 4) {
    __m512 c[4][NV];
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < NV; ++v) c[k][v] = _mm512_load_ps(acc + (r + k) * cs + 16 * v);
    const u32* a = A + r * as;
    for (std::int64_t p = 0; p < np; ++p) {
      __m512bh b[NV];
      for (int v = 0; v < NV; ++v) b[v] = as_bh(_mm512_load_si512(B + p * bs + 16 * v));
      for (int k = 0; k < 4; ++k) {
        const __m512bh ak = as_bh(_mm512_set1_epi32(static_cast<int>(a[k * as + p * ps])));
        for (int v = 0; v < NV; ++v) c[k][v] = _mm512_dpbf16_ps(c[k][v], ak, b[v]);
      }
    }
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < NV; ++v) _mm512_store_ps(acc + (r + k) * cs + 16 * v, c[k][v]);
  }
}

inline void accum_rows(float* acc, std::int64_t cs, const u32* A, std::int64_t as, const u32* B, std::int64_t bs, std::int64_t rows, std::int64_t np,
                       std::int64_t nvec, std::int64_t ps = 1) {
  for (std::int64_t v0 = 0; v0 < nvec; v0 += 4) {
    switch (std::min<std::int64_t>(4, nvec - v0)) {
      case 4:
        accum_block<4>(acc + 16 * v0, cs, A, as, B + 16 * v0, bs, rows, np, ps);
        break;
      case 3:
        accum_block<3>(acc + 16 * v0, cs, A, as, B + 16 * v0, bs, rows, np, ps);
        break;
      case 2:
        accum_block<2>(acc + 16 * v0, cs, A, as, B + 16 * v0, bs, rows, np, ps);
        break;
      default:
        accum_block<1>(acc + 16 * v0, cs, A, as, B + 16 * v0, bs, rows, np, ps);
        break;
    }
  }
}

// 32 fp32 -> 32 bf16 (round to nearest even), in order: as 16 pairs of consecutive elements.
inline void round_row(u32* dst, const float* src) {
  const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_load_ps(src + 16), _mm512_load_ps(src));
  _mm512_store_si512(dst, (__m512i)r);
}

// Pairs of head-dim elements of one bf16 row of HS: dst[p] = (x[2p], x[2p+1]), 0 past HS.
inline void pack_row_pairs(u32* dst, const bf16_t* x, std::int64_t HS) {
  for (std::int64_t p = 0; p < HS / 2; ++p) dst[p] = pair(x[2 * p].bits, x[2 * p + 1].bits);
  if (HS % 2 != 0) dst[HS / 2] = pair(x[HS - 1].bits, 0);
}

// 16 bf16 of row x from element d (the first n <= 16 of them, 0 past n), zero-extended to 16
// u32 lanes; a masked load, which never touches the masked elements. nullptr: zeros.
inline __m512i load16(const bf16_t* x, std::int64_t d, std::int64_t n) {
  if (x == nullptr) return _mm512_setzero_si512();
  const auto m = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
  return _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(m, x + d));  // maskz: no GCC 12 -Wmaybe-uninitialized on _mm512_undefined
}

// Pairs of two bf16 rows (or zero rows: nullptr) element by element: dst[d] = (x0[d], x1[d]) for
// d < HS, 0 up to HSP (a multiple of 16; dst 64-byte aligned).
inline void pack_two_rows(u32* dst, const bf16_t* x0, const bf16_t* x1, std::int64_t HS, std::int64_t HSP) {
  for (std::int64_t d = 0; d < HSP; d += 16) {
    const std::int64_t n = std::min<std::int64_t>(16, HS - d);
    _mm512_store_si512(dst + d, _mm512_or_si512(load16(x0, d, n), _mm512_maskz_slli_epi32(0xffff, load16(x1, d, n), 16)));
  }
}

// The head-dim pairs of kKB rows, transposed: dst[p][jj] = (x_jj[2p], x_jj[2p+1]) for rows
// x_jj = x + jj·stride, jj < jn, and p < HS/2 (gathers of 16 rows); the half pair past an odd HS
// and the rows past jn are 0.
inline void pack_pairs_transposed(u32 (*dst)[kKB], const bf16_t* x, std::int64_t stride, std::int64_t jn, std::int64_t HS) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int>(stride * static_cast<std::int64_t>(sizeof(bf16_t)))));
  const auto m0 = static_cast<__mmask16>(jn >= 16 ? 0xffffu : (1u << jn) - 1u);
  const auto m1 = static_cast<__mmask16>(jn >= 32 ? 0xffffu : jn > 16 ? (1u << (jn - 16)) - 1u : 0u);
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t p = 0; p < HS / 2; ++p) {
    _mm512_store_si512(dst[p], _mm512_mask_i32gather_epi32(zero, m0, idx, x + 2 * p, 1));
    _mm512_store_si512(dst[p] + 16, m1 != 0 ? _mm512_mask_i32gather_epi32(zero, m1, idx, x + 16 * stride + 2 * p, 1) : zero);
  }
  if (HS % 2 != 0) {
    for (std::int64_t jj = 0; jj < kKB; ++jj) dst[HS / 2][jj] = jj < jn ? pair(x[jj * stride + HS - 1].bits, 0) : 0;
  }
}


// cpu::fast_exp on 16 lanes: the same operations in the same order (no FMA), so the same results.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.37f));
  const __m512 big = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), big), big);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  const __m512 er = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_maskz_slli_epi32(0xffff, _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(er, _mm512_castsi512_ps(e));
}

// One forward task: query block qb of (b, h). The scores are computed transposed, a lane per query
// (st[key] = 16 queries), so that k is broadcast pair by pair straight from qkv (nothing to pack
// per key block) and the online softmax runs on 16 queries at once; q is transposed once per task.
void forward_task(bf16_t* out, float* lse, const bf16_t* qkv, const AttShape& s, const DropoutParams& dp, std::int64_t bh, std::int64_t qb) {
  const std::int64_t T_ = s.T, C = s.C, NH = s.NH, HS = s.HS, C3 = s.W;
  const std::int64_t HP = (HS + 1) / 2, NV = (HS + 15) / 16, HSP = NV * 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool drop = dp.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - dp.p) : 1.0f;
  const std::int64_t b = bh / NH, h = bh % NH;
  const std::int64_t i0 = qb * kQB, qn = std::min(kQB, T_ - i0);
  const bf16_t* base = qkv + b * T_ * C3;
  // About 30 KiB of tiles at HS = 128.
  alignas(64) u32 qt[kMaxHP][kQB], vp[kKB / 2][kMaxHS], pt[kKB / 2][kQB];  // q: head-dim pairs, a lane per query; v: key pairs; P̃ᵀ: key pairs
  alignas(64) float acc[kQB][kMaxHS], st[kKB][kQB], md[kKB][kQB], corr[kQB], lsum[kQB], mrow[kQB];
  for (std::int64_t p = 0; p < HP; ++p)
    for (std::int64_t ii = 0; ii < kQB; ++ii) {
      const bf16_t* qi = base + (i0 + ii) * C3 + h * HS;
      qt[p][ii] = ii >= qn ? 0 : pair(qi[2 * p].bits, 2 * p + 1 < HS ? qi[2 * p + 1].bits : u16{0});
    }
  for (std::int64_t ii = 0; ii < kQB; ++ii)
    for (std::int64_t d = 0; d < HSP; ++d) acc[ii][d] = 0.0f;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = ninf, l = _mm512_setzero_ps();
  const __m512i lane_i = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(i0)), _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  const auto lane_ok = static_cast<__mmask16>(qn >= 16 ? 0xffffu : (1u << qn) - 1u);
  // Interleaves two 16-lane bf16 halves (a | b) into 16 pairs (a_i, b_i).
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const std::int64_t koff = s.koff + (h / s.G) * HS, voff = s.voff + (h / s.G) * HS;
  for (std::int64_t j0 = std::max<std::int64_t>(0, i0 - s.win + 1) / kKB * kKB; j0 < i0 + qn; j0 += kKB) {
    const std::int64_t jn = std::min(kKB, i0 + qn - j0);
    for (std::int64_t t = 0; t < kKB / 2; ++t) {
      const bf16_t* v0 = 2 * t < jn ? base + (j0 + 2 * t) * C3 + voff : nullptr;
      const bf16_t* v1 = 2 * t + 1 < jn ? base + (j0 + 2 * t + 1) * C3 + voff : nullptr;
      pack_two_rows(vp[t], v0, v1, HS, HSP);
    }
    // st[jj] = q_i · k_j for the 16 queries, 8 keys per register block.
    for (std::int64_t jb = 0; jb < jn; jb += 8) {
      __m512 c[8];
      const bf16_t* kr[8];
      for (int k = 0; k < 8; ++k) {
        c[k] = _mm512_setzero_ps();
        kr[k] = base + (j0 + std::min<std::int64_t>(jb + k, jn - 1)) * C3 + koff;  // past jn: a repeat, masked below
      }
      for (std::int64_t p = 0; p < HS / 2; ++p) {
        const __m512bh qv = as_bh(_mm512_load_si512(qt[p]));
        for (int k = 0; k < 8; ++k) {
          u32 kv;
          std::memcpy(&kv, kr[k] + 2 * p, sizeof kv);
          c[k] = _mm512_dpbf16_ps(c[k], as_bh(_mm512_set1_epi32(static_cast<int>(kv))), qv);
        }
      }
      if (HS % 2 != 0) {
        const __m512bh qv = as_bh(_mm512_load_si512(qt[HS / 2]));
        for (int k = 0; k < 8; ++k) c[k] = _mm512_dpbf16_ps(c[k], as_bh(_mm512_set1_epi32(static_cast<int>(pair(kr[k][HS - 1].bits, 0)))), qv);
      }
      for (int k = 0; k < 8; ++k) _mm512_store_ps(st[jb + k], c[k]);
    }
    // Visible: key j <= query i, j > i - win, query in the block; the rest -inf.
    __m512 cm = ninf;
    for (std::int64_t jj = 0; jj < jn; ++jj) {
      const __m512i j = _mm512_set1_epi32(static_cast<int>(j0 + jj));
      const __mmask16 vis = lane_ok & _mm512_cmp_epi32_mask(j, lane_i, _MM_CMPINT_LE) &
                            _mm512_cmp_epi32_mask(j, _mm512_sub_epi32(lane_i, _mm512_set1_epi32(static_cast<int>(s.win))), _MM_CMPINT_NLE);
      const __m512 x = _mm512_mask_mul_ps(ninf, vis, _mm512_load_ps(st[jj]), _mm512_set1_ps(scale));  // the scale on the fp32 scores
      _mm512_store_ps(st[jj], x);
      cm = _mm512_max_ps(cm, x);
    }
    const __m512 mn = _mm512_max_ps(m, cm);
    const __mmask16 live = _mm512_cmp_ps_mask(mn, ninf, _CMP_NEQ_OQ);  // lanes that have seen a key
    const __m512 mref = _mm512_maskz_mov_ps(live, mn);
    const __m512 cr = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_OQ), exp16(_mm512_sub_ps(m, mref)));  // 0 on a lane's first keys
    __m512 psum = _mm512_setzero_ps();
    if (drop) {
      for (std::int64_t jj = 0; jj < kKB; ++jj)
        for (std::int64_t ii = 0; ii < kQB; ++ii) md[jj][ii] = 0.0f;
      for (std::int64_t ii = 0; ii < qn; ++ii) {
        const std::int64_t i = i0 + ii;
        const std::int64_t jmax = std::min(jn, i - j0 + 1), jlo = std::max<std::int64_t>(0, i - s.win + 1 - j0);
        if (jmax <= jlo) continue;
        float row[kKB];
        attention_dropout_scales(dp.rng, static_cast<std::uint64_t>((bh * T_ + i) * T_ + j0 + jlo), jmax - jlo, dp.p, keep_scale, row);
        for (std::int64_t jj = jlo; jj < jmax; ++jj) md[jj][ii] = row[jj - jlo];
      }
    }
    for (std::int64_t jj = 0; jj < kKB; ++jj) {
      __m512 pj = _mm512_setzero_ps();
      if (jj < jn) {
        const __m512 x = _mm512_load_ps(st[jj]);
        pj = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, ninf, _CMP_NEQ_OQ), exp16(_mm512_sub_ps(x, mref)));
        psum = _mm512_add_ps(psum, pj);
        if (drop) pj = _mm512_mul_ps(pj, _mm512_load_ps(md[jj]));
      }
      _mm512_store_ps(st[jj], pj);
    }
    l = _mm512_add_ps(_mm512_mul_ps(l, cr), psum);
    m = mn;
    // P̃ rounded to bf16, transposed into key pairs: pt[t][i] = (P̃_i,2t, P̃_i,2t+1).
    for (std::int64_t t = 0; t < kKB / 2; ++t) {
      const __m512i two = (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(st[2 * t + 1]), _mm512_load_ps(st[2 * t]));
      _mm512_store_si512(pt[t], _mm512_permutexvar_epi16(zip, two));
    }
    _mm512_store_ps(corr, cr);
    for (std::int64_t ii = 0; ii < kQB; ++ii) {
      const __m512 f = _mm512_set1_ps(corr[ii]);
      for (std::int64_t d = 0; d < HSP; d += 16) _mm512_store_ps(acc[ii] + d, _mm512_mul_ps(_mm512_load_ps(acc[ii] + d), f));
    }
    accum_rows(acc[0], kMaxHS, pt[0], 1, vp[0], kMaxHS, kQB, (jn + 1) / 2, NV, kQB);
  }
  _mm512_store_ps(lsum, l);
  _mm512_store_ps(mrow, m);
  for (std::int64_t ii = 0; ii < qn; ++ii) {
    const float inv = 1.0f / lsum[ii];
    bf16_t* __restrict oi = out + (b * T_ + i0 + ii) * C + h * HS;
    for (std::int64_t d = 0; d < HS; ++d) oi[d] = store<bf16_t>(acc[ii][d] * inv);
    lse[bh * T_ + i0 + ii] = mrow[ii] + std::log(lsum[ii]);
  }
}

// One backward task: KV head g of batch row b, its G query heads in order.
void backward_task(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const float* lse, float* scratch, const AttShape& s, const DropoutParams& dp,
                   std::int64_t bg) {
  const std::int64_t T_ = s.T, C = s.C, NH = s.NH, HS = s.HS, C3 = s.W, NKV = s.NKV, G = s.G;
  const std::int64_t HP = (HS + 1) / 2, NV = (HS + 15) / 16, HSP = NV * 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool drop = dp.p > 0.0f;
  const float keep_scale = drop ? 1.0f / (1.0f - dp.p) : 1.0f;
  const std::int64_t B = s.B;
  float* dq = scratch;
  const float* Dsum = scratch + B * T_ * C;
  const std::int64_t b = bg / NKV, g = bg % NKV;
  const bf16_t* base = qkv + b * T_ * C3;
  const bf16_t* gbase = dout + b * T_ * C;
  float* dqg = dq + b * T_ * C + g * G * HS;
  for (std::int64_t i = 0; i < T_; ++i)
    for (std::int64_t d = 0; d < G * HS; ++d) dqg[i * C + d] = 0.0f;
  // About 87 KiB of tiles at HS = 128.
  alignas(64) u32 kp[kMaxHP][kKB], vtp[kMaxHP][kKB];  // k, v of the key block: head-dim pairs, a lane per key (S, dP̃)
  alignas(64) u32 kpk[kKB / 2][kMaxHS];               // k: key pairs, a lane per head-dim element (dQ)
  alignas(64) float dk[kKB][kMaxHS], dv[kKB][kMaxHS];
  alignas(64) u32 qp[kQB][kMaxHP], gp[kQB][kMaxHP];          // q, dout of the query block: head-dim pairs (S, dP̃)
  alignas(64) u32 qpk[kQB / 2][kMaxHS], gpk[kQB / 2][kMaxHS];  // query pairs (dK, dV)
  alignas(64) float sp[kQB][kKB], sd[kQB][kKB], dqt[kQB][kMaxHS];
  alignas(64) u32 prow[kQB][kKB / 2], dsrow[kQB][kKB / 2];  // P̃, dS in bf16, rows = queries
  alignas(64) u16 pt[kKB][kQB], dst[kKB][kQB];              // the same transposed: rows = keys, query pairs
  const std::int64_t koff = s.koff + g * HS, voff = s.voff + g * HS;
  for (std::int64_t j0 = 0; j0 < T_; j0 += kKB) {
    const std::int64_t jn = std::min(kKB, T_ - j0);
    pack_pairs_transposed(kp, base + j0 * C3 + koff, C3, jn, HS);
    pack_pairs_transposed(vtp, base + j0 * C3 + voff, C3, jn, HS);
    for (std::int64_t jj = 0; jj < kKB; ++jj)
      for (std::int64_t d = 0; d < HSP; ++d) dk[jj][d] = dv[jj][d] = 0.0f;
    for (std::int64_t t = 0; t < kKB / 2; ++t) {
      const bf16_t* k0 = 2 * t < jn ? base + (j0 + 2 * t) * C3 + koff : nullptr;
      const bf16_t* k1 = 2 * t + 1 < jn ? base + (j0 + 2 * t + 1) * C3 + koff : nullptr;
      pack_two_rows(kpk[t], k0, k1, HS, HSP);
    }
    for (std::int64_t h = g * G; h < (g + 1) * G; ++h) {
      const std::int64_t bh = b * NH + h;
      const float* lse_bh = lse + bh * T_;
      const float* D_bh = Dsum + bh * T_;
      float* dqb = dq + b * T_ * C + h * HS;
      // Causal: only queries i >= j0; window: only queries i < j0 + jn - 1 + win.
      const std::int64_t iend = std::min(T_, j0 + jn - 1 + s.win);
      for (std::int64_t i0 = j0; i0 < iend; i0 += kQB) {
        const std::int64_t qn = std::min(kQB, T_ - i0);
        for (std::int64_t ii = 0; ii < kQB; ++ii) {
          if (ii < qn) {
            pack_row_pairs(qp[ii], base + (i0 + ii) * C3 + h * HS, HS);
            pack_row_pairs(gp[ii], gbase + (i0 + ii) * C + h * HS, HS);
          } else {
            for (std::int64_t p = 0; p < HP; ++p) qp[ii][p] = gp[ii][p] = 0;
          }
        }
        for (std::int64_t u = 0; u < kQB / 2; ++u) {
          const bool has0 = 2 * u < qn, has1 = 2 * u + 1 < qn;
          pack_two_rows(qpk[u], has0 ? base + (i0 + 2 * u) * C3 + h * HS : nullptr, has1 ? base + (i0 + 2 * u + 1) * C3 + h * HS : nullptr, HS, HSP);
          pack_two_rows(gpk[u], has0 ? gbase + (i0 + 2 * u) * C + h * HS : nullptr, has1 ? gbase + (i0 + 2 * u + 1) * C + h * HS : nullptr, HS, HSP);
        }
        dot_tile(sp, qp[0], kMaxHP, kp, HP);   // scores (unscaled)
        dot_tile(sd, gp[0], kMaxHP, vtp, HP);  // dP̃ = dout_i · v_j
        for (std::int64_t ii = 0; ii < kQB; ++ii) {
          const std::int64_t i = i0 + ii;
          const std::int64_t jmax = ii < qn ? std::min(jn, i - j0 + 1) : 0;        // keys j <= i
          const std::int64_t jlo = std::max<std::int64_t>(0, i - s.win + 1 - j0);  // keys j > i - win
          float* __restrict spr = sp[ii];
          float* __restrict sdr = sd[ii];
          // sp <- P̃ = P * mask (for dv);  sd <- dS * scale = P (dP̃ * mask - D_i) * scale; 0 where masked
          if (jmax <= jlo) {
            for (std::int64_t jj = 0; jj < kKB; ++jj) spr[jj] = sdr[jj] = 0.0f;
          } else {
            const float li = lse_bh[i], Di = D_bh[i];
            float md[kKB];
            for (std::int64_t jj = 0; jj < kKB; ++jj) md[jj] = 1.0f;
            if (drop) attention_dropout_scales(dp.rng, static_cast<std::uint64_t>((bh * T_ + i) * T_ + j0 + jlo), jmax - jlo, dp.p, keep_scale, md + jlo);
            for (std::int64_t jj = 0; jj < kKB; ++jj) {
              const bool vis = jj >= jlo && jj < jmax;
              const float p = vis ? fast_exp(spr[jj] * scale - li) : 0.0f;
              spr[jj] = p * md[jj];
              sdr[jj] = vis ? p * (sdr[jj] * md[jj] - Di) * scale : 0.0f;
            }
          }
          round_row(prow[ii], spr);
          round_row(dsrow[ii], sdr);
        }
        const auto* pb = reinterpret_cast<const u16*>(prow[0]);
        const auto* db = reinterpret_cast<const u16*>(dsrow[0]);
        for (std::int64_t jj = 0; jj < kKB; ++jj)
          for (std::int64_t ii = 0; ii < kQB; ++ii) {
            pt[jj][ii] = pb[ii * kKB + jj];
            dst[jj][ii] = db[ii * kKB + jj];
          }
        const std::int64_t nqp = (qn + 1) / 2, nkp = (jn + 1) / 2;
        accum_rows(dv[0], kMaxHS, reinterpret_cast<const u32*>(pt[0]), kQB / 2, gpk[0], kMaxHS, kKB, nqp, NV);   // dV += P̃ᵀ dout
        accum_rows(dk[0], kMaxHS, reinterpret_cast<const u32*>(dst[0]), kQB / 2, qpk[0], kMaxHS, kKB, nqp, NV);  // dK += dSᵀ q
        for (std::int64_t ii = 0; ii < kQB; ++ii)
          for (std::int64_t d = 0; d < HSP; ++d) dqt[ii][d] = 0.0f;
        accum_rows(dqt[0], kMaxHS, dsrow[0], kKB / 2, kpk[0], kMaxHS, kQB, nkp, NV);  // dQ (this key block) = dS k
        for (std::int64_t ii = 0; ii < qn; ++ii) {
          float* __restrict dqi = dqb + (i0 + ii) * C;
          const float* __restrict t = dqt[ii];
          for (std::int64_t d = 0; d < HS; ++d) dqi[d] += t[d];
        }
      }
    }
    for (std::int64_t jj = 0; jj < jn; ++jj) {
      bf16_t* __restrict dkj = dqkv + (b * T_ + j0 + jj) * C3 + koff;
      bf16_t* __restrict dvj = dqkv + (b * T_ + j0 + jj) * C3 + voff;
      for (std::int64_t d = 0; d < HS; ++d) {
        dkj[d] = store<bf16_t>(load(dkj[d]) + dk[jj][d]);
        dvj[d] = store<bf16_t>(load(dvj[d]) + dv[jj][d]);
      }
    }
  }
  for (std::int64_t i = 0; i < T_; ++i) {
    bf16_t* __restrict dqi = dqkv + (b * T_ + i) * C3 + g * G * HS;
    const float* __restrict acc = dqg + i * C;
    for (std::int64_t d = 0; d < G * HS; ++d) dqi[d] = store<bf16_t>(load(dqi[d]) + acc[d]);
  }
}

}  // namespace
}  // namespace dstrain::cpu::avx512bf16

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace dstrain::cpu::avx512bf16 {

// The OpenMP drivers, outside the target pragma (the outlined parallel regions need no AVX-512):
// the same task split and order as ops/cpu/attention.cpp.
void attention_forward(bf16_t* out, float* lse, const bf16_t* qkv, const AttShape& s, const DropoutParams& dp) {
  const std::int64_t nqb = (s.T + kQB - 1) / kQB, ntask = s.B * s.NH * nqb;
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(s.B * s.NH * s.T * s.T * s.HS / 2))
  for (std::int64_t task = 0; task < ntask; ++task) {
    forward_task(out, lse, qkv, s, dp, task / nqb, nqb - 1 - task % nqb);  // long (late) query blocks first
  }
}

void attention_backward(bf16_t* dqkv, const bf16_t* dout, const bf16_t* qkv, const bf16_t* out, const float* lse, float* scratch, const AttShape& s,
                        const DropoutParams& dp) {
  const std::int64_t B = s.B, T_ = s.T, C = s.C, NH = s.NH, HS = s.HS;
  float* Dsum = scratch + B * T_ * C;  // (B, NH, T): D_i = dout_i · out_i, fp32 as in the generic path
#pragma omp parallel for schedule(static) if (parallel_worth(B * T_ * C))
  for (std::int64_t bti = 0; bti < B * T_; ++bti) {
    const std::int64_t b = bti / T_, i = bti % T_;
    for (std::int64_t h = 0; h < NH; ++h) {
      const bf16_t* __restrict go = dout + bti * C + h * HS;
      const bf16_t* __restrict oo = out + bti * C + h * HS;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (std::int64_t d = 0; d < HS; ++d) acc += load(go[d]) * load(oo[d]);
      Dsum[(b * NH + h) * T_ + i] = acc;
    }
  }
#pragma omp parallel for schedule(dynamic, 1) if (parallel_worth(B * NH * T_ * T_ * HS))
  for (std::int64_t bg = 0; bg < B * s.NKV; ++bg) backward_task(dqkv, dout, qkv, lse, scratch, s, dp, bg);
}

}  // namespace dstrain::cpu::avx512bf16

#else  // no AVX512-BF16 kernels in this build: cpu_bf16_attention_supported() is false, never called

namespace dstrain::cpu::avx512bf16 {
void attention_forward(bf16_t*, float*, const bf16_t*, const AttShape&, const DropoutParams&) {}
void attention_backward(bf16_t*, const bf16_t*, const bf16_t*, const bf16_t*, const float*, float*, const AttShape&, const DropoutParams&) {}
}  // namespace dstrain::cpu::avx512bf16

#endif
