// AdamW's element loop, per ISA (ops/cpu/isa_target.h); private to ops/cpu.
#pragma once

#include <cstdint>

#include "ops/cpu/isa_dispatch.h"
#include "ops/dtype.h"
#include "ops/kernels/adamw.h"

namespace dstrain::cpu {

// One call's arguments, checked by adamw_update (ops/cpu/adamw.cpp); bc1 / bc2 are the bias
// corrections (1 when disabled), computed once per call in double and rounded to fp32.
struct AdamWArgs {
  float* p;
  const void* g;
  DType g_dtype;
  float* m;
  float* v;
  void* lowp;  // nullptr: no 16-bit copy
  DType lowp_dtype;
  AdamWConfig c;
  float bc1, bc2;
};

DSTRAIN_DECLARE_ISA_VARIANTS(void adamw_range(const AdamWArgs& a, std::int64_t begin, std::int64_t end))

}  // namespace dstrain::cpu
