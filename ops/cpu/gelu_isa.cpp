// GELU's element loops for one ISA (ops/cpu/gelu_isa.h; this file is compiled once per ISA).
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/gelu_isa.h"
#include "ops/cpu/isa_target.h"

DSTRAIN_ISA_BEGIN
namespace dstrain::cpu::DSTRAIN_ISA_NS {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

template <typename T>
void forward(T* o, const T* x, std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) {
    const float v = cpu::load(x[i]);
    const float cube = kGeluCubic * v * v * v;
    o[i] = cpu::store<T>(0.5f * v * (1.0f + cpu::fast_tanh(kGeluScale * (v + cube))));
  }
}

template <typename T>
void backward(T* __restrict d, const T* __restrict x, const T* __restrict g, std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) {
    const float v = cpu::load(x[i]);
    const float cube = kGeluCubic * v * v * v;
    // tanh and sech^2 from one exp: sech^2 = 4e / (e + 1)^2 avoids the cancellation of
    // 1 - tanh^2 where tanh is near +-1 (the tails, where the gradient is small but not zero).
    const float e = cpu::fast_exp(2.0f * kGeluScale * (v + cube));
    const float inv = 1.0f / (e + 1.0f);
    const float th = 1.0f - 2.0f * inv;
    // (e·inv) first: e reaches 3.3e38 where fast_exp clamps (v > ~10.5), and 4·e would overflow
    // to inf, then inf·inv·inv = inf or NaN (inv subnormal) -> a NaN gradient mid-training.
    const float sech2 = 4.0f * (e * inv) * inv;
    const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    d[i] = cpu::store<T>(cpu::load(d[i]) + local * cpu::load(g[i]));
  }
}

}  // namespace

void gelu_forward_range(DType dtype, void* out, const void* inp, std::int64_t begin, std::int64_t end) {
  switch (dtype) {
    case DType::fp32:
      return forward(static_cast<float*>(out), static_cast<const float*>(inp), begin, end);
    case DType::bf16:
      return forward(static_cast<bf16_t*>(out), static_cast<const bf16_t*>(inp), begin, end);
    case DType::fp16:
      return forward(static_cast<fp16_t*>(out), static_cast<const fp16_t*>(inp), begin, end);
    default:
      return;  // not a storage dtype: gelu_forward refused it (require_same_dtype)
  }
}

void gelu_backward_range(DType dtype, void* dinp, const void* inp, const void* dout, std::int64_t begin, std::int64_t end) {
  switch (dtype) {
    case DType::fp32:
      return backward(static_cast<float*>(dinp), static_cast<const float*>(inp), static_cast<const float*>(dout), begin, end);
    case DType::bf16:
      return backward(static_cast<bf16_t*>(dinp), static_cast<const bf16_t*>(inp), static_cast<const bf16_t*>(dout), begin, end);
    case DType::fp16:
      return backward(static_cast<fp16_t*>(dinp), static_cast<const fp16_t*>(inp), static_cast<const fp16_t*>(dout), begin, end);
    default:
      return;  // not a storage dtype: gelu_backward refused it (require_same_dtype)
  }
}

}  // namespace dstrain::cpu::DSTRAIN_ISA_NS
DSTRAIN_ISA_END
