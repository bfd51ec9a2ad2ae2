// AdamW, CPU: one elementwise pass, parallel over elements. The bias corrections are computed
// once per call in double; the per-element math is fp32, as on the GPU.
#include "ops/kernels/adamw.h"

#include <bit>
#include <cmath>
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"
#include "ops/kernels/stochastic_round.h"

namespace dstrain {
namespace {

using namespace kernel_check;

template <bool kDecoupled, typename G, typename L>
void adamw_impl(float* __restrict p, const G* __restrict g, float* __restrict m, float* __restrict v, L* __restrict lowp, std::int64_t n,
                const AdamWConfig& c) {
  const double t = static_cast<double>(c.step);
  const float bc1 = c.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), t)) : 1.0f;
  const float bc2 = c.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), t)) : 1.0f;
  const float decay = 1.0f - c.lr * c.weight_decay;
  const float b1 = c.beta1, b2 = c.beta2, lr = c.lr, eps = c.eps, gs = c.grad_scale, wd = c.weight_decay;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
  for (std::int64_t i = 0; i < n; ++i) {
    // AdamW decays θ itself; Adam with L2 adds wd·θ to the gradient before the moments.
    const float gi = kDecoupled ? cpu::load(g[i]) * gs : cpu::load(g[i]) * gs + wd * p[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float pi = (kDecoupled ? p[i] * decay : p[i]) - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (std::is_same_v<L, bf16_t>) {
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(pi);
      lowp[i] = c.stochastic_rounding && fp32_bits_finite(bits)
                    ? bf16_t::from_bits(bf16_bits_stochastic(bits, c.rounding_key.element_bits(static_cast<std::uint64_t>(c.rounding_offset + i))))
                    : cpu::store<L>(pi);
    } else if constexpr (!std::is_same_v<L, float>) {
      lowp[i] = cpu::store<L>(pi);
    }
  }
}

template <typename G, typename L>
void adamw_dispatch(float* p, const G* g, float* m, float* v, L* lowp, std::int64_t n, const AdamWConfig& c) {
  if (c.decoupled_weight_decay) {
    adamw_impl<true, G, L>(p, g, m, v, lowp, n, c);
  } else {
    adamw_impl<false, G, L>(p, g, m, v, lowp, n, c);
  }
}

}  // namespace

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWConfig& config) {
  const char* op = "adamw_update";
  const bool gpu = cpu::on_cuda(op, {{"params", params}, {"grads", grads}, {"m", m}, {"v", v}, {"params_lowp", params_lowp}});
  require_present(op, {"params", params});
  require_dtype(op, {"params", params}, DType::fp32);
  require_dtype(op, {"m", m}, DType::fp32);
  require_dtype(op, {"v", v}, DType::fp32);
  require_floating(op, {"grads", grads});
  for (const Arg& a : {Arg{"grads", grads}, Arg{"m", m}, Arg{"v", v}}) {
    require_present(op, a);
    if (a.t.numel() != params.numel()) {
      fail("{}: tensor '{}' has shape {} ({} elements) but params has shape {} ({} elements); they must hold the same number of elements", op,
           a.name, a.t.shape.str(), a.t.numel(), params.shape.str(), params.numel());
    }
  }
  if (!params_lowp.empty()) {
    if (params_lowp.dtype != DType::fp16 && params_lowp.dtype != DType::bf16) {
      fail("{}: params_lowp ({}) must be fp16 or bf16 (or empty for no 16-bit copy)", op, params_lowp.str());
    }
    if (params_lowp.numel() != params.numel()) {
      fail("{}: params_lowp has shape {} but params has shape {}; they must hold the same number of elements", op, params_lowp.shape.str(),
           params.shape.str());
    }
  }
  if (config.step < 1) fail("{}: step = {} but bias correction needs the 1-based step t >= 1", op, config.step);
  if (!(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f && config.beta2 < 1.0f)) {
    fail("{}: betas ({}, {}) must be in [0, 1)", op, config.beta1, config.beta2);
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, adamw_update(params, grads, m, v, params_lowp, config));
  const std::int64_t n = params.numel();
  cpu::dispatch_float(op, grads.dtype, [&]<typename G>(cpu::TypeTag<G>) {
    const G* g = static_cast<const G*>(grads.data);
    auto* p = static_cast<float*>(params.data);
    auto* mp = static_cast<float*>(m.data);
    auto* vp = static_cast<float*>(v.data);
    if (params_lowp.empty()) {
      adamw_dispatch<G, float>(p, g, mp, vp, nullptr, n, config);
    } else if (params_lowp.dtype == DType::fp16) {
      adamw_dispatch<G, fp16_t>(p, g, mp, vp, static_cast<fp16_t*>(params_lowp.data), n, config);
    } else {
      adamw_dispatch<G, bf16_t>(p, g, mp, vp, static_cast<bf16_t*>(params_lowp.data), n, config);
    }
  });
}

}  // namespace dstrain
