// Matmul of a linear layer, nn.Linear layout: out = inp · weightᵀ + bias.
//
// fp32 storage goes straight to BLAS sgemm (OpenBLAS on the CPU). fp16/bf16 storage is widened
// tile by tile into a caller-provided fp32 scratch buffer and multiplied with sgemm per tile;
// results accumulate in fp32 and are rounded into the 16-bit output once. On CPUs with bf16 dot
// products, bf16 storage instead runs oneDNN's bf16 matmul (ops/cpu/cpu_bf16_gemm.h): also fp32
// accumulation and one rounding, of the same sum in another order; the scratch is then unused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/tensor.h"

namespace dstrain {

// Rows per tile of the 16-bit path (both the BT and the OC dimension are cut in tiles of this).
inline constexpr std::int64_t kMatmulTile = 256;

// fp32 scratch elements that matmul_forward / matmul_backward need for storage dtype `storage`
// and input width C: 0 for fp32, else 2 * kMatmulTile * C + kMatmulTile * kMatmulTile
// (two widened operand tiles of up to kMatmulTile x C, and one kMatmulTile x kMatmulTile tile).
// E.g. C = 768: 458,752 floats (1.75 MiB); C = 3072: 1,638,400 floats (6.25 MiB).
std::size_t matmul_scratch_elems(DType storage, std::int64_t C);
// How the CPU computes a GEMM of `storage` elements in this process, for the run's start line and
// MFU's peak: "OpenBLAS sgemm" (fp32), the 16-bit path ops/cpu/matmul.cpp takes (which depends on
// the CPU's instructions and the libraries built in).
std::string cpu_gemm_path(DType storage);

// out = inp · weightᵀ + bias
//   inp:    (BT, C)   storage dtype S (fp32 / fp16 / bf16); any rank (..., C) is accepted
//   weight: (OC, C)   S
//   bias:   (OC)      S, or an empty Tensor for no bias (e.g. the tied LM head)
//   out:    (BT, OC)  S, same leading dims as inp
//   scratch: fp32, >= matmul_scratch_elems(S, C) elements (may be empty for fp32)
void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, Tensor scratch);

// dinp += dout · weight;  dweight += doutᵀ · inp;  dbias += column sums of dout.
//   dinp (BT, C), dweight (OC, C), dbias (OC): S; each may be empty to skip that gradient.
//   dout (BT, OC), inp (BT, C), weight (OC, C): S.
//   scratch: fp32, >= matmul_scratch_elems(S, C) elements (may be empty for fp32).
// dbias is summed per column in a fixed order (double): deterministic.
void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, Tensor scratch);

}  // namespace dstrain
