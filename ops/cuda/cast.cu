// fp32 <-> fp16 <-> bf16 kernels. Non-NaN values go through CUDA's round-to-nearest-even
// intrinsics (__float2half_rn, __float2bfloat16_rn) and the exact widenings. NaNs are handled
// explicitly so that the bits match the CPU reference whatever NaN the hardware would produce
// (the conversion instructions may return a canonical NaN; ops/dtype.h keeps sign and payload).
//
// Host-side checks live in cast.cpp: nvcc's front end cannot compile fmt's compile-time-checked
// format strings, so this file has kernels and launches only.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime_api.h>

#include "ops/cuda/exact_storage.cuh"
#include "ops/dtype.h"

namespace dstrain {
namespace {

using cuda_exact::BF16;
using cuda_exact::F16;
using cuda_exact::F32;

// Grid-stride loop over n elements (n may exceed the grid, and 2^31).
template <typename Src, typename Dst>
__global__ void convert_kernel(const typename Src::storage* __restrict__ src, typename Dst::storage* __restrict__ dst, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = Dst::store(Src::load(src[i]));
  }
}

template <typename Src, typename Dst>
cudaError_t launch(const void* src, void* dst, std::size_t n, cudaStream_t stream) {
  constexpr unsigned kThreads = 256;
  constexpr std::size_t kMaxBlocks = 65536;  // enough to fill any current GPU; the loop covers the rest
  const std::size_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  convert_kernel<Src, Dst><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const typename Src::storage*>(src),
                                                                                   static_cast<typename Dst::storage*>(dst), n);
  return cudaGetLastError();
}

template <typename Src>
cudaError_t launch_from(const void* src, void* dst, DType dst_type, std::size_t n, cudaStream_t stream) {
  switch (dst_type) {
    case DType::fp32:
      return launch<Src, F32>(src, dst, n, stream);
    case DType::fp16:
      return launch<Src, F16>(src, dst, n, stream);
    case DType::bf16:
      return launch<Src, BF16>(src, dst, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

namespace detail {

// Called by cuda_convert (cast.cpp) after it checked the arguments; types differ and are floating.
cudaError_t launch_convert_kernel(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t stream) {
  switch (src_type) {
    case DType::fp32:
      return launch_from<F32>(src, dst, dst_type, n, stream);
    case DType::fp16:
      return launch_from<F16>(src, dst, dst_type, n, stream);
    case DType::bf16:
      return launch_from<BF16>(src, dst, dst_type, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace detail
}  // namespace dstrain
