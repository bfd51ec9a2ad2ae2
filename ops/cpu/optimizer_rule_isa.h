// The element loop of the element-wise optimizer rules (ops/kernels/optimizer_rule.h), per ISA
// (ops/cpu/isa_target.h); private to ops/cpu.
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"
#include "ops/kernels/optimizer_rule_step.h"

namespace dstrain::cpu {

inline constexpr int kMaxRuleStates = 3;

// One call's arguments, checked by optimizer_rule_update (ops/cpu/optimizer_rule.cpp).
struct RuleArgs {
  float* p;
  const void* g;
  DType g_dtype;
  float* s[kMaxRuleStates];
  void* lowp;  // nullptr: no 16-bit copy
  DType lowp_dtype;
  RuleStep k;
};

DSTRAIN_DECLARE_ISA_VARIANTS(void optimizer_rule_range(const RuleArgs& a, std::int64_t begin, std::int64_t end))

}  // namespace dstrain::cpu
