// The argument checks of matmul_forward / matmul_backward (private to ops/cpu), shared with the
// ops built on them (matmul_gelu.cpp), so every entry point checks its arguments once for both
// backends before dispatching.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain::cpu {

struct MmShape {
  std::int64_t BT, C, OC;
};

// Throw Error naming `op`, the tensor and the expected shape or dtype.
MmShape check_matmul_forward_args(const char* op, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                                  const Tensor& scratch);
MmShape check_matmul_backward_args(const char* op, const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& scratch);

}  // namespace dstrain::cpu
