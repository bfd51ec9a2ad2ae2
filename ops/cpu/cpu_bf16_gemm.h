// Which GEMM the CPU matmuls (ops/kernels/matmul.h, matmul_gelu.h) run for bf16 storage, chosen
// once at run time.
//
//   onednn:  oneDNN's matmul primitive on the bf16 operands themselves (AVX512-BF16 `vdpbf16ps`,
//            or AMX tiles where the CPU has them), products accumulated in fp32, the fp32 result
//            (plus bias, plus the old destination for the gradients' +=) rounded once to bf16.
//            Needs a build with oneDNN (CMake option DSTRAIN_ONEDNN, Debian libdnnl-dev) and a
//            CPU on which oneDNN's effective ISA is avx512_core_bf16 or wider.
//   widened: every bf16 tile widened to fp32 and multiplied by OpenBLAS cblas_sgemm (the path of
//            fp16 storage, and of bf16 on CPUs without bf16 dot-product instructions).
//
// Both compute the same thing, a dot product of bf16 values accumulated in fp32 and rounded once;
// they differ only in the order of the fp32 additions (so in the last bits, within the bound of
// tests/unit/kernels/test_matmul_bf16.cpp). The first bf16 matmul picks onednn when it is
// supported, unless the environment variable DSTRAIN_CPU_BF16_GEMM=0 asks for the widened path,
// and logs the choice once. fp32 storage always runs cblas_sgemm; fp16 always the widened path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ops/dtype.h"

namespace dstrain {

enum class CpuBf16Gemm { widened, onednn };

std::string_view cpu_bf16_gemm_name(CpuBf16Gemm path);  // "widened", "onednn"
// Whether `path` can run here: widened always; onednn when built with oneDNN and oneDNN's
// effective CPU ISA has bf16 dot products (avx512_core_bf16, avx512_core_amx).
bool cpu_bf16_gemm_supported(CpuBf16Gemm path);
// The path bf16 matmuls take: decided on the first call (DSTRAIN_CPU_BF16_GEMM=0 forces widened;
// unset or 1: onednn where supported) and logged once. Any other value of the variable is an Error.
CpuBf16Gemm cpu_bf16_gemm();
// Tests and benchmarks: take `path` from now on (Error when it cannot run here).
void set_cpu_bf16_gemm(CpuBf16Gemm path);
// For the trainer's start-up line: "onednn avx512_core_bf16", "onednn avx512_core_amx", or
// "widened fp32 sgemm (<why>)" with why one of "no bf16 instructions", "built without oneDNN",
// "DSTRAIN_CPU_BF16_GEMM=0", "set_cpu_bf16_gemm".
std::string cpu_bf16_gemm_path();

namespace cpu {

// c (M, N) = a·b (+ bias)  or  c += a·b  (accumulate), all bf16 row-major, fp32 accumulation,
// c rounded once: round_bf16(Σ a·b [+ bias] [+ c_old]). a is (M, K), or (K, M) read transposed
// when trans_a; b is (K, N), or (N, K) read transposed when trans_b; bias (N) or nullptr.
// Runs oneDNN's matmul primitive, built once per shape and kept; callable from several threads.
// Only when cpu_bf16_gemm() == CpuBf16Gemm::onednn (an Error otherwise). Errors name `op`.
void onednn_bf16_gemm(const char* op, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, const bf16_t* a,
                      const bf16_t* b, const bf16_t* bias, bf16_t* c, bool accumulate);

}  // namespace cpu
}  // namespace dstrain
