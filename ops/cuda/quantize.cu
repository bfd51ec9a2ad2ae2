// Block quantization, CUDA (ops/kernels/quantize.h): the same bits as ops/cpu/quantize.cpp.
//
// quantize: one thread block per quantization block (a grid-stride loop over blocks): the block's
// absmax and non-finite flag reduced in shared memory, then each thread assembles whole int32
// value words from its block's elements. A word that holds elements of two blocks (the block
// boundary falls inside it: block·bits not a multiple of 32) gets each block's part by atomicOr into
// a word zeroed beforehand; OR does not depend on the order, so the result stays deterministic. Every
// other word is written once with a plain store.
// dequantize: one thread per element, out = q·d (or out + q·d) in fp32, one rounding into out.
//
// The arithmetic is spelled with the _rn intrinsics so that nvcc never contracts or approximates:
// s = 2^(bits-1) / m (the header's 2^bits / (2·m) without the overflow of 2·m, as on the CPU) and
// d = 1 / s are IEEE quotients, x·s an IEEE product, rounded half to even by __float2int_rn.
#include <cstdint>

#include "ops/cuda/kernel_launch.h"
#include "ops/cuda/kernel_math.cuh"

namespace dstrain::cuda_detail {
namespace {

constexpr std::uint32_t kNonFiniteScaleBits = 0x7fc00000u;  // as ops/cpu/quantize.cpp

// q of x in a finite block with scale s: clamp(rne(x·s)). NaN products (s = inf, x = 0: a block
// whose absmax is below 2^(bits-1) / FLT_MAX) give 0, as on the CPU; __float2int_rn saturates ±inf,
// so the clamp below sees them as out of range on both sides.
template <int BITS>
__device__ __forceinline__ std::uint32_t quantize_value(float x, float s) {
  const float p = __fmul_rn(x, s);
  if (isnan(p)) return 0;
  int q = __float2int_rn(p);
  q = q > (1 << (BITS - 1)) - 1 ? (1 << (BITS - 1)) - 1 : q;
  q = q < -(1 << (BITS - 1)) ? -(1 << (BITS - 1)) : q;
  return static_cast<std::uint32_t>(q) & ((1u << BITS) - 1u);
}

template <typename S, int BITS>
__global__ void quantize_blocks_kernel(std::uint32_t* __restrict__ packed, const typename S::storage* __restrict__ x, std::int64_t n,
                                       std::int64_t block, std::int64_t blocks, std::int64_t value_words) {
  constexpr std::int64_t kPerWord = 32 / BITS;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {  // uniform across the thread block: the barriers below are safe
    const std::int64_t begin = b * block, end = begin + block < n ? begin + block : n;
    float m = 0.0f;
    int bad = 0;
    for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = S::load(x[i]);
      bad |= !isfinite(v);
      m = fmaxf(m, fabsf(v));  // a NaN is dropped by fmaxf; `bad` decides for such a block
    }
    m = block_max(m);
    bad = __syncthreads_or(bad);
    float s = 0.0f, d = __uint_as_float(kNonFiniteScaleBits);
    if (!bad) {
      s = m == 0.0f ? 1.0f : __fdiv_rn(static_cast<float>(1 << (BITS - 1)), m);
      d = m == 0.0f ? 1.0f : __fdiv_rn(1.0f, s);
    }
    if (threadIdx.x == 0) packed[value_words + b] = __float_as_uint(d);
    const std::int64_t w_first = begin / kPerWord, w_last = (end - 1) / kPerWord;
    for (std::int64_t w = w_first + threadIdx.x; w <= w_last; w += blockDim.x) {
      const std::int64_t first = w * kPerWord, last = first + kPerWord < n ? first + kPerWord : n;
      const std::int64_t lo = first > begin ? first : begin, hi = last < end ? last : end;
      std::uint32_t word = 0;
      if (!bad)
        for (std::int64_t i = lo; i < hi; ++i) word |= quantize_value<BITS>(S::load(x[i]), s) << ((i - first) * BITS);
      // Element k of a word at bits [k·BITS, (k+1)·BITS): on the little-endian GPU that is byte
      // order = element order, element 2i in the low nibble (the header's layout).
      if (lo == first && hi == last)
        packed[w] = word;  // the word is this block's alone (the last one: its padding stays 0)
      else
        atomicOr(reinterpret_cast<unsigned int*>(packed + w), word);
    }
  }
}

template <typename S, int BITS>
__global__ void dequantize_blocks_kernel(typename S::storage* __restrict__ out, const std::uint32_t* __restrict__ packed, std::int64_t n,
                                         std::int64_t block, std::int64_t value_words, bool accumulate) {
  constexpr std::int64_t kPerWord = 32 / BITS;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t bits = (packed[i / kPerWord] >> ((i % kPerWord) * BITS)) & ((1u << BITS) - 1u);
    const int q = static_cast<int>(bits ^ (1u << (BITS - 1))) - (1 << (BITS - 1));  // sign-extend the two's complement field
    const float v = __fmul_rn(static_cast<float>(q), __uint_as_float(packed[value_words + i / block]));
    out[i] = S::store(accumulate ? __fadd_rn(S::load(out[i]), v) : v);
  }
}

// Threads per quantization block: enough for its elements (the absmax loop), a multiple of 32 for
// block_max, at most kThreads.
unsigned threads_for_block(std::int64_t block) {
  const std::int64_t t = (block + 31) / 32 * 32;
  return static_cast<unsigned>(t < static_cast<std::int64_t>(kThreads) ? t : kThreads);
}

}  // namespace

cudaError_t launch_quantize_blocks(std::int32_t* packed, const void* x, DType t, std::int64_t n, int bits, std::int64_t block, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (bits != 4 && bits != 8) return cudaErrorInvalidValue;
  const std::int64_t per_word = 32 / bits;
  const std::int64_t value_words = (n - 1) / per_word + 1, blocks = (n - 1) / block + 1;
  // Words shared by two blocks are ORed into: zero them first. Only when a block boundary can fall
  // inside a word.
  if ((block * bits) % 32 != 0) {
    const cudaError_t e = cudaMemsetAsync(packed, 0, static_cast<std::size_t>(value_words) * sizeof(std::int32_t), s);
    if (e != cudaSuccess) return e;
  }
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    auto* words = reinterpret_cast<std::uint32_t*>(packed);
    if (bits == 8)
      quantize_blocks_kernel<S, 8><<<grid, threads_for_block(block), 0, s>>>(words, static_cast<const P*>(x), n, block, blocks, value_words);
    else
      quantize_blocks_kernel<S, 4><<<grid, threads_for_block(block), 0, s>>>(words, static_cast<const P*>(x), n, block, blocks, value_words);
    return cudaGetLastError();
  });
}

cudaError_t launch_dequantize_blocks(void* out, const std::int32_t* packed, DType t, std::int64_t n, int bits, std::int64_t block, bool accumulate,
                                     cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (bits != 4 && bits != 8) return cudaErrorInvalidValue;
  const std::int64_t value_words = (n - 1) / (32 / bits) + 1;
  return dispatch_storage(t, [&]<typename S>(S) {
    using P = typename S::storage;
    const auto* words = reinterpret_cast<const std::uint32_t*>(packed);
    if (bits == 8)
      dequantize_blocks_kernel<S, 8>
          <<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), words, n, block, value_words, accumulate);
    else
      dequantize_blocks_kernel<S, 4>
          <<<grid_for(static_cast<std::size_t>(n)), kThreads, 0, s>>>(static_cast<P*>(out), words, n, block, value_words, accumulate);
    return cudaGetLastError();
  });
}

}  // namespace dstrain::cuda_detail
