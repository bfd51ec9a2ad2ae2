#include "ops/cuda/cast.h"

#include "ops/cuda/cuda_check.h"
#include "ops/error.h"

namespace dstrain {

namespace detail {
// Defined in cast.cu: launches the kernel for two different floating dtypes; returns the launch status.
cudaError_t launch_convert_kernel(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t stream);
}  // namespace detail

void cuda_convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n, cudaStream_t stream) {
  DSTRAIN_CHECK(is_floating(src_type) && is_floating(dst_type),
                "cuda_convert: {} -> {} is not a floating-point conversion; it takes fp32, fp16 or bf16", dtype_name(src_type), dtype_name(dst_type));
  if (n == 0) return;
  DSTRAIN_CHECK(src != nullptr && dst != nullptr, "cuda_convert: null pointer for {} elements ({} -> {})", n, dtype_name(src_type),
                dtype_name(dst_type));
  if (src_type == dst_type) {
    DSTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * dtype_size(src_type), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  DSTRAIN_CUDA_CHECK(detail::launch_convert_kernel(src, src_type, dst, dst_type, n, stream));
}

}  // namespace dstrain
