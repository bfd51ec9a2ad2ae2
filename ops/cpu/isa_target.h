// For the per-ISA element loops of the CPU optimizer kernels (ops/kernels/cpu_isa.h).
//
// Each ops/cpu/<op>_isa.cpp is compiled three times, from wrappers the build generates
// (ops/CMakeLists.txt, dstrain_isa_variants) that define DSTRAIN_ISA_AVX512, DSTRAIN_ISA_AVX2 or
// neither before including it. The file includes everything it uses first, then this header, and
// defines its loops between DSTRAIN_ISA_BEGIN and DSTRAIN_ISA_END inside namespace
// dstrain::cpu::DSTRAIN_ISA_NS:
//
//   #include "ops/cpu/cpu_common.h"     // ... every header first: compiled for the baseline ISA
//   #include "ops/cpu/isa_target.h"     // last
//   DSTRAIN_ISA_BEGIN
//   namespace dstrain::cpu::DSTRAIN_ISA_NS { void adamw_range(...) { ... } }
//   DSTRAIN_ISA_END
//
// Why a target pragma rather than -mavx512f on the file: inline functions and templates from the
// headers (cpu::load, std::min, ...) are emitted, when not inlined, as one shared copy that the
// linker may take from any object file; compiled with -mavx512f that copy could run on a CPU
// without AVX-512. Under the pragma only the functions defined between BEGIN and END get the
// wider ISA, and the headers' inline functions (baseline ISA, a subset) are inlined into them.
// -ffp-contract=off (ops/CMakeLists.txt) keeps the compiler from fusing a*b+c into an FMA, which
// the AVX-512 target would otherwise allow: every variant rounds exactly as the scalar one.
#pragma once

// The target strings are spelled out in each pragma: a pragma's text is not macro-expanded.
#if defined(DSTRAIN_ISA_AVX512) && defined(__clang__)
#define DSTRAIN_ISA_NS avx512
#define DSTRAIN_ISA_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq\"))), apply_to = function)") \
  _Pragma("clang attribute push(__attribute__((min_vector_width(512))), apply_to = function)")
// (clang knows no "prefer-vector-width=512" target feature, and a target string holding one is
// ignored whole — the avx512 variants then compiled for the baseline; min_vector_width is its way.)
#define DSTRAIN_ISA_END _Pragma("clang attribute pop") _Pragma("clang attribute pop")
#elif defined(DSTRAIN_ISA_AVX512)
#define DSTRAIN_ISA_NS avx512
#define DSTRAIN_ISA_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512\")")
#define DSTRAIN_ISA_END _Pragma("GCC pop_options")
#elif defined(DSTRAIN_ISA_AVX2) && defined(__clang__)
#define DSTRAIN_ISA_NS avx2
#define DSTRAIN_ISA_BEGIN _Pragma("clang attribute push(__attribute__((target(\"avx2\"))), apply_to = function)")
#define DSTRAIN_ISA_END _Pragma("clang attribute pop")
#elif defined(DSTRAIN_ISA_AVX2)
#define DSTRAIN_ISA_NS avx2
#define DSTRAIN_ISA_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2\")")
#define DSTRAIN_ISA_END _Pragma("GCC pop_options")
#else
#define DSTRAIN_ISA_NS scalar
#define DSTRAIN_ISA_BEGIN
#define DSTRAIN_ISA_END
#endif
