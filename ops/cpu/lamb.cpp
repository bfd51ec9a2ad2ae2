// LAMB, CPU: per tensor range, pass 1 updates m and v and sums ||θ||² and ||u||² in double over
// blocks fixed by the range length (deterministic for any thread count), then the trust ratio,
// then pass 2 recomputes u from the new m, v (the same fp32 arithmetic, so the same u, as
// DeepSpeed's part-3 kernel does) and updates θ. No scratch: block partials live on the stack.
#include "ops/kernels/lamb.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

constexpr std::int64_t kMaxBlocks = 256;
constexpr std::int64_t kMinBlockElems = 4096;

struct Sums {
  double w = 0, u = 0;
};

inline float denom(float v, float eps, bool inside) { return inside ? std::sqrt(v + eps) : std::sqrt(v) + eps; }

template <typename G, typename L>
float lamb_range(float* __restrict p, const G* __restrict g, float* __restrict m, float* __restrict v, L* __restrict lowp, std::int64_t begin,
                 std::int64_t len, float step_size, const LambConfig& c) {
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps, wd = c.weight_decay, gs = c.grad_scale;
  const bool inside = c.eps_inside_sqrt;
  const std::int64_t blocks = std::clamp<std::int64_t>((len + kMinBlockElems - 1) / kMinBlockElems, 1, kMaxBlocks);
  const std::int64_t per = (len + blocks - 1) / blocks;
  std::array<Sums, kMaxBlocks> part{};
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(len))
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t lo = begin + std::min(len, b * per), hi = begin + std::min(len, b * per + per);
    Sums s;
    for (std::int64_t i = lo; i < hi; ++i) {
      const float gi = cpu::load(g[i]) * gs;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float u = mi / denom(vi, eps, inside) + wd * p[i];
      s.w += static_cast<double>(p[i]) * static_cast<double>(p[i]);
      s.u += static_cast<double>(u) * static_cast<double>(u);
    }
    part[static_cast<std::size_t>(b)] = s;
  }
  Sums total;
  for (std::int64_t b = 0; b < blocks; ++b) {
    total.w += part[static_cast<std::size_t>(b)].w;
    total.u += part[static_cast<std::size_t>(b)].u;
  }
  const float w_norm = static_cast<float>(std::sqrt(total.w)), u_norm = static_cast<float>(std::sqrt(total.u));
  float coeff = 1.0f;
  if (w_norm != 0.0f && u_norm != 0.0f) {
    coeff = w_norm / u_norm;
    if (coeff > c.max_coeff) coeff = c.max_coeff;
    if (coeff < c.min_coeff) coeff = c.min_coeff;
  }
  const float rate = step_size * coeff;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(len))
  for (std::int64_t i = begin; i < begin + len; ++i) {
    const float u = m[i] / denom(v[i], eps, inside) + wd * p[i];
    const float pi = p[i] - rate * u;
    p[i] = pi;
    if constexpr (!std::is_same_v<L, float>) lowp[i] = cpu::store<L>(pi);
  }
  return coeff;
}

}  // namespace

void lamb_update(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, std::span<const TensorRange> ranges, Tensor lamb_coeffs,
                 const LambConfig& config) {
  const char* op = "lamb_update";
  const bool gpu =
      cpu::on_cuda(op, {{"params", params}, {"grads", grads}, {"m", m}, {"v", v}, {"params_lowp", params_lowp}, {"lamb_coeffs", lamb_coeffs}});
  require_present(op, {"params", params});
  require_dtype(op, {"params", params}, DType::fp32);
  require_dtype(op, {"m", m}, DType::fp32);
  require_dtype(op, {"v", v}, DType::fp32);
  require_floating(op, {"grads", grads});
  const std::int64_t n = params.numel();
  for (const Arg& a : {Arg{"grads", grads}, Arg{"m", m}, Arg{"v", v}}) {
    require_present(op, a);
    if (a.t.numel() != n) {
      fail("{}: tensor '{}' has shape {} ({} elements) but params has shape {} ({} elements); they must hold the same number of elements", op, a.name,
           a.t.shape.str(), a.t.numel(), params.shape.str(), n);
    }
  }
  if (!params_lowp.empty()) {
    if (params_lowp.dtype != DType::fp16 && params_lowp.dtype != DType::bf16) {
      fail("{}: params_lowp ({}) must be fp16 or bf16 (or empty for no 16-bit copy)", op, params_lowp.str());
    }
    if (params_lowp.numel() != n) {
      fail("{}: params_lowp has shape {} but params has shape {}; they must hold the same number of elements", op, params_lowp.shape.str(),
           params.shape.str());
    }
  }
  if (!lamb_coeffs.empty()) {
    require_dtype(op, {"lamb_coeffs", lamb_coeffs}, DType::fp32);
    if (lamb_coeffs.numel() != static_cast<std::int64_t>(ranges.size())) {
      fail("{}: lamb_coeffs has shape {} but there are {} tensor ranges; pass one fp32 slot per range (or an empty Tensor)", op,
           lamb_coeffs.shape.str(), ranges.size());
    }
  }
  std::int64_t end_prev = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    const TensorRange& r = ranges[k];
    if (r.offset < end_prev || r.numel < 0 || r.offset > n || r.numel > n - r.offset) {
      fail(
          "{}: tensor range {} = [{}, {}) is {} the flat buffer of {} elements; ranges must be sorted by offset, not overlap, and lie "
          "inside the buffer (one range per parameter tensor)",
          op, k, r.offset, r.offset + r.numel, r.offset < end_prev ? "overlapping the previous range in" : "outside", n);
    }
    end_prev = r.offset + r.numel;
  }
  if (config.step < 1) fail("{}: step = {} but bias correction needs the 1-based step t >= 1", op, config.step);
  if (!(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f && config.beta2 < 1.0f)) {
    fail("{}: betas ({}, {}) must be in [0, 1)", op, config.beta1, config.beta2);
  }
  if (!(config.lr >= 0.0f)) fail("{}: lr = {} must be >= 0", op, config.lr);
  if (!(config.min_coeff >= 0.0f && config.max_coeff >= config.min_coeff)) {
    fail("{}: min_coeff = {}, max_coeff = {}; the trust-ratio clamp needs 0 <= min_coeff <= max_coeff (DeepSpeed defaults 0.01 and 10)", op,
         config.min_coeff, config.max_coeff);
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, lamb_update(params, grads, m, v, params_lowp, ranges, lamb_coeffs, config));
  // step_size as DeepSpeed's host code: bias corrections in double (std::pow), then fp32.
  float step_size = config.lr;
  if (config.bias_correction) {
    const double t = static_cast<double>(config.step);
    const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), t));
    const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), t));
    step_size = config.lr * std::sqrt(bc2) / bc1;
  }
  auto* coeffs = lamb_coeffs.empty() ? nullptr : static_cast<float*>(lamb_coeffs.data);
  cpu::dispatch_float(op, grads.dtype, [&]<typename G>(cpu::TypeTag<G>) {
    const G* g = static_cast<const G*>(grads.data);
    auto* p = static_cast<float*>(params.data);
    auto* mp = static_cast<float*>(m.data);
    auto* vp = static_cast<float*>(v.data);
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      const TensorRange& r = ranges[k];
      if (r.numel == 0) {
        if (coeffs) coeffs[k] = 1.0f;
        continue;
      }
      float c;
      if (params_lowp.empty()) {
        c = lamb_range<G, float>(p, g, mp, vp, nullptr, r.offset, r.numel, step_size, config);
      } else if (params_lowp.dtype == DType::fp16) {
        c = lamb_range<G, fp16_t>(p, g, mp, vp, static_cast<fp16_t*>(params_lowp.data), r.offset, r.numel, step_size, config);
      } else {
        c = lamb_range<G, bf16_t>(p, g, mp, vp, static_cast<bf16_t*>(params_lowp.data), r.offset, r.numel, step_size, config);
      }
      if (coeffs) coeffs[k] = c;
    }
  });
}

}  // namespace dstrain
