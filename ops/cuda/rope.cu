// RoPE CUDA kernel (forward and its transpose, the backward): one thread per (token, pair j),
// computing the angle's cos/sin once and rotating that pair in every rotated head; the same thread
// copies pair j of the heads that are not rotated. Semantics as ops/cpu/rope.cpp: the angle is the
// fp32 product position·inv_freq, its cos/sin taken in double and rounded once (as the CPU), so the
// rotation's factors are the same bits on both backends.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

// out may alias inp: each element is read and written by one thread, the pair read before written.
template <typename S>
__global__ void rope_kernel(typename S::storage* out, const typename S::storage* inp, const float* __restrict__ inv_freq, std::int64_t rows,
                            std::int64_t T, std::int64_t H, std::int64_t D, std::int64_t rotate_heads, std::int64_t pos_offset, float sign) {
  const std::int64_t h = D / 2, n = rows * h, row = H * D;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / h, j = i % h;
    const float pos = static_cast<float>(r % T + pos_offset);
    const double angle = static_cast<double>(__fmul_rn(pos, inv_freq[j]));  // fp32 product, not fused into anything
    double sd, cd;
    sincos(angle, &sd, &cd);
    const float c = static_cast<float>(cd), sn = sign * static_cast<float>(sd);
    typename S::storage* o = out + r * row;
    const typename S::storage* x = inp + r * row;
    for (std::int64_t hd = 0; hd < rotate_heads; ++hd) {
      const std::int64_t k = hd * D + j;
      const float x1 = S::load(x[k]), x2 = S::load(x[k + h]);
      o[k] = S::store(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn)));  // no FMA: the CPU's roundings
      o[k + h] = S::store(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn)));
    }
    if (o != x) {
      for (std::int64_t hd = rotate_heads; hd < H; ++hd) {
        o[hd * D + j] = x[hd * D + j];
        o[hd * D + j + h] = x[hd * D + j + h];
      }
    }
  }
}

}  // namespace

cudaError_t launch_rope(void* out, const void* inp, const float* inv_freq, DType t, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                        std::int64_t rotate_heads, std::int64_t pos_offset, bool transpose, cudaStream_t s) {
  const std::int64_t n = B * T * (D / 2);
  if (n == 0 || H == 0) return cudaSuccess;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    rope_kernel<S><<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), static_cast<const P*>(inp), inv_freq, B * T, T, H,
                                                                              D, rotate_heads, pos_offset, transpose ? -1.0f : 1.0f);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
