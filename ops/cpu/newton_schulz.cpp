// Newton–Schulz, CPU: the five GEMMs of each iteration through OpenBLAS cblas_sgemm (called
// outside any OpenMP region: OpenBLAS runs its own threads), the element-wise parts in loops.
#include "ops/kernels/newton_schulz.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

int blas_int(std::int64_t v) { return static_cast<int>(v); }

}  // namespace

std::int64_t newton_schulz_workspace_numel(std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = std::min(rows, cols), m = std::max(rows, cols);
  return 2 * n * m + 2 * n * n;
}

void newton_schulz(Tensor x, Tensor workspace, const NewtonSchulzConfig& config) {
  const char* op = "newton_schulz";
  const bool gpu = cpu::on_cuda(op, {{"x", x}, {"workspace", workspace}});
  require_present(op, {"x", x});
  require_dtype(op, {"x", x}, DType::fp32);
  require_present(op, {"workspace", workspace});
  require_dtype(op, {"workspace", workspace}, DType::fp32);
  if (x.shape.rank != 2) fail("{}: tensor 'x' has shape {}; Newton-Schulz needs a matrix (rows, cols)", op, x.shape.str());
  const std::int64_t rows = x.shape[0], cols = x.shape[1];
  if (workspace.numel() < newton_schulz_workspace_numel(rows, cols)) {
    fail("{}: tensor 'workspace' holds {} elements but a ({}, {}) matrix needs {} (newton_schulz_workspace_numel)", op, workspace.numel(), rows, cols,
         newton_schulz_workspace_numel(rows, cols));
  }
  if (config.steps < 0) fail("{}: steps = {}; give a number of iterations >= 0", op, config.steps);
  DSTRAIN_RETURN_ON_CUDA(gpu, newton_schulz(x, workspace, config));
  if (x.numel() == 0) return;

  const bool wide = rows <= cols;  // X is x itself, else its transpose
  const std::int64_t n = std::min(rows, cols), m = std::max(rows, cols);
  float* g = static_cast<float*>(x.data);
  float* X = static_cast<float*>(workspace.data);
  float* Y = X + n * m;
  float* A = Y + n * m;
  float* B = A + n * n;

  // X = G (n x m, row-major), transposed when G is tall.
  if (wide) {
    std::copy(g, g + n * m, X);
  } else {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n * m))
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < m; ++j) X[i * m + j] = g[j * n + i];
  }
  double sq = 0.0;
  for (std::int64_t i = 0; i < n * m; ++i) sq += static_cast<double>(X[i]) * static_cast<double>(X[i]);
  const float denom = static_cast<float>(std::sqrt(sq)) + config.eps;
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n * m))
  for (std::int64_t i = 0; i < n * m; ++i) X[i] = X[i] / denom;

  for (int s = 0; s < config.steps; ++s) {
    // A = X·Xᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(n), blas_int(n), blas_int(m), 1.0f, X, blas_int(m), X, blas_int(m), 0.0f, A,
                blas_int(n));
    // B = b·A + c·A·A
    for (std::int64_t i = 0; i < n * n; ++i) B[i] = config.b * A[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(n), blas_int(n), config.c, A, blas_int(n), A, blas_int(n), 1.0f, B,
                blas_int(n));
    // Y = a·X + B·X, then Y is the new X
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n * m))
    for (std::int64_t i = 0; i < n * m; ++i) Y[i] = config.a * X[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(m), blas_int(n), 1.0f, B, blas_int(n), X, blas_int(m), 1.0f, Y,
                blas_int(m));
    std::swap(X, Y);
  }

  if (wide) {
    std::copy(X, X + n * m, g);
  } else {
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n * m))
    for (std::int64_t j = 0; j < m; ++j)
      for (std::int64_t i = 0; i < n; ++i) g[j * n + i] = X[i * m + j];
  }
}

}  // namespace dstrain
