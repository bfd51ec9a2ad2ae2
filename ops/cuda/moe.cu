// Mixture-of-experts routing and token movement, CUDA (ops/kernels/moe.h; semantics and arithmetic
// as ops/cpu/moe.cpp, compiled with -fmad=false so every fp32/fp64 operation is rounded as the CPU
// rounds it). Routing: one thread per token in double; the scores are recomputed from the logits
// where needed rather than stored (E is a few hundred at most), and the top-k is k passes of an
// argmax, each taking the best expert strictly after the previous pick in the order "higher score
// first, the lower index on a tie" (no per-thread arrays). The aux statistics sum a fixed
// partition in a fixed order; the plan is a stable counting sort over fixed chunks; rows move one
// block per output row. No floating-point atomics: the results depend only on the inputs.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr unsigned kRouteThreads = 128;

// a (value va) comes before b (value vb): the higher value, the lower index on a tie.
__device__ __forceinline__ bool before(double va, std::int64_t a, double vb, std::int64_t b) { return va > vb || (va == vb && a < b); }

// The scores of one token's logits in double, as the CPU's softmax_row / sigmoid.
struct RowScores {
  const float* l;
  bool sigmoid;
  double m, sum;
  __device__ double operator()(std::int64_t e) const {
    const double x = static_cast<double>(l[e]);
    return sigmoid ? 1.0 / (1.0 + exp(-x)) : exp(x - m) / sum;
  }
};

__device__ RowScores row_scores(const float* l, std::int64_t E, bool sigmoid) {
  RowScores r{l, sigmoid, 0.0, 1.0};
  if (!sigmoid) {
    double m = -INFINITY;
    for (std::int64_t e = 0; e < E; ++e) m = fmax(m, static_cast<double>(l[e]));
    double s = 0.0;
    for (std::int64_t e = 0; e < E; ++e) s += exp(static_cast<double>(l[e]) - m);
    r.m = m;
    r.sum = s;
  }
  return r;
}

// A group's score: the sum of its two best (sigmoid scores, DeepSeek-V3) or its best (DeepSeek-V2).
__device__ double group_score(const RowScores& sc, std::int64_t g, std::int64_t per) {
  double a = -INFINITY, b = -INFINITY;
  for (std::int64_t i = 0; i < per; ++i) {
    const double v = sc(g * per + i);
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return sc.sigmoid && per >= 2 ? a + b : a;
}

// The token's k choices, best first, into ex[0..k). Group-limited: only the experts of the
// topk_group best groups are eligible (the last of those groups is (gv, gi); a group is kept when it
// is that one or comes before it).
__device__ void choose(const RowScores& sc, std::int64_t E, std::int64_t k, std::int64_t G, std::int64_t topk_group, std::int32_t* ex) {
  const std::int64_t per = E / G;
  double gv = 0.0;
  std::int64_t gi = -1;
  if (G > 1) {
    for (std::int64_t j = 0; j < topk_group; ++j) {
      double bv = 0.0;
      std::int64_t bi = -1;
      for (std::int64_t g = 0; g < G; ++g) {
        const double v = group_score(sc, g, per);
        if (gi >= 0 && !before(gv, gi, v, g)) continue;
        if (bi < 0 || before(v, g, bv, bi)) {
          bv = v;
          bi = g;
        }
      }
      if (bi < 0) break;  // NaN scores only
      gv = bv;
      gi = bi;
    }
  }
  double pv = 0.0;
  std::int64_t pi = -1;
  for (std::int64_t j = 0; j < k; ++j) {
    double bv = 0.0;
    std::int64_t bi = -1;
    for (std::int64_t g = 0; g < G; ++g) {
      if (G > 1 && gi >= 0) {
        const double v = group_score(sc, g, per);
        if (!(v == gv && g == gi) && !before(v, g, gv, gi)) continue;
      }
      for (std::int64_t e = g * per; e < (g + 1) * per; ++e) {
        const double v = sc(e);
        if (pi >= 0 && !before(pv, pi, v, e)) continue;
        if (bi < 0 || before(v, e, bv, bi)) {
          bv = v;
          bi = e;
        }
      }
    }
    if (bi < 0) bi = 0;  // NaN scores only: stay in range
    ex[j] = static_cast<std::int32_t>(bi);
    pv = bv;
    pi = bi;
  }
}

__global__ void __launch_bounds__(kRouteThreads) moe_route_forward_kernel(float* __restrict__ scores, std::int32_t* __restrict__ expert,
                                                                          float* __restrict__ weight, const float* __restrict__ logits,
                                                                          std::int64_t N, std::int64_t E, MoeRouteParams r) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const std::int64_t k = r.top_k;
  const RowScores sc = row_scores(logits + t * E, E, r.sigmoid);
  for (std::int64_t e = 0; e < E; ++e) scores[t * E + e] = static_cast<float>(sc(e));
  std::int32_t* ex = expert + t * k;
  choose(sc, E, k, r.n_group, r.topk_group, ex);
  double sum = r.sigmoid ? 1e-20 : 0.0;
  for (std::int64_t j = 0; j < k; ++j) sum += sc(ex[j]);
  for (std::int64_t j = 0; j < k; ++j) {
    const double s = sc(ex[j]);
    const double v = r.renormalize ? s / sum : s;
    weight[t * k + j] = static_cast<float>(v * static_cast<double>(r.scale));
  }
}

__global__ void __launch_bounds__(kRouteThreads)
    moe_route_backward_kernel(float* __restrict__ dlogits, const float* __restrict__ dweight, const float* __restrict__ scores,
                              const std::int32_t* __restrict__ expert, const float* __restrict__ logits, const float* __restrict__ aux,
                              std::int64_t N, std::int64_t E, MoeRouteParams r) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const std::int64_t k = r.top_k;
  const float* st = scores + t * E;
  const std::int32_t* et = expert + t * k;
  const float* dw = dweight + t * k;
  // weights w_j = scale · s_j / D (D = Σ_i s_i (+1e-20)), or scale · s_j; an id outside [0, E)
  // adds nothing (the CPU rejects it).
  double D = r.sigmoid ? 1e-20 : 0.0, dotw = 0.0;
  if (r.renormalize) {
    for (std::int64_t j = 0; j < k; ++j)
      if (et[j] >= 0 && et[j] < E) D += st[et[j]];
    for (std::int64_t j = 0; j < k; ++j)
      if (et[j] >= 0 && et[j] < E) dotw += static_cast<double>(dw[j]) * st[et[j]];
  }
  // d(score e), accumulated over the choices naming e in choice order, as the CPU's ds[e] +=.
  auto ds_of = [&](std::int64_t e) {
    double ds = 0.0;
    for (std::int64_t j = 0; j < k; ++j) {
      if (et[j] != e) continue;
      if (r.renormalize) {
        ds += static_cast<double>(r.scale) * (static_cast<double>(dw[j]) / D - dotw / (D * D));
      } else {
        ds += static_cast<double>(r.scale) * static_cast<double>(dw[j]);
      }
    }
    return ds;
  };
  float* dlt = dlogits + t * E;
  if (r.sigmoid) {
    for (std::int64_t e = 0; e < E; ++e) {
      const double s = st[e];
      dlt[e] = static_cast<float>(ds_of(e) * s * (1.0 - s));
    }
  } else {
    double dot = 0.0;
    for (std::int64_t e = 0; e < E; ++e) dot += ds_of(e) * st[e];
    for (std::int64_t e = 0; e < E; ++e) dlt[e] = static_cast<float>(st[e] * (ds_of(e) - dot));
  }
  if (aux != nullptr) {  // + d/dlogits of Σ_e aux[e]·softmax(logits)[e]
    const RowScores p = row_scores(logits + t * E, E, false);
    double dot = 0.0;
    for (std::int64_t e = 0; e < E; ++e) dot += static_cast<double>(aux[e]) * p(e);
    for (std::int64_t e = 0; e < E; ++e) dlt[e] += static_cast<float>(p(e) * (aux[e] - dot));
  }
}

// Per token: the softmax's max and sum (stats[2t], stats[2t + 1]) and the plain top-k counted
// into cnt (integer atomics: the counts do not depend on the order).
__global__ void __launch_bounds__(kRouteThreads) moe_aux_token_kernel(double* __restrict__ stats, unsigned long long* __restrict__ cnt,
                                                                      const float* __restrict__ logits, std::int64_t N, std::int64_t E,
                                                                      std::int64_t top_k) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const RowScores p = row_scores(logits + t * E, E, false);
  stats[2 * t] = p.m;
  stats[2 * t + 1] = p.sum;
  double pv = 0.0;
  std::int64_t pi = -1;
  for (std::int64_t j = 0; j < top_k; ++j) {
    double bv = 0.0;
    std::int64_t bi = -1;
    for (std::int64_t e = 0; e < E; ++e) {
      const double v = p(e);
      if (pi >= 0 && !before(pv, pi, v, e)) continue;
      if (bi < 0 || before(v, e, bv, bi)) {
        bv = v;
        bi = e;
      }
    }
    if (bi < 0) break;  // NaN logits only
    atomicAdd(cnt + bi, 1ull);
    pv = bv;
    pi = bi;
  }
}

// One block per expert: prob_sum[e] = Σ_t softmax[t, e], thread i summing tokens i, i + blockDim, ...
// in order, then the block's fixed tree; assigned[e] from the counts.
__global__ void moe_aux_expert_kernel(double* __restrict__ assigned, double* __restrict__ prob_sum, const unsigned long long* __restrict__ cnt,
                                      const double* __restrict__ stats, const float* __restrict__ logits, std::int64_t N, std::int64_t E) {
  const std::int64_t e = blockIdx.x;
  double acc = 0.0;
  for (std::int64_t t = threadIdx.x; t < N; t += blockDim.x) acc += exp(static_cast<double>(logits[t * E + e]) - stats[2 * t]) / stats[2 * t + 1];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) {
    prob_sum[e] = total;
    assigned[e] = static_cast<double>(cnt[e]);
  }
}

// The plan. Assignment q in slot order is (choice j = q / N, token t = q % N), a = t·k + j.
__device__ __forceinline__ std::int32_t plan_expert(const std::int32_t* expert, std::int64_t q, std::int64_t N, std::int64_t k) {
  return expert[(q % N) * k + q / N];
}

// Per chunk: how many of its assignments each expert has (hist[chunk·E + e]); ids outside [0, E) set *bad.
__global__ void moe_plan_hist_kernel(std::int32_t* __restrict__ hist, std::int32_t* __restrict__ bad, const std::int32_t* __restrict__ expert,
                                     std::int64_t N, std::int64_t k, std::int64_t E) {
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kMoePlanChunk + threadIdx.x;
  if (q >= N * k) return;
  const std::int32_t e = plan_expert(expert, q, N, k);
  if (e < 0 || e >= E) {
    *bad = 1;
    return;
  }
  atomicAdd(hist + static_cast<std::int64_t>(blockIdx.x) * E + e, 1);  // integer: order-free
}

// Per expert: the histograms become each chunk's count of earlier assignments of e (in place);
// counts[e] = the kept ones.
__global__ void moe_plan_scan_kernel(std::int32_t* __restrict__ hist, std::int32_t* __restrict__ counts, std::int64_t chunks, std::int64_t E,
                                     std::int64_t capacity) {
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= E) return;
  std::int64_t run = 0;
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int32_t h = hist[c * E + e];
    hist[c * E + e] = static_cast<std::int32_t>(run);
    run += h;
  }
  counts[e] = static_cast<std::int32_t>(capacity < 0 || run < capacity ? run : capacity);
}

// offset[e] = Σ_{e' < e} counts[e'] (one thread: E is small).
__global__ void moe_plan_offset_kernel(std::int32_t* __restrict__ offset, const std::int32_t* __restrict__ counts, std::int64_t E) {
  std::int64_t run = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    offset[e] = static_cast<std::int32_t>(run);
    run += counts[e];
  }
}

// Per chunk: each assignment's rank among its expert's = the earlier chunks' count + the earlier
// ones of this chunk; kept when below counts[e].
__global__ void __launch_bounds__(kMoePlanChunk)
    moe_plan_place_kernel(std::int32_t* __restrict__ slot_assignment, std::int32_t* __restrict__ slot_of, const std::int32_t* __restrict__ hist,
                          const std::int32_t* __restrict__ counts, const std::int32_t* __restrict__ offset,
                          const std::int32_t* __restrict__ expert, std::int64_t N, std::int64_t k, std::int64_t E) {
  __shared__ std::int32_t keys[kMoePlanChunk];
  const std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * kMoePlanChunk + threadIdx.x;
  std::int32_t e = -1;
  if (q < N * k) {
    e = plan_expert(expert, q, N, k);
    if (e >= E) e = -1;
  }
  keys[threadIdx.x] = e;
  __syncthreads();
  if (q >= N * k) return;
  const std::int64_t a = (q % N) * k + q / N;
  if (e < 0) {
    slot_of[a] = -1;
    return;
  }
  std::int32_t rank = hist[static_cast<std::int64_t>(blockIdx.x) * E + e];
  for (unsigned i = 0; i < threadIdx.x; ++i) rank += keys[i] == e ? 1 : 0;
  if (rank < counts[e]) {
    const std::int32_t s = offset[e] + rank;
    slot_of[a] = s;
    slot_assignment[s] = static_cast<std::int32_t>(a);
  } else {
    slot_of[a] = -1;
  }
}

template <typename P>
__global__ void moe_gather_kernel(P* __restrict__ rows, const P* __restrict__ x, const std::int32_t* __restrict__ sa, std::int64_t N, std::int64_t C,
                                  std::int64_t k) {
  const std::int64_t s = blockIdx.x;
  const std::int32_t a = sa[s];
  if (a < 0 || a / k >= N) return;  // the CPU rejects it
  const P* src = x + (a / k) * C;
  P* dst = rows + s * C;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

template <typename S>
__global__ void moe_combine_kernel(typename S::storage* __restrict__ out, const typename S::storage* __restrict__ rows,
                                   const std::int32_t* __restrict__ slot_of, const float* __restrict__ weight, std::int64_t C, std::int64_t k,
                                   std::int64_t R) {
  const std::int64_t t = blockIdx.x;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = S::load(out[t * C + c]);
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t s = slot_of[t * k + j];
      if (s < 0 || s >= R) continue;
      const float wj = weight != nullptr ? weight[t * k + j] : 1.0f;
      acc += wj * S::load(rows[s * C + c]);
    }
    out[t * C + c] = S::store(acc);
  }
}

template <typename S>
__global__ void moe_combine_backward_kernel(typename S::storage* __restrict__ drows, float* __restrict__ dweight,
                                            const typename S::storage* __restrict__ dout, const typename S::storage* __restrict__ rows,
                                            const std::int32_t* __restrict__ slot_of, const float* __restrict__ weight, std::int64_t C,
                                            std::int64_t k, std::int64_t R) {
  const std::int64_t t = blockIdx.x;
  for (std::int64_t j = 0; j < k; ++j) {
    const std::int32_t s = slot_of[t * k + j];
    if (s < 0 || s >= R) {  // the same for the whole block
      if (threadIdx.x == 0) dweight[t * k + j] = 0.0f;
      continue;
    }
    const float wj = weight[t * k + j];
    double dot = 0.0;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float g = S::load(dout[t * C + c]);
      dot += static_cast<double>(g) * static_cast<double>(S::load(rows[s * C + c]));
      drows[s * C + c] = S::store(wj * g);
    }
    const double total = block_sum(dot);
    if (threadIdx.x == 0) dweight[t * k + j] = static_cast<float>(total);
  }
}

__device__ __forceinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

template <typename S>
__global__ void moe_gated_add_forward_kernel(typename S::storage* __restrict__ out, const typename S::storage* __restrict__ y,
                                             const typename S::storage* __restrict__ logit, std::int64_t C) {
  const std::int64_t t = blockIdx.x;
  const float s = static_cast<float>(sigmoid_d(static_cast<double>(S::load(logit[t]))));
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) out[t * C + c] = S::store(S::load(out[t * C + c]) + s * S::load(y[t * C + c]));
}

template <typename S>
__global__ void moe_gated_add_backward_kernel(typename S::storage* __restrict__ dy, typename S::storage* __restrict__ dlogit,
                                              const typename S::storage* __restrict__ dout, const typename S::storage* __restrict__ y,
                                              const typename S::storage* __restrict__ logit, std::int64_t C) {
  const std::int64_t t = blockIdx.x;
  const double s = sigmoid_d(static_cast<double>(S::load(logit[t])));
  double dot = 0.0;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = S::load(dout[t * C + c]);
    dot += static_cast<double>(gc) * static_cast<double>(S::load(y[t * C + c]));
    dy[t * C + c] = S::store(static_cast<float>(s) * gc);
  }
  const double total = block_sum(dot);
  if (threadIdx.x == 0) dlogit[t] = S::store(static_cast<float>(total * s * (1.0 - s)));
}

unsigned blocks_of(std::int64_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

cudaError_t launch_moe_route_forward(float* scores, std::int32_t* expert, float* weight, const float* logits, std::int64_t N, std::int64_t E,
                                     const MoeRouteParams& r, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  moe_route_forward_kernel<<<blocks_of(N, kRouteThreads), kRouteThreads, 0, s>>>(scores, expert, weight, logits, N, E, r);
  return cudaGetLastError();
}

cudaError_t launch_moe_route_backward(float* dlogits, const float* dweight, const float* scores, const std::int32_t* expert, const float* logits,
                                      const float* aux_grad, std::int64_t N, std::int64_t E, const MoeRouteParams& r, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  moe_route_backward_kernel<<<blocks_of(N, kRouteThreads), kRouteThreads, 0, s>>>(dlogits, dweight, scores, expert, logits, aux_grad, N, E, r);
  return cudaGetLastError();
}

cudaError_t launch_moe_aux_stats(double* assigned, double* prob_sum, const float* logits, std::int64_t N, std::int64_t E, std::int64_t top_k,
                                 void* scratch, cudaStream_t s) {
  if (E == 0) return cudaSuccess;
  double* stats = static_cast<double*>(scratch);
  auto* cnt = reinterpret_cast<unsigned long long*>(stats + 2 * N);
  cudaError_t err = cudaMemsetAsync(cnt, 0, static_cast<std::size_t>(E) * sizeof(unsigned long long), s);
  if (err != cudaSuccess) return err;
  if (N > 0) {
    moe_aux_token_kernel<<<blocks_of(N, kRouteThreads), kRouteThreads, 0, s>>>(stats, cnt, logits, N, E, top_k);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  moe_aux_expert_kernel<<<static_cast<unsigned>(E), kThreads, 0, s>>>(assigned, prob_sum, cnt, stats, logits, N, E);
  return cudaGetLastError();
}

cudaError_t launch_moe_dispatch_plan(std::int32_t* slot_assignment, std::int32_t* slot_of, std::int32_t* counts, const std::int32_t* expert,
                                     std::int64_t N, std::int64_t k, std::int64_t E, std::int64_t capacity, void* scratch,
                                     const std::int32_t** bad_flag_out, cudaStream_t s) {
  const std::int64_t M = N * k, chunks = (M + kMoePlanChunk - 1) / kMoePlanChunk;
  std::int32_t* hist = static_cast<std::int32_t*>(scratch);
  std::int32_t* offset = hist + chunks * E;
  std::int32_t* bad = offset + E;
  *bad_flag_out = bad;
  cudaError_t err = cudaMemsetAsync(hist, 0, moe_plan_scratch_bytes(M, E), s);  // histograms, offsets and the flag
  if (err == cudaSuccess && M > 0) err = cudaMemsetAsync(slot_assignment, 0xff, static_cast<std::size_t>(M) * sizeof(std::int32_t), s);  // -1
  if (err == cudaSuccess && E > 0) err = cudaMemsetAsync(counts, 0, static_cast<std::size_t>(E) * sizeof(std::int32_t), s);
  if (err != cudaSuccess || M == 0) return err;
  const auto ch = static_cast<unsigned>(chunks);
  moe_plan_hist_kernel<<<ch, kMoePlanChunk, 0, s>>>(hist, bad, expert, N, k, E);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  if (E > 0) {
    moe_plan_scan_kernel<<<blocks_of(E, kThreads), kThreads, 0, s>>>(hist, counts, chunks, E, capacity);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    moe_plan_offset_kernel<<<1, 1, 0, s>>>(offset, counts, E);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  moe_plan_place_kernel<<<ch, kMoePlanChunk, 0, s>>>(slot_assignment, slot_of, hist, counts, offset, expert, N, k, E);
  return cudaGetLastError();
}

cudaError_t launch_moe_gather_rows(void* rows, const void* x, const std::int32_t* slot_assignment, DType t, std::int64_t N, std::int64_t C,
                                   std::int64_t k, std::int64_t slots, cudaStream_t s) {
  if (slots == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    moe_gather_kernel<P><<<static_cast<unsigned>(slots), kThreads, 0, s>>>(static_cast<P*>(rows), static_cast<const P*>(x), slot_assignment, N, C, k);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_combine(void* out, const void* rows, const std::int32_t* slot_of, const float* weight, DType t, std::int64_t N,
                               std::int64_t C, std::int64_t k, std::int64_t R, cudaStream_t s) {
  if (N == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    moe_combine_kernel<S><<<static_cast<unsigned>(N), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(rows), slot_of, weight, C, k, R);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_combine_backward(void* drows, float* dweight, const void* dout, const void* rows, const std::int32_t* slot_of,
                                        const float* weight, DType t, std::int64_t N, std::int64_t C, std::int64_t k, std::int64_t R,
                                        cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    moe_combine_backward_kernel<S><<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        static_cast<P*>(drows), dweight, static_cast<const P*>(dout), static_cast<const P*>(rows), slot_of, weight, C, k, R);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_gated_add_forward(void* out, const void* y, const void* logit, DType t, std::int64_t N, std::int64_t C, cudaStream_t s) {
  if (N == 0 || C == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    moe_gated_add_forward_kernel<S>
        <<<static_cast<unsigned>(N), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(y), static_cast<const P*>(logit), C);
    return cudaGetLastError();
  });
}

cudaError_t launch_moe_gated_add_backward(void* dy, void* dlogit, const void* dout, const void* y, const void* logit, DType t, std::int64_t N,
                                          std::int64_t C, cudaStream_t s) {
  if (N == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    moe_gated_add_backward_kernel<S><<<static_cast<unsigned>(N), kThreads, 0, s>>>(
        static_cast<P*>(dy), static_cast<P*>(dlogit), static_cast<const P*>(dout), static_cast<const P*>(y), static_cast<const P*>(logit), C);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
