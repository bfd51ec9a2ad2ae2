// cpu_gemm_path (ops/kernels/matmul.h): which GEMM the CPU matmul kernels run for a storage dtype.
#include <string>

#include "ops/cpu/cpu_bf16_gemm.h"
#include "ops/kernels/matmul.h"

namespace dstrain {

std::string cpu_gemm_path(DType storage) {
  if (storage == DType::fp32) return "OpenBLAS sgemm";
  if (storage == DType::bf16) {
    if (cpu_bf16_gemm() == CpuBf16Gemm::onednn) return "oneDNN bf16 matmul (" + cpu_bf16_gemm_path().substr(7) + ")";  // after "onednn "
    return "OpenBLAS sgemm on tiles widened to fp32 (" + cpu_bf16_gemm_path().substr(std::string("widened fp32 sgemm (").size());
  }
  return "OpenBLAS sgemm on tiles widened to fp32";
}

}  // namespace dstrain
