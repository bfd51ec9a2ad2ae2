// cpu_gemm_path (ops/kernels/matmul.h): which GEMM the CPU matmul kernels run for a storage dtype.
#include <string>

#include "ops/kernels/matmul.h"

namespace dstrain {

std::string cpu_gemm_path(DType storage) {
  if (storage == DType::fp32) return "OpenBLAS sgemm";
  return "OpenBLAS sgemm on tiles widened to fp32";
}

}  // namespace dstrain
