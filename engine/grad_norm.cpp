#include "engine/grad_norm.h"

#include <cmath>

#include "ops/kernels/grad_norm_overflow.h"

namespace dstrain {

// The fused kernel's sum of squares (double, deterministic for any thread count; any dtype and
// device it supports), summed over the tensors.
double global_grad_norm(std::span<const Tensor> grads) {
  double total = 0.0;
  for (const Tensor& t : grads)
    if (!t.empty()) total += grad_norm_overflow(t).norm_sq;
  return std::sqrt(total);
}

float clip_coefficient(double norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace dstrain
