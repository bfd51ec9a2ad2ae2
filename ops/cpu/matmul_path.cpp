// cpu_gemm_path (ops/kernels/matmul.h): which GEMM the CPU matmul kernels run for a storage dtype.
#include <string>

#include "ops/cpu/cpu_bf16_gemm.h"
#include "ops/kernels/matmul.h"

namespace dstrain {

std::string cpu_gemm_path(DType storage) {
  if (storage == DType::fp32) return "OpenBLAS sgemm";
  if (storage == DType::bf16) return cpu_bf16_gemm_path();  // "onednn avx512_core_bf16", "widened fp32 sgemm (why)"
  return "widened fp32 sgemm";
}

}  // namespace dstrain
