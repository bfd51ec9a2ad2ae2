// Causal self-attention on the tensor cores (fp16 / bf16 storage, HS in {32, 64, 128}):
// FlashAttention-2 style, forward and backward, O(T) memory (only lse is saved), deterministic.
// The contract is ops/kernels/attention.h's, as ops/cpu/attention.cpp computes it; fp32 storage
// and other head sizes stay on the warp-per-row kernels of attention.cu (kernels.cpp decides).
//
// Building blocks: mma.sync.m16n8k16 (16-bit inputs, fp32 accumulators) fed by ldmatrix from
// shared memory, tiles staged with cp.async (16-byte chunks, rows past T zero-filled so no
// garbage, NaN included, ever enters a product). Shared rows are padded by 8 elements (16 bytes)
// so the 8 row addresses of an ldmatrix fall in 8 different bank groups (no conflicts).
// Per warp: 16-row slabs (m-tiles, the mma's M) of the block's tile; a block is 4 warps.
// Grouped KV heads (Llama, Mistral, Qwen; NKV = NH is GPT-2's multi-head case): qkv rows are
// (NH + 2·NKV)·HS wide and query head h reads KV head h / (NH / NKV) (TcDims). Forward and dQ
// blocks belong to a query head and read their KV head's rows; a dK/dV block belongs to a KV head
// and runs the query tiles of each query head of its group in head order into the same fp32
// accumulators (one rounding at the end, no atomics), so K and V are loaded once per group.
//
// Forward (grid: one block per (query block, b, h), the longest query blocks first): query
//   blocks of 128 (each warp 2 m-tiles of 16 rows, so each K/V fragment loaded by ldmatrix feeds
//   two mma) at HS <= 64 without dropout, of 64 (1 m-tile per warp) at HS = 128 or with dropout
//   (registers). Q tile -> registers as mma A fragments once. Key blocks of 64 (K and V tiles
//   double buffered with cp.async: the next block loads while this one computes), only blocks up
//   to the diagonal (fully masked blocks are never loaded; a warp skips a block wholly after its
//   rows), masks only on blocks that cross the diagonal.
//   S = Q Kᵀ (16 x 64 per m-tile in registers), online softmax in the log2 domain (the scale
//   1/sqrt(HS) and log2(e) folded into one multiply, exp2 via ex2.approx), P rounded to 16 bits
//   and reused in registers as the A operand of O += P V (the C-fragment layout of two 8-key
//   n-blocks is the A-fragment layout of one 16-key k-step). Row max and sum are kept per thread
//   and reduced over the 4 threads of a quad (fixed shuffle order). lse = (m + log2 l) ln 2.
// Backward: D_i = dout_i · out_i (a warp per (b, i, h) row), then two kernels, no atomics:
//   dK/dV: one block per (key block of 64, b, KV head), a warp per 16 keys; for each query head
//     of the group, query tiles of BR (64, or 32 at HS = 128 or with dropout, to stay in
//     registers without spills) from the key block's first query to T, Q/dO/lse/D double buffered
//     (one pipeline over the group's (head, tile) steps). Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, P from lse,
//     dSᵀ = Pᵀ ∘ (dPᵀ ∘ mask − D); dV += P̃ᵀ dO, dK += dSᵀ Q (k-dimension = the tile's queries).
//   dQ: one block per (query block of 64, b, h), key blocks 0 .. diagonal as in forward:
//     S = Q Kᵀ, dP = dO Vᵀ, dS, dQ += dS K.
//   Every output element is owned by one thread and summed over tiles in a fixed order; the
//   scale is applied once at the end (dS is kept unscaled: 8x further from fp16's subnormals).
//   dqkv += result: one load, one fp32 add, one RNE store per element.
// Dropout (template flag, so the common p = 0 path carries no RNG code): the keep scale of
// element ((b*NH + h)*T + i)*T + j from the same Philox word as the CPU, applied to P for P V /
// dV and to dP for dS; the row sum l is taken before dropout, as on the CPU.
// Why these tiles: 4 warps x (16 or 32 rows) x 64 keys keeps the score slabs and the output
// accumulators of a warp in registers at HS <= 128 without spills (checked with -Xptxas -v for
// sm_80 and sm_90), gives enough blocks at T = 1024 for 132 SMs at GPT-2 sizes (B*NH*8 or
// B*NH*16), and 64-key steps halve the synchronisations and fragment reloads of 32-key ones.
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTile = 64;        // queries per block (forward, dq); keys per block (all kernels)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// C = NH·HS is the output width; W = (NH + 2·NKV)·HS the qkv row; k of KV head g starts at column
// koff + g·HS, v at voff + g·HS; query head h reads KV head h / G (G = NH / NKV), as on the CPU.
struct TcDims {
  std::int64_t B, T, C, NH, NKV, G, W, koff, voff;
};
TcDims tc_dims(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV) {
  const std::int64_t HS = C / NH;
  return TcDims{B, T, C, NH, NKV, NH / NKV, (NH + 2 * NKV) * HS, C, C + NKV * HS};
}

using u16 = std::uint16_t;

// ---- PTX wrappers -------------------------------------------------------------------------
// cp.async and mma.m16n8k16 need sm_80 (ldmatrix sm_75). A build whose CMAKE_CUDA_ARCHITECTURES
// also lists an older target compiles these to a trap there instead of failing in ptxas, and
// attention_tc_supported keeps such GPUs on the warp-per-row kernels, so the trap never runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define DSTRAIN_TC_PTX(...) __trap()
#else
#define DSTRAIN_TC_PTX(...) asm volatile(__VA_ARGS__)
#endif

__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared; src_bytes = 0 writes zeros (rows past T).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  DSTRAIN_TC_PTX("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { DSTRAIN_TC_PTX("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  DSTRAIN_TC_PTX("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  DSTRAIN_TC_PTX("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
  DSTRAIN_TC_PTX("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename S>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  if constexpr (std::is_same_v<S, F16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Two floats -> one register of two 16-bit values (lo in the low half: the lower column), RNE.
// One cvt.rn.{f16,bf16}x2.f32: the same RNE as S::store, element by element.
template <typename S>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (std::is_same_v<S, F16>) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
  }
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// The dropout factor of element e: RngKey::element_bits's word, picked with selects rather than
// a dynamic index into the Philox output (which would live in local memory).
__device__ __forceinline__ float keep_scale_of(const RngKey& key, std::uint64_t e, float p, float keep_scale) {
  const PhiloxCounter r = key.group_bits(e >> 2);
  const unsigned k = static_cast<unsigned>(e & 3u);
  const std::uint32_t bits = k == 0 ? r.v[0] : (k == 1 ? r.v[1] : (k == 2 ? r.v[2] : r.v[3]));
  return dropout_keep(bits, p) ? keep_scale : 0.0f;
}

// dst[0..1] += (a, b): one fp32 add and one RNE rounding per element (the gradient contract).
template <typename S>
__device__ __forceinline__ void accumulate2(u16* dst, float a, float b) {
  auto* p = reinterpret_cast<unsigned*>(dst);
  const unsigned old = *p;
  *p = pack2<S>(S::load(static_cast<u16>(old & 0xffffu)) + a, S::load(static_cast<u16>(old >> 16)) + b);
}

// ---- tiles and fragments ------------------------------------------------------------------

template <int HS>
struct TileGeom {
  static constexpr int LD = HS + 8;   // padded shared row (elements): 16 bytes of padding
  static constexpr int KS = HS / 16;  // k-steps over the head dimension
  static constexpr int ND = HS / 8;   // 8-wide n-blocks over the head dimension
};

// Stage ROWS rows of HS elements (global row stride ld) into shared rows of LD; rows >= nvalid
// are zero-filled. Every thread of the block takes part (one cp.async group per caller commit).
template <int HS, int ROWS>
__device__ __forceinline__ void load_rows(u16* sm, const u16* g, std::int64_t ld, int nvalid) {
  constexpr int kChunks = HS / 8, LD = TileGeom<HS>::LD;
#pragma unroll
  for (int c = static_cast<int>(threadIdx.x); c < ROWS * kChunks; c += kTcThreads) {
    const int r = c / kChunks, k = (c % kChunks) * 8;
    const bool ok = r < nvalid;
    cp_async16(smem_u32(sm + r * LD + k), ok ? g + r * ld + k : g, ok ? 16 : 0);
  }
}

// The K/V pipeline of a loop over key blocks kb = 0 .. nkb-1, double buffered in shared memory
// (block kb in buffer kb & 1; block 0 was requested before the loop): request block kb + 1 into
// the other buffer, then wait for block kb (one cp.async group per block) and for every thread.
template <int HS>
__device__ __forceinline__ void next_kv_block(u16* sK, u16* sV, const u16* kbase, const u16* vbase, std::int64_t ld, std::int64_t T, int kb,
                                              int nkb) {
  constexpr int LD = TileGeom<HS>::LD;
  if (kb + 1 < nkb) {
    const std::int64_t k1 = static_cast<std::int64_t>(kb + 1) * kTile;
    const int nv = static_cast<int>(T - k1 < kTile ? T - k1 : kTile);
    const int next = (kb + 1) & 1;
    load_rows<HS, kTile>(sK + next * kTile * LD, kbase + k1 * ld, ld, nv);
    load_rows<HS, kTile>(sV + next * kTile * LD, vbase + k1 * ld, ld, nv);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Address (per lane) of the A fragment (16 x 16, row-major in shared) at rows r0.., cols k0..
// for ldmatrix.x4: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
template <int LD>
__device__ __forceinline__ unsigned a_addr(const u16* sm, int r0, int k0, int lane) {
  return smem_u32(sm + (r0 + (lane & 15)) * LD + k0 + ((lane >> 4) << 3));
}
// B fragments of two 8-wide n-blocks (n0.., n0+8..) at k-step k0, from a tile stored [n][k]
// (row = n): ldmatrix.x4 without transpose; r[0..1] is n-block n0, r[2..3] n-block n0+8.
template <int LD>
__device__ __forceinline__ unsigned bnk_addr(const u16* sm, int n0, int k0, int lane) {
  return smem_u32(sm + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + (((lane >> 3) & 1) << 3));
}
// The same from a tile stored [k][n] (row = k): ldmatrix.x4.trans.
template <int LD>
__device__ __forceinline__ unsigned bkn_addr(const u16* sm, int k0, int n0, int lane) {
  return smem_u32(sm + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * LD + n0 + ((lane >> 4) << 3));
}

// The A fragment of k-step kk from the fp32 C fragments of n-blocks 2kk and 2kk+1.
template <typename S>
__device__ __forceinline__ void c_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<S>(c0[0], c0[1]);
  a[1] = pack2<S>(c0[2], c0[3]);
  a[2] = pack2<S>(c1[0], c1[1]);
  a[3] = pack2<S>(c1[2], c1[3]);
}

// ---- forward ------------------------------------------------------------------------------

// m-tiles (16 query rows each) per warp in forward: 2 at HS <= 64, so every K/V fragment read
// from shared memory feeds two mma (ldmatrix bandwidth, not the tensor cores, bounds one m-tile
// per warp); 1 at HS = 128, where the output accumulators of two would not fit in registers,
// and with dropout, whose Philox rounds would then spill.
template <int HS, bool DROP>
constexpr int kFwdMT = (HS <= 64 && !DROP) ? 2 : 1;
template <int HS, bool DROP>
constexpr int kFwdRows = 64 * kFwdMT<HS, DROP>;  // queries per block: 4 warps x 16 x MT
template <int HS, bool DROP>
constexpr int fwd_smem_bytes() {
  return (kFwdRows<HS, DROP> + 4 * kTile) * TileGeom<HS>::LD * 2;  // Q + 2 x (K, V)
}

template <typename S, int HS, bool DROP>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc_kernel(u16* __restrict__ out, float* __restrict__ lse, const u16* __restrict__ qkv, TcDims s, float p, RngKey key) {
  using G = TileGeom<HS>;
  constexpr int LD = G::LD, KS = G::KS, ND = G::ND, MT = kFwdMT<HS, DROP>, BQ = kFwdRows<HS, DROP>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* sQ = reinterpret_cast<u16*>(smem_raw);
  u16* sK = sQ + BQ * LD;         // [2][kTile][LD]
  u16* sV = sK + 2 * kTile * LD;  // [2][kTile][LD]

  const std::int64_t T = s.T, C = s.C, W = s.W, BH = s.B * s.NH;
  const int nqb = static_cast<int>((T + BQ - 1) / BQ);
  const std::int64_t idx = blockIdx.x;
  const int qb = nqb - 1 - static_cast<int>(idx / BH);  // longest query blocks first
  const std::int64_t bh = idx % BH, b = bh / s.NH, h = bh % s.NH, kvh = h / s.G;
  const int q0 = qb * BQ;
  const u16* rows = qkv + b * T * W;  // row t at + t * W
  const u16* qbase = rows + h * HS;
  const u16* kbase = rows + s.koff + kvh * HS;
  const u16* vbase = rows + s.voff + kvh * HS;
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5, g = lane >> 2, c = lane & 3;
  const std::int64_t kend = T < q0 + BQ ? T : q0 + BQ;  // causal: keys < min(T, last query + 1)
  const int nkb = static_cast<int>((kend + kTile - 1) / kTile);
  const float sl2 = (1.0f / sqrtf(static_cast<float>(HS))) * kLog2e;
  const float keep_scale = DROP ? 1.0f / (1.0f - p) : 1.0f;

  load_rows<HS, BQ>(sQ, qbase + q0 * W, W, static_cast<int>(T - q0 < BQ ? T - q0 : BQ));
  cp_async_commit();
  {
    const int nv = static_cast<int>(T < kTile ? T : kTile);
    load_rows<HS, kTile>(sK, kbase, W, nv);
    load_rows<HS, kTile>(sV, vbase, W, nv);
    cp_async_commit();
  }

  unsigned qf[MT][KS][4];
  float o[MT][ND][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) o[mt][nd][0] = o[mt][nd][1] = o[mt][nd][2] = o[mt][nd][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const int wrow = w * 16 * MT;    // the warp's first row in the block
  const int row0 = q0 + wrow + g;  // this thread's rows: row0 + 16 mt and row0 + 16 mt + 8

  for (int kb = 0; kb < nkb; ++kb) {
    const int buf = kb & 1;
    next_kv_block<HS>(sK, sV, kbase, vbase, W, T, kb, nkb);
    if (kb == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) ldsm_x4(qf[mt][ks], a_addr<LD>(sQ, wrow + 16 * mt, ks * 16, lane));
    }
    const int k0 = kb * kTile;
    // Warp-uniform: skip a key block that lies wholly after the warp's last query (all masked).
    if (k0 <= q0 + wrow + 16 * MT - 1) {
      const u16* ks_ = sK + buf * kTile * LD;
      const u16* vs_ = sV + buf * kTile * LD;
      float sc[MT][8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) sc[mt][nb][0] = sc[mt][nb][1] = sc[mt][nb][2] = sc[mt][nb][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int nb2 = 0; nb2 < 4; ++nb2) {
          unsigned bk[4];
          ldsm_x4(bk, bnk_addr<LD>(ks_, nb2 * 16, ks * 16, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<S>(sc[mt][2 * nb2], qf[mt][ks], bk[0], bk[1]);
            mma16816<S>(sc[mt][2 * nb2 + 1], qf[mt][ks], bk[2], bk[3]);
          }
        }
      }
      if (k0 + kTile - 1 > q0 + wrow) {  // a diagonal block: key j > query i is masked (keys >= T too)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nb = 0; nb < 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int j = k0 + nb * 8 + 2 * c + (e & 1), i = row0 + 16 * mt + 8 * (e >> 1);
              if (j > i) sc[mt][nb][e] = -INFINITY;
            }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) mx = fmaxf(mx, fmaxf(sc[mt][nb][2 * r], sc[mt][nb][2 * r + 1]));
          const float mn = fmaxf(m[mt][r], quad_max(mx) * sl2);
          const float ms = mn == -INFINITY ? 0.0f : mn;  // never for a real row (key 0 is unmasked)
          const float corr = ex2(m[mt][r] - ms);         // 0 on the first block (m = -inf)
          m[mt][r] = mn;
          float rs = 0.0f;
#pragma unroll
          for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
            for (int e = 2 * r; e < 2 * r + 2; ++e) {
              const float pe = ex2(sc[mt][nb][e] * sl2 - ms);
              sc[mt][nb][e] = pe;
              rs += pe;
            }
          }
          l[mt][r] = l[mt][r] * corr + rs;
#pragma unroll
          for (int nd = 0; nd < ND; ++nd) {
            o[mt][nd][2 * r] *= corr;
            o[mt][nd][2 * r + 1] *= corr;
          }
        }
      }
      if constexpr (DROP) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nb = 0; nb < 8; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int j = k0 + nb * 8 + 2 * c + (e & 1), i = row0 + 16 * mt + 8 * (e >> 1);
              if (i < T && j <= i) {
                sc[mt][nb][e] *= keep_scale_of(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale);
              }
            }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // O += P V, 16 keys per k-step
        unsigned pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_to_a<S>(pa[mt], sc[mt][2 * kk], sc[mt][2 * kk + 1]);
#pragma unroll
        for (int nd2 = 0; nd2 < HS / 16; ++nd2) {
          unsigned bv[4];
          ldsm_x4_t(bv, bkn_addr<LD>(vs_, kk * 16, nd2 * 16, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<S>(o[mt][2 * nd2], pa[mt], bv[0], bv[1]);
            mma16816<S>(o[mt][2 * nd2 + 1], pa[mt], bv[2], bv[3]);
          }
        }
      }
    }
    __syncthreads();  // this buffer is refilled by the prefetch of iteration kb + 1
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lr = quad_sum(l[mt][r]);
      const int i = row0 + 16 * mt + 8 * r;
      if (i < T) {
        const float inv = 1.0f / lr;
        u16* orow = out + (b * T + i) * C + h * HS + 2 * c;
#pragma unroll
        for (int nd = 0; nd < ND; ++nd) {
          *reinterpret_cast<unsigned*>(orow + nd * 8) = pack2<S>(o[mt][nd][2 * r] * inv, o[mt][nd][2 * r + 1] * inv);
        }
        if (c == 0) lse[bh * T + i] = m[mt][r] * kLn2 + logf(lr);
      }
    }
  }
}

// ---- backward: D_i ------------------------------------------------------------------------

// Dsum[(b, h, i)] = dout_i · out_i over head h's HS dims: a warp per row, 2 elements per lane per
// step, one fixed shuffle tree.
template <typename S, int HS>
__global__ void __launch_bounds__(kTcThreads)
    attention_dsum_tc_kernel(float* __restrict__ Dsum, const u16* __restrict__ dout, const u16* __restrict__ out, TcDims s) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (kTcThreads / 32) + (threadIdx.x >> 5);
  if (row >= s.B * s.NH * s.T) return;  // warp-uniform
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t i = row % s.T, bh = row / s.T, b = bh / s.NH, h = bh % s.NH;
  const std::int64_t off = (b * s.T + i) * s.C + h * HS;
  float acc = 0.0f;
#pragma unroll
  for (int d = 2 * lane; d < HS; d += 64) {
    const unsigned go = *reinterpret_cast<const unsigned*>(dout + off + d);
    const unsigned oo = *reinterpret_cast<const unsigned*>(out + off + d);
    acc += S::load(static_cast<u16>(go & 0xffffu)) * S::load(static_cast<u16>(oo & 0xffffu));
    acc += S::load(static_cast<u16>(go >> 16)) * S::load(static_cast<u16>(oo >> 16));
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) Dsum[row] = acc;
}

// ---- backward: dK, dV ---------------------------------------------------------------------

// Queries per tile of the dK/dV kernel: 32 where the dK and dV accumulators (HS = 128) or the
// Philox rounds of dropout leave no registers for a 16 x 64 Sᵀ and dPᵀ slab, else 64.
template <int HS, bool DROP>
constexpr int kDkvRows = (HS == 128 || DROP) ? 32 : 64;
template <int HS, bool DROP>
constexpr int dkv_smem_bytes() {
  constexpr int BR = kDkvRows<HS, DROP>;
  return (2 * kTile + 4 * BR) * TileGeom<HS>::LD * 2 + 4 * BR * 4;  // K, V, 2 x (Q, dO), 2 x (lse, D)
}

template <typename S, int HS, bool DROP>
__global__ void __launch_bounds__(kTcThreads)
    attention_dkv_tc_kernel(u16* __restrict__ dqkv, const u16* __restrict__ dout, const u16* __restrict__ qkv, const float* __restrict__ lse,
                            const float* __restrict__ Dsum, TcDims s, float p, RngKey key) {
  using G = TileGeom<HS>;
  constexpr int LD = G::LD, KS = G::KS, ND = G::ND, BR = kDkvRows<HS, DROP>, NB = BR / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* sK = reinterpret_cast<u16*>(smem_raw);
  u16* sV = sK + kTile * LD;
  u16* sQ = sV + kTile * LD;                               // [2][BR][LD]
  u16* sG = sQ + 2 * BR * LD;                              // [2][BR][LD]  (dout)
  float* sL = reinterpret_cast<float*>(sG + 2 * BR * LD);  // [2][BR]: lse * log2(e), +inf past T
  float* sD = sL + 2 * BR;                                 // [2][BR]: D, 0 past T

  const std::int64_t T = s.T, C = s.C, W = s.W, BKV = s.B * s.NKV;
  const std::int64_t idx = blockIdx.x;
  const int kb = static_cast<int>(idx / BKV);  // key block 0 (the most queries) first
  const std::int64_t bkv = idx % BKV, b = bkv / s.NKV, kvh = bkv % s.NKV;
  const int k0 = kb * kTile;
  const u16* rows = qkv + b * T * W;  // row t at + t * W
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5, g = lane >> 2, c = lane & 3;
  const float sl2 = (1.0f / sqrtf(static_cast<float>(HS))) * kLog2e;
  const float keep_scale = DROP ? 1.0f / (1.0f - p) : 1.0f;
  // Steps n = 0 .. G·ntile-1: query head h = kvh·G + n / ntile (the group's heads in order), query
  // tile t = t0 + n % ntile (tiles t0 .. nt-1 from the key block's first query to T).
  const int t0 = k0 / BR, nt = static_cast<int>((T + BR - 1) / BR), ntile = nt - t0;
  const int nsteps = static_cast<int>(s.G) * ntile;
  auto head_of = [&](int n) { return kvh * s.G + n / ntile; };

  auto load_q_tile = [&](int n, int buf) {
    const std::int64_t h = head_of(n), bh = b * s.NH + h;
    const std::int64_t qt = static_cast<std::int64_t>(t0 + n % ntile) * BR;
    const int nv = static_cast<int>(T - qt < BR ? T - qt : BR);
    load_rows<HS, BR>(sQ + buf * BR * LD, rows + h * HS + qt * W, W, nv);
    load_rows<HS, BR>(sG + buf * BR * LD, dout + b * T * C + h * HS + qt * C, C, nv);
    for (int r = static_cast<int>(threadIdx.x); r < BR; r += kTcThreads) {
      const bool ok = r < nv;
      sL[buf * BR + r] = ok ? lse[bh * T + qt + r] * kLog2e : INFINITY;
      sD[buf * BR + r] = ok ? Dsum[bh * T + qt + r] : 0.0f;
    }
  };

  {
    const int nv = static_cast<int>(T - k0 < kTile ? T - k0 : kTile);
    load_rows<HS, kTile>(sK, rows + s.koff + kvh * HS + static_cast<std::int64_t>(k0) * W, W, nv);
    load_rows<HS, kTile>(sV, rows + s.voff + kvh * HS + static_cast<std::int64_t>(k0) * W, W, nv);
  }
  load_q_tile(0, 0);
  cp_async_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    dk[nd][0] = dk[nd][1] = dk[nd][2] = dk[nd][3] = 0.0f;
    dv[nd][0] = dv[nd][1] = dv[nd][2] = dv[nd][3] = 0.0f;
  }
  const int key0 = k0 + w * 16 + g;  // this thread's keys: key0 and key0 + 8

  for (int n = 0; n < nsteps; ++n) {
    const int buf = n & 1;
    if (n + 1 < nsteps) {
      load_q_tile(n + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const u16* qs_ = sQ + buf * BR * LD;
    const u16* gs_ = sG + buf * BR * LD;
    const float* ls_ = sL + buf * BR;
    const float* ds_ = sD + buf * BR;
    const int q0 = (t0 + n % ntile) * BR;
    [[maybe_unused]] const std::int64_t bh = b * s.NH + head_of(n);  // the query head's dropout elements

    float st[NB][4], dpt[NB][4];  // Sᵀ and dPᵀ: rows = this warp's 16 keys, cols = the tile's queries
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      st[nb][0] = st[nb][1] = st[nb][2] = st[nb][3] = 0.0f;
      dpt[nb][0] = dpt[nb][1] = dpt[nb][2] = dpt[nb][3] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      unsigned ka[4], va[4];
      ldsm_x4(ka, a_addr<LD>(sK, w * 16, ks * 16, lane));
      ldsm_x4(va, a_addr<LD>(sV, w * 16, ks * 16, lane));
#pragma unroll
      for (int nb2 = 0; nb2 < NB / 2; ++nb2) {
        unsigned bq[4], bg[4];
        ldsm_x4(bq, bnk_addr<LD>(qs_, nb2 * 16, ks * 16, lane));
        mma16816<S>(st[2 * nb2], ka, bq[0], bq[1]);
        mma16816<S>(st[2 * nb2 + 1], ka, bq[2], bq[3]);
        ldsm_x4(bg, bnk_addr<LD>(gs_, nb2 * 16, ks * 16, lane));
        mma16816<S>(dpt[2 * nb2], va, bg[0], bg[1]);
        mma16816<S>(dpt[2 * nb2 + 1], va, bg[2], bg[3]);
      }
    }
    const bool diag = q0 < k0 + kTile - 1;  // some query of the tile precedes some key of the block
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ii = nb * 8 + 2 * c + (e & 1);
        const int i = q0 + ii, j = key0 + 8 * (e >> 1);
        float sv = st[nb][e] * sl2 - ls_[ii];  // -inf for queries past T (lse = +inf there)
        if (diag && j > i) sv = -INFINITY;
        const float pe = ex2(sv);
        float dpe = dpt[nb][e];
        float pd = pe;
        if constexpr (DROP) {
          const float md = (i < T && j <= i) ? keep_scale_of(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale) : 0.0f;
          pd *= md;
          dpe *= md;
        }
        st[nb][e] = pd;                     // P̃ᵀ (for dV)
        dpt[nb][e] = pe * (dpe - ds_[ii]);  // dSᵀ / scale
      }
#pragma unroll
    for (int kq = 0; kq < NB / 2; ++kq) {  // k-steps of 16 queries
      unsigned pa[4], da[4];
      c_to_a<S>(pa, st[2 * kq], st[2 * kq + 1]);
      c_to_a<S>(da, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
      for (int nd2 = 0; nd2 < HS / 16; ++nd2) {
        unsigned bg[4], bq[4];
        ldsm_x4_t(bg, bkn_addr<LD>(gs_, kq * 16, nd2 * 16, lane));
        mma16816<S>(dv[2 * nd2], pa, bg[0], bg[1]);
        mma16816<S>(dv[2 * nd2 + 1], pa, bg[2], bg[3]);
        ldsm_x4_t(bq, bkn_addr<LD>(qs_, kq * 16, nd2 * 16, lane));
        mma16816<S>(dk[2 * nd2], da, bq[0], bq[1]);
        mma16816<S>(dk[2 * nd2 + 1], da, bq[2], bq[3]);
      }
    }
    __syncthreads();  // this buffer is refilled by the prefetch of step n + 1
  }

  const float scale = 1.0f / sqrtf(static_cast<float>(HS));  // the CPU's scale
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = key0 + 8 * r;
    if (j < T) {
      u16* dkrow = dqkv + (b * T + j) * W + s.koff + kvh * HS + 2 * c;
      u16* dvrow = dqkv + (b * T + j) * W + s.voff + kvh * HS + 2 * c;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) {
        accumulate2<S>(dkrow + nd * 8, dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
        accumulate2<S>(dvrow + nd * 8, dv[nd][2 * r], dv[nd][2 * r + 1]);
      }
    }
  }
}

// ---- backward: dQ -------------------------------------------------------------------------

template <int HS>
constexpr int dq_smem_bytes() {
  return (2 * kTile + 4 * kTile) * TileGeom<HS>::LD * 2;  // Q, dO, 2 x (K, V)
}

template <typename S, int HS, bool DROP>
__global__ void __launch_bounds__(kTcThreads)
    attention_dq_tc_kernel(u16* __restrict__ dqkv, const u16* __restrict__ dout, const u16* __restrict__ qkv, const float* __restrict__ lse,
                           const float* __restrict__ Dsum, TcDims s, float p, RngKey key) {
  using G = TileGeom<HS>;
  constexpr int LD = G::LD, KS = G::KS, ND = G::ND;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  u16* sQ = reinterpret_cast<u16*>(smem_raw);
  u16* sG = sQ + kTile * LD;
  u16* sK = sG + kTile * LD;      // [2][kTile][LD]
  u16* sV = sK + 2 * kTile * LD;  // [2][kTile][LD]

  const std::int64_t T = s.T, C = s.C, W = s.W, BH = s.B * s.NH;
  const int nqb = static_cast<int>((T + kTile - 1) / kTile);
  const std::int64_t idx = blockIdx.x;
  const int qb = nqb - 1 - static_cast<int>(idx / BH);  // longest query blocks first
  const std::int64_t bh = idx % BH, b = bh / s.NH, h = bh % s.NH, kvh = h / s.G;
  const int q0 = qb * kTile;
  const u16* rows = qkv + b * T * W;  // row t at + t * W
  const u16* qbase = rows + h * HS;
  const u16* kbase = rows + s.koff + kvh * HS;
  const u16* vbase = rows + s.voff + kvh * HS;
  const u16* gbase = dout + b * T * C + h * HS;
  const int lane = static_cast<int>(threadIdx.x) & 31, w = static_cast<int>(threadIdx.x) >> 5, g = lane >> 2, c = lane & 3;
  const int nkb = qb + 1;
  const float sl2 = (1.0f / sqrtf(static_cast<float>(HS))) * kLog2e;
  const float keep_scale = DROP ? 1.0f / (1.0f - p) : 1.0f;

  {
    const int nv = static_cast<int>(T - q0 < kTile ? T - q0 : kTile);
    load_rows<HS, kTile>(sQ, qbase + static_cast<std::int64_t>(q0) * W, W, nv);
    load_rows<HS, kTile>(sG, gbase + static_cast<std::int64_t>(q0) * C, C, nv);
    const int nk = static_cast<int>(T < kTile ? T : kTile);
    load_rows<HS, kTile>(sK, kbase, W, nk);
    load_rows<HS, kTile>(sV, vbase, W, nk);
    cp_async_commit();
  }

  const int row0 = q0 + w * 16 + g;  // this thread's rows: row0 and row0 + 8
  float lr2[2], dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    lr2[r] = i < T ? lse[bh * T + i] * kLog2e : INFINITY;  // rows past T: P = 0
    dr[r] = i < T ? Dsum[bh * T + i] : 0.0f;
  }
  float dq[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;

  for (int kb = 0; kb < nkb; ++kb) {
    const int buf = kb & 1;
    next_kv_block<HS>(sK, sV, kbase, vbase, W, T, kb, nkb);
    const u16* ks_ = sK + buf * kTile * LD;
    const u16* vs_ = sV + buf * kTile * LD;

    float sc[8][4], dp[8][4];
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
      dp[nb][0] = dp[nb][1] = dp[nb][2] = dp[nb][3] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      unsigned qa[4], ga[4];
      ldsm_x4(qa, a_addr<LD>(sQ, w * 16, ks * 16, lane));
      ldsm_x4(ga, a_addr<LD>(sG, w * 16, ks * 16, lane));
#pragma unroll
      for (int nb2 = 0; nb2 < 4; ++nb2) {
        unsigned bk[4], bv[4];
        ldsm_x4(bk, bnk_addr<LD>(ks_, nb2 * 16, ks * 16, lane));
        mma16816<S>(sc[2 * nb2], qa, bk[0], bk[1]);
        mma16816<S>(sc[2 * nb2 + 1], qa, bk[2], bk[3]);
        ldsm_x4(bv, bnk_addr<LD>(vs_, nb2 * 16, ks * 16, lane));
        mma16816<S>(dp[2 * nb2], ga, bv[0], bv[1]);
        mma16816<S>(dp[2 * nb2 + 1], ga, bv[2], bv[3]);
      }
    }
    const int k0 = kb * kTile;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = k0 + nb * 8 + 2 * c + (e & 1), i = row0 + 8 * (e >> 1);
        float sv = sc[nb][e] * sl2 - lr2[e >> 1];
        if (kb == qb && j > i) sv = -INFINITY;
        const float pe = ex2(sv);
        float dpe = dp[nb][e];
        if constexpr (DROP) {
          dpe *= (i < T && j <= i) ? keep_scale_of(key, static_cast<std::uint64_t>((bh * T + i) * T + j), p, keep_scale) : 0.0f;
        }
        sc[nb][e] = pe * (dpe - dr[e >> 1]);  // dS / scale
      }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // dQ += dS K, 16 keys per k-step
      unsigned da[4];
      c_to_a<S>(da, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int nd2 = 0; nd2 < HS / 16; ++nd2) {
        unsigned bk[4];
        ldsm_x4_t(bk, bkn_addr<LD>(ks_, kk * 16, nd2 * 16, lane));
        mma16816<S>(dq[2 * nd2], da, bk[0], bk[1]);
        mma16816<S>(dq[2 * nd2 + 1], da, bk[2], bk[3]);
      }
    }
    __syncthreads();  // this buffer is refilled by the prefetch of iteration kb + 1
  }

  const float scale = 1.0f / sqrtf(static_cast<float>(HS));  // the CPU's scale
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    if (i < T) {
      u16* dqrow = dqkv + (b * T + i) * W + h * HS + 2 * c;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) accumulate2<S>(dqrow + nd * 8, dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale);
    }
  }
}

// ---- launch -------------------------------------------------------------------------------

constexpr int max_of(int a, int b) { return a > b ? a : b; }
template <int HS>
constexpr int max_smem_bytes() {  // the largest dynamic shared memory of the HS kernels
  return max_of(max_of(max_of(fwd_smem_bytes<HS, false>(), fwd_smem_bytes<HS, true>()),
                       max_of(dkv_smem_bytes<HS, false>(), dkv_smem_bytes<HS, true>())),
                dq_smem_bytes<HS>());
}
static_assert(max_smem_bytes<128>() <= 160 * 1024, "the sm_80 opt-in limit is 163 KiB");

template <typename K>
cudaError_t set_smem(K kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// Calls f(S{}, HS constant, DROP constant) for fp16/bf16 and HS in {32, 64, 128}.
template <typename F>
cudaError_t dispatch_tc(DType t, std::int64_t HS, bool drop, F&& f) {
  auto with_hs = [&]<typename S>(S) -> cudaError_t {
    auto with_drop = [&]<int H>(std::integral_constant<int, H>) -> cudaError_t {
      return drop ? f(S{}, std::integral_constant<int, H>{}, std::true_type{}) : f(S{}, std::integral_constant<int, H>{}, std::false_type{});
    };
    switch (HS) {
      case 32:
        return with_drop(std::integral_constant<int, 32>{});
      case 64:
        return with_drop(std::integral_constant<int, 64>{});
      case 128:
        return with_drop(std::integral_constant<int, 128>{});
      default:
        return cudaErrorInvalidValue;
    }
  };
  switch (t) {
    case DType::fp16:
      return with_hs(F16{});
    case DType::bf16:
      return with_hs(BF16{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool attention_tc_supported(DType t, std::int64_t HS) {
  if (!((t == DType::fp16 || t == DType::bf16) && (HS == 32 || HS == 64 || HS == 128))) return false;
  // sm_80 or newer (cp.async, bf16 mma.m16n8k16); and the largest block of this HS must fit the
  // opt-in shared memory: dQ at HS = 128 needs 102 KiB, which sm_80 / sm_90 have and sm_86 /
  // sm_89 (99 KiB) do not, so there HS = 128 keeps the warp-per-row kernels (HS <= 64: 55 KiB).
  // The two attributes per device, asked once (every attention call comes here): 0 = not read yet,
  // -1 = unreadable (keep the fallback kernels).
  static std::array<std::atomic<int>, 64> major_of{}, optin_of{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= static_cast<int>(major_of.size())) return false;
  if (major_of[static_cast<std::size_t>(dev)].load() == 0) {
    int major = 0, optin = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess;
    optin_of[static_cast<std::size_t>(dev)].store(ok ? optin : -1);
    major_of[static_cast<std::size_t>(dev)].store(ok ? major : -1);
  }
  if (major_of[static_cast<std::size_t>(dev)].load() < 8) return false;
  const int need = HS == 32 ? max_smem_bytes<32>() : (HS == 64 ? max_smem_bytes<64>() : max_smem_bytes<128>());
  return need <= optin_of[static_cast<std::size_t>(dev)].load();
}

cudaError_t launch_attention_forward_tc(void* out, float* lse, const void* qkv, DType t, std::int64_t B, std::int64_t T, std::int64_t C,
                                        std::int64_t NH, std::int64_t NKV, float p, const RngKey& key, cudaStream_t st) {
  if (B * NH * T == 0 || C == 0) return cudaSuccess;
  const TcDims s = tc_dims(B, T, C, NH, NKV);
  return dispatch_tc(t, C / NH, p > 0.0f, [&]<typename S, int HS, bool DROP>(S, std::integral_constant<int, HS>, std::bool_constant<DROP>) {
    const std::int64_t blocks = (T + kFwdRows<HS, DROP> - 1) / kFwdRows<HS, DROP> * B * NH;
    auto kernel = attention_forward_tc_kernel<S, HS, DROP>;
    constexpr int smem = fwd_smem_bytes<HS, DROP>();
    cudaError_t e = set_smem(kernel, smem);
    if (e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(blocks), kTcThreads, smem, st>>>(static_cast<u16*>(out), lse, static_cast<const u16*>(qkv), s, p, key);
    return cudaGetLastError();
  });
}

cudaError_t launch_attention_backward_tc(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, float* Dsum, DType t,
                                         std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t NKV, float p,
                                         const RngKey& key, cudaStream_t st) {
  if (B * NH * T == 0 || C == 0) return cudaSuccess;
  const TcDims s = tc_dims(B, T, C, NH, NKV);
  const std::int64_t rows = B * NH * T;
  const std::int64_t dkv_blocks = (T + kTile - 1) / kTile * B * NKV;  // one per (key block, b, KV head)
  const std::int64_t dq_blocks = (T + kTile - 1) / kTile * B * NH;    // one per (query block, b, query head)
  return dispatch_tc(t, C / NH, p > 0.0f, [&]<typename S, int HS, bool DROP>(S, std::integral_constant<int, HS>, std::bool_constant<DROP>) {
    auto* pdqkv = static_cast<u16*>(dqkv);
    const auto* pdout = static_cast<const u16*>(dout);
    const auto* pqkv = static_cast<const u16*>(qkv);
    constexpr int rows_per_block = kTcThreads / 32;
    attention_dsum_tc_kernel<S, HS>
        <<<static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block), kTcThreads, 0, st>>>(Dsum, pdout, static_cast<const u16*>(out), s);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    auto dkv = attention_dkv_tc_kernel<S, HS, DROP>;
    constexpr int dkv_smem = dkv_smem_bytes<HS, DROP>();
    if ((e = set_smem(dkv, dkv_smem)) != cudaSuccess) return e;
    dkv<<<static_cast<unsigned>(dkv_blocks), kTcThreads, dkv_smem, st>>>(pdqkv, pdout, pqkv, lse, Dsum, s, p, key);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    auto dq = attention_dq_tc_kernel<S, HS, DROP>;
    constexpr int dq_smem = dq_smem_bytes<HS>();
    if ((e = set_smem(dq, dq_smem)) != cudaSuccess) return e;
    dq<<<static_cast<unsigned>(dq_blocks), kTcThreads, dq_smem, st>>>(pdqkv, pdout, pqkv, lse, Dsum, s, p, key);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
