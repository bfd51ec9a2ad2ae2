// The kernel of cuda_rank_reduce (rank_reduce.h): one thread per element (grid-stride), reading
// the W inputs in rank order, so every element's result is the host reduction's
// (zero/local_communicator.cpp reduce_into) bit for bit. Host-side checks live in
// rank_reduce.cpp: nvcc cannot compile fmt (ops/error.h).
//
// Exactness: only IEEE adds and one IEEE division per element (nvcc's defaults: -prec-div=true,
// -ftz=false; nothing to contract into an FMA), the same operations in the same order as the CPU.
// 16-bit loads and stores follow ops/dtype.h's NaN policy, as ops/cuda/cast.cu does (the
// hardware conversions may return a canonical NaN; the CPU keeps sign and payload).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "ops/cuda/exact_storage.cuh"
#include "ops/cuda/rank_reduce.h"
#include "ops/dtype.h"

namespace dstrain {
namespace {

// Storage types: load into the accumulation type, store with one rounding (exact_storage.cuh).
using cuda_exact::BF16;
using cuda_exact::F16;
using cuda_exact::F32;

struct F64 {
  using storage = double;
  using acc = double;
  __device__ static double load(double x) { return x; }
  __device__ static double store(double x) { return x; }
};

struct I32 {
  using storage = std::int32_t;
  using acc = std::int32_t;
  __device__ static std::int32_t load(std::int32_t x) { return x; }
  __device__ static std::int32_t store(std::int32_t x) { return x; }
};

// The host's add and max_of (zero/local_communicator.cpp): int32 sums wrap (computed in uint32);
// a NaN wins a max (the first in rank order, bits kept), and ties keep the earlier rank's value
// (so max(−0, +0) is −0 when rank 0 holds −0, as on the CPU).
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ std::int32_t add(std::int32_t a, std::int32_t b) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
}
__device__ __forceinline__ float max_of(float a, float b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return b > a ? b : a;
}
__device__ __forceinline__ double max_of(double a, double b) {
  if (isnan(a)) return a;
  if (isnan(b)) return b;
  return b > a ? b : a;
}
__device__ __forceinline__ std::int32_t max_of(std::int32_t a, std::int32_t b) { return b > a ? b : a; }

// Passed by value: 1 KiB of kernel parameters (the limit is 4 KiB), no device copy of the
// pointer arrays and so nothing to keep alive until the kernel runs.
struct Buffers {
  const void* in[kRankReduceMaxBuffers];
  void* out[kRankReduceMaxBuffers];
};

template <typename S>
__global__ void rank_reduce_kernel(Buffers b, int n_in, int n_out, std::size_t n, int op) {
  using T = typename S::storage;
  using A = typename S::acc;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    A acc = S::load(static_cast<const T*>(b.in[0])[i]);
    for (int r = 1; r < n_in; ++r) {
      const A v = S::load(static_cast<const T*>(b.in[r])[i]);
      acc = op == static_cast<int>(RankReduceOp::max) ? max_of(acc, v) : add(acc, v);
    }
    if constexpr (std::is_same_v<A, double>) {
      if (op == static_cast<int>(RankReduceOp::avg)) acc = __ddiv_rn(acc, static_cast<double>(n_in));
    } else if constexpr (!std::is_same_v<A, std::int32_t>) {
      if (op == static_cast<int>(RankReduceOp::avg)) acc = __fdiv_rn(acc, static_cast<float>(n_in));
    }
    // Every input of element i was read above: outputs may alias inputs (all-reduce in place).
    const T result = S::store(acc);
    for (int k = 0; k < n_out; ++k) static_cast<T*>(b.out[k])[i] = result;
  }
}

template <typename S>
cudaError_t launch(const Buffers& b, int n_in, int n_out, std::size_t n, RankReduceOp op, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  constexpr std::size_t kMaxBlocks = 65536;  // enough to fill any current GPU; the loop covers the rest
  const std::size_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  rank_reduce_kernel<S><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(b, n_in, n_out, n, static_cast<int>(op));
  return cudaGetLastError();
}

}  // namespace

namespace detail {

// Called by cuda_rank_reduce (rank_reduce.cpp) after it checked the arguments.
cudaError_t launch_rank_reduce_kernel(const void* const* in, int n_in, void* const* out, int n_out, DType dtype, std::size_t n, RankReduceOp op,
                                      cudaStream_t stream) {
  Buffers b{};
  for (int r = 0; r < n_in; ++r) b.in[r] = in[r];
  for (int k = 0; k < n_out; ++k) b.out[k] = out[k];
  switch (dtype) {
    case DType::fp32:
      return launch<F32>(b, n_in, n_out, n, op, stream);
    case DType::fp16:
      return launch<F16>(b, n_in, n_out, n, op, stream);
    case DType::bf16:
      return launch<BF16>(b, n_in, n_out, n, op, stream);
    case DType::int32:
      return launch<I32>(b, n_in, n_out, n, op, stream);
    case DType::fp64:
      return launch<F64>(b, n_in, n_out, n, op, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace detail
}  // namespace dstrain
