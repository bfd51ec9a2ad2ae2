// AdamW, CPU: argument checks, then one element-wise pass split over the threads, in the ISA
// chosen at run time (ops/cpu/adamw_isa.cpp). The bias corrections are computed once per call in
// double; the per-element math is fp32, as on the GPU.
#include "ops/kernels/adamw.h"

#include <cmath>
#include <cstdint>

#include "ops/cpu/adamw_isa.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {

using namespace kernel_check;

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
      fail("{}: tensor '{}' has shape {} ({} elements) but params has shape {} ({} elements); they must hold the same number of elements", op, a.name,
           a.t.shape.str(), a.t.numel(), params.shape.str(), params.numel());
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
  const double t = static_cast<double>(config.step);
  const cpu::AdamWArgs args{static_cast<float*>(params.data),
                            grads.data,
                            grads.dtype,
                            static_cast<float*>(m.data),
                            static_cast<float*>(v.data),
                            params_lowp.empty() ? nullptr : params_lowp.data,
                            params_lowp.dtype,
                            config,
                            config.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), t)) : 1.0f,
                            config.bias_correction ? static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta2), t)) : 1.0f};
  const auto range = cpu::isa_select(cpu::scalar::adamw_range, cpu::avx2::adamw_range, cpu::avx512::adamw_range);
  cpu::for_each_block(params.numel(), [&](std::int64_t b, std::int64_t e) { range(args, b, e); });
}

}  // namespace dstrain
