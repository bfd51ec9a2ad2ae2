// The element-wise optimizer rules, CPU: argument checks (for both backends), then one pass split
// over the threads in the ISA chosen at run time (ops/cpu/optimizer_rule_isa.cpp).
#include "ops/kernels/optimizer_rule.h"

#include <cstdint>
#include <string>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/optimizer_rule_isa.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {

using namespace kernel_check;

void optimizer_rule_update(const RuleStep& step, Tensor params, Tensor grads, std::span<const Tensor> states, Tensor params_lowp) {
  const char* op = "optimizer_rule_update";
  const std::int64_t n = params.numel();
  if (static_cast<int>(states.size()) != step.states || step.states > cpu::kMaxRuleStates) {
    fail("{}: the rule keeps {} per-element state(s) but {} tensor(s) were passed", op, step.states, states.size());
  }
  bool gpu = cpu::on_cuda(op, {{"params", params}, {"grads", grads}, {"params_lowp", params_lowp}});
  const std::string names[cpu::kMaxRuleStates] = {"states[0]", "states[1]", "states[2]"};
  for (std::size_t j = 0; j < states.size(); ++j) gpu = cpu::on_cuda(op, {{"params", params}, {names[j].c_str(), states[j]}}) || gpu;
  require_present(op, {"params", params});
  require_dtype(op, {"params", params}, DType::fp32);
  require_present(op, {"grads", grads});
  require_floating(op, {"grads", grads});
  if (grads.numel() != n) {
    fail("{}: tensor 'grads' has shape {} but params has shape {}; they must hold the same number of elements", op, grads.shape.str(),
         params.shape.str());
  }
  for (std::size_t j = 0; j < states.size(); ++j) {
    const Arg a{names[j].c_str(), states[j]};
    require_present(op, a);
    require_dtype(op, a, DType::fp32);
    if (states[j].numel() != n) {
      fail("{}: tensor '{}' has shape {} but params has shape {}; they must hold the same number of elements", op, names[j], states[j].shape.str(),
           params.shape.str());
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
  DSTRAIN_RETURN_ON_CUDA(gpu, optimizer_rule_update(step, params, grads, states, params_lowp));
  cpu::RuleArgs args{static_cast<float*>(params.data),
                     grads.data,
                     grads.dtype,
                     {nullptr, nullptr, nullptr},
                     params_lowp.empty() ? nullptr : params_lowp.data,
                     params_lowp.dtype,
                     step};
  for (std::size_t j = 0; j < states.size(); ++j) args.s[j] = static_cast<float*>(states[j].data);
  const auto range = cpu::isa_select(cpu::scalar::optimizer_rule_range, cpu::avx2::optimizer_rule_range, cpu::avx512::optimizer_rule_range);
  cpu::for_each_block(n, [&](std::int64_t b, std::int64_t e) { range(args, b, e); });
}

}  // namespace dstrain
