// Newton–Schulz orthogonalisation (Muon's "zeroth power" of a matrix), as DeepSpeed's
// zeropower_via_newtonschulz5 (deepspeed/runtime/zero/muon/original_muon.py, from Keller Jordan's
// Muon) computes it on a 2-D matrix G (rows x cols):
//
//   X = G, transposed when rows > cols, so X is n x m with n = min(rows, cols) <= m
//   X = X / (‖X‖_F + eps)                       (spectral norm at most 1; eps = 1e-7)
//   repeat `steps` times:
//     A = X·Xᵀ                                  (n x n)
//     B = b·A + c·A·A
//     X = a·X + B·X
//   result: X, transposed back to rows x cols
//
// with the quintic coefficients (a, b, c) = (3.4445, -4.7750, 2.0315). The result approximates
// U·S'·Vᵀ, S' roughly uniform in (0.5, 1.5) (not the exact orthogonal factor), and the iteration
// treats G and Gᵀ identically. Muon's shape scale and the momentum are the caller's (engine/optim/muon.h).
//
// Precision: fp32 storage and fp32 products (OpenBLAS sgemm on the CPU, cuBLASLt without TF32 on
// the GPU); the Frobenius norm is summed in double. DeepSpeed computes the iteration in bf16 (fp32
// where the accelerator has no bf16), and its "gram" variant (Gram Newton–Schulz, the same
// function computed on X·Xᵀ) in fp16: docs/optimizers.md §9 says what that changes.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

struct NewtonSchulzConfig {
  int steps = 5;
  float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  float eps = 1e-7f;
};

// The fp32 elements `workspace` must hold for a rows x cols matrix: 2·n·m + 2·n·n, n = min, m = max.
std::int64_t newton_schulz_workspace_numel(std::int64_t rows, std::int64_t cols);

//   x:         fp32 (rows, cols), contiguous; replaced in place by the orthogonalised matrix
//   workspace: fp32, at least newton_schulz_workspace_numel(rows, cols) elements, on x's device
// A zero matrix stays zero. On the GPU the call is asynchronous on the compute stream, like the
// other kernels.
void newton_schulz(Tensor x, Tensor workspace, const NewtonSchulzConfig& config = {});

}  // namespace dstrain
