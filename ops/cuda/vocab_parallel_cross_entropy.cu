// Vocabulary-parallel cross-entropy on the GPU (ops/kernels/vocab_parallel_cross_entropy.h;
// semantics as ops/cpu/vocab_parallel_cross_entropy.cpp): one block per row of the rank's logits
// for the row's max and its Σ exp, each combined by a fixed-tree block reduction (deterministic,
// no atomics; the same bits for any grid); a thread per row for the losses; a block per row for
// the gradient, each element read and written by one thread (so dlogits may be the logits).
// The arithmetic is the CPU's: the max and the target logit exactly; Σ exp(double(x - max)) in
// double; lse = max + logf(Σ); dlogits = (expf(x - lse) - onehot)·dloss, rounded once.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

// Rows beyond the grid are taken by the same block in turn (uniform per block: the reductions'
// __syncthreads see every thread).
constexpr std::int64_t kMaxRowBlocks = 65535;

unsigned row_blocks(std::int64_t BT) { return static_cast<unsigned>(BT < kMaxRowBlocks ? BT : kMaxRowBlocks); }

// Threads per row-block: a multiple of 32, no more than the row needs, at most 1024.
unsigned row_block_threads(std::int64_t n) {
  unsigned t = 32;
  while (t < 1024 && static_cast<std::int64_t>(t) < n) t *= 2;
  return t;
}

// rowmax[i] = max over v < valid of x[i, v] (-inf for valid == 0). fmaxf ignores a NaN as the
// CPU's std::max(r, x) does.
template <typename S>
__global__ void vocab_shard_max_kernel(float* __restrict__ rowmax, const typename S::storage* __restrict__ logits, std::int64_t BT, std::int64_t Vr,
                                       std::int64_t valid) {
  for (std::int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const typename S::storage* x = logits + i * Vr;
    float m = -INFINITY;
    for (std::int64_t v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, S::load(x[v]));
    m = block_max(m);
    if (threadIdx.x == 0) rowmax[i] = m;
  }
}

// stats[i] = (Σ_{v < valid} exp(x[i, v] - rowmax[i]) in double, the target's logit when it is one
// of this shard's real columns, else 0).
template <typename S>
__global__ void vocab_shard_sum_exp_kernel(float* __restrict__ stats, const typename S::storage* __restrict__ logits, const float* __restrict__ rowmax,
                                           const std::int32_t* __restrict__ targets, std::int64_t BT, std::int64_t Vr, std::int64_t first,
                                           std::int64_t valid) {
  for (std::int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const typename S::storage* x = logits + i * Vr;
    const float m = rowmax[i];
    double s = 0.0;
    for (std::int64_t v = threadIdx.x; v < valid; v += blockDim.x) s += exp(static_cast<double>(S::load(x[v]) - m));
    const double total = block_sum(s);
    if (threadIdx.x == 0) {
      const std::int32_t tg = targets[i];
      const std::int64_t t = static_cast<std::int64_t>(tg) - first;
      stats[2 * i] = static_cast<float>(total);
      stats[2 * i + 1] = tg >= 0 && t >= 0 && t < valid ? S::load(x[t]) : 0.0f;
    }
  }
}

// lse[i] = rowmax[i] + log(stats[i, 0]); losses[i] = lse[i] - stats[i, 1], 0 for an ignored target.
__global__ void vocab_parallel_losses_kernel(float* __restrict__ losses, float* __restrict__ lse, const float* __restrict__ rowmax,
                                             const float* __restrict__ stats, const std::int32_t* __restrict__ targets, std::int64_t BT) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < BT; i += stride) {
    const float z = rowmax[i] + logf(stats[2 * i]);
    lse[i] = z;
    losses[i] = targets[i] < 0 ? 0.0f : z - stats[2 * i + 1];
  }
}

// dlogits[i, v] = (exp(x[i, v] - lse[i]) - [first + v == target]) · dloss for v < valid; 0 in the
// padding columns and on an ignored row. No __restrict__: dlogits may be logits (in place).
template <typename S>
__global__ void vocab_shard_ce_backward_kernel(typename S::storage* dlogits, const typename S::storage* logits, const float* __restrict__ lse,
                                               const std::int32_t* __restrict__ targets, std::int64_t BT, std::int64_t Vr, float dloss,
                                               std::int64_t first, std::int64_t valid) {
  for (std::int64_t i = blockIdx.x; i < BT; i += gridDim.x) {
    const typename S::storage* x = logits + i * Vr;
    typename S::storage* d = dlogits + i * Vr;
    const std::int32_t tg = targets[i];
    const float z = lse[i];
    const std::int64_t t = static_cast<std::int64_t>(tg) - first;
    for (std::int64_t v = threadIdx.x; v < Vr; v += blockDim.x) {
      float g = 0.0f;
      if (tg >= 0 && v < valid) g = (expf(S::load(x[v]) - z) - (v == t ? 1.0f : 0.0f)) * dloss;
      d[v] = S::store(g);
    }
  }
}

}  // namespace

cudaError_t launch_vocab_shard_max(float* rowmax, const void* logits, DType t, std::int64_t BT, std::int64_t Vr, std::int64_t valid, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    vocab_shard_max_kernel<S><<<row_blocks(BT), row_block_threads(valid), 0, s>>>(rowmax, static_cast<const P*>(logits), BT, Vr, valid);
    return cudaGetLastError();
  });
}

cudaError_t launch_vocab_shard_sum_exp(float* stats, const void* logits, const float* rowmax, const std::int32_t* targets, DType t, std::int64_t BT,
                                       std::int64_t Vr, std::int64_t first, std::int64_t valid, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    vocab_shard_sum_exp_kernel<S>
        <<<row_blocks(BT), row_block_threads(valid), 0, s>>>(stats, static_cast<const P*>(logits), rowmax, targets, BT, Vr, first, valid);
    return cudaGetLastError();
  });
}

cudaError_t launch_vocab_parallel_losses(float* losses, float* lse, const float* rowmax, const float* stats, const std::int32_t* targets,
                                         std::int64_t BT, cudaStream_t s) {
  if (BT == 0) return cudaSuccess;
  vocab_parallel_losses_kernel<<<grid_for(static_cast<std::size_t>(BT)), kThreads, 0, s>>>(losses, lse, rowmax, stats, targets, BT);
  return cudaGetLastError();
}

cudaError_t launch_vocab_shard_ce_backward(void* dlogits, const void* logits, const float* lse, const std::int32_t* targets, DType t, std::int64_t BT,
                                           std::int64_t Vr, float dloss, std::int64_t first, std::int64_t valid, cudaStream_t s) {
  if (BT == 0 || Vr == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    vocab_shard_ce_backward_kernel<S><<<row_blocks(BT), row_block_threads(Vr), 0, s>>>(static_cast<P*>(dlogits), static_cast<const P*>(logits), lse,
                                                                                       targets, BT, Vr, dloss, first, valid);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
