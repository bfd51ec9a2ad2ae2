// cuBLASLt for the matmul kernels: one context per device (a handle and a 32 MiB workspace,
// created on first use and kept for the life of the process), and a GEMM call with the heuristic
// algorithm cached per problem (shape, types, transposes, epilogue, pointer alignment).
//
// Precision: fp32 storage uses CUBLAS_COMPUTE_32F, i.e. TF32 is OFF (full fp32 products, so the
// GPU matches the CPU's sgemm to fp32 rounding; the comparison tests rely on it). fp16/bf16
// storage uses CUBLAS_COMPUTE_32F as well: 16-bit inputs on the tensor cores, fp32 accumulation,
// beta·C added and the result rounded once into 16 bits, as the CPU's widened-tile path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "ops/dtype.h"

namespace dstrain::cuda {

// Column-major GEMM: D (m x n, ld ldd) = op(A) · op(B) + beta · D, where op(A) is m x k and op(B)
// k x n; bias (m elements, the storage type) is added to every column when not null
// (CUBLASLT_EPILOGUE_BIAS). A, B, D and bias share the storage dtype.
// `act` fuses GELU (the tanh approximation) into the epilogue; aux has D's dtype and shape (ld ldaux):
//   gelu_aux: aux = op(A)·op(B) + bias (the pre-activation, saved for backward), D = gelu(aux)
//             (GELU_AUX_BIAS, or GELU_AUX without bias)
//   dgelu:    D = gelu'(aux) ⊙ (op(A)·op(B)), beta must be 0 (DGELU; aux is read)
struct GemmArgs {
  DType dtype = DType::fp32;
  bool transa = false, transb = false;
  std::int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  std::int64_t lda = 0;
  const void* B = nullptr;
  std::int64_t ldb = 0;
  void* D = nullptr;
  std::int64_t ldd = 0;
  float beta = 0.0f;
  const void* bias = nullptr;
  enum class Act { none, gelu_aux, dgelu };
  Act act = Act::none;
  void* aux = nullptr;
  std::int64_t ldaux = 0;
};

class CublasLtContext {
 public:
  // The context of `device` (created on first use; thread-safe). Never destroyed: the CUDA
  // runtime may be torn down before static destructors run.
  static CublasLtContext& get(int device);

  // Runs the GEMM on `stream` (asynchronous). Throws Error when cuBLASLt has no algorithm.
  void gemm(const GemmArgs& a, cudaStream_t stream);
  // The same, returning false (and running nothing) when cuBLASLt has no algorithm for it: the
  // caller falls back to separate kernels (an epilogue this GPU or shape does not offer). The
  // answer is cached per problem like the algorithm.
  bool try_gemm(const GemmArgs& a, cudaStream_t stream);

  static constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

 private:
  explicit CublasLtContext(int device);
  using Key = std::tuple<int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, unsigned,
                         unsigned, unsigned, unsigned, int, std::int64_t, unsigned>;
  int device_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::mutex mu_;
  std::map<Key, std::optional<cublasLtMatmulAlgo_t>> algos_;  // nullopt: cuBLASLt has none
};

}  // namespace dstrain::cuda
