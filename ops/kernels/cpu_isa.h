// The instruction set of the CPU optimizer kernels, chosen once at run time.
//
// The optimizer updates (adamw, sgd, lamb, adagrad, lion, rmsprop, adamax, nadam, radam, the
// 1-bit family's element passes) are compiled three times (ops/cpu/*_isa.cpp): for the baseline
// x86-64 ISA (`scalar`: SSE2, the library's own target), for AVX2 and for AVX-512
// (avx512f/bw/vl/dq, 512-bit vectors). The first kernel call picks the widest set this CPU and
// its OS support (CPUID through __builtin_cpu_supports), unless the environment variable
// DSTRAIN_CPU_ISA names one (scalar, avx2, avx512), and logs the choice once.
//
// Every variant performs the same fp32 operations in the same order, with no contraction into
// FMA (-ffp-contract=off), so all three give bit-identical results (tests/unit/kernels/
// test_cpu_isa.cpp); only the vector width differs. The updates are memory-bound, so an FMA would
// change the last bit of the results without making them faster.
#pragma once

#include <string_view>

namespace dstrain {

enum class CpuIsa { scalar, avx2, avx512 };

std::string_view cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512"
// Whether this CPU (and its OS, which must save the vector registers) can run `isa`.
bool cpu_isa_supported(CpuIsa isa);
// The widest supported set.
CpuIsa detected_cpu_isa();
// The set the kernels use: decided on the first call (DSTRAIN_CPU_ISA, else detected_cpu_isa())
// and logged once. An unknown or unsupported DSTRAIN_CPU_ISA is an Error naming the variable.
CpuIsa cpu_isa();
// Tests and benchmarks: use `isa` from now on (Error when this CPU cannot run it).
void set_cpu_isa(CpuIsa isa);

}  // namespace dstrain
