// cuBLASLt context and GEMM (ops/cuda/cublaslt.h).
#include "ops/cuda/cublaslt.h"

#include <array>
#include <memory>

#include "ops/cuda/cuda_check.h"
#include "ops/error.h"

namespace dstrain::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::fp32:
      return CUDA_R_32F;
    case DType::fp16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      break;
  }
  fail("cublaslt gemm: storage dtype {} is not supported; use fp32, fp16 or bf16", dtype_name(t));
}

// Largest power of two (<= 256) dividing the address: the alignment the algorithm may assume.
unsigned alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  unsigned al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

// RAII for the descriptors of one call.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

CublasLtContext& CublasLtContext::get(int device) {
  static std::mutex mu;
  static std::array<CublasLtContext*, 64> contexts{};
  if (device < 0 || device >= static_cast<int>(contexts.size())) fail("cublaslt: device index {} out of range", device);
  std::lock_guard<std::mutex> lock(mu);
  if (!contexts[static_cast<std::size_t>(device)]) contexts[static_cast<std::size_t>(device)] = new CublasLtContext(device);
  return *contexts[static_cast<std::size_t>(device)];
}

CublasLtContext::CublasLtContext(int device) : device_(device) {
  DSTRAIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  DSTRAIN_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

void CublasLtContext::gemm(const GemmArgs& g, cudaStream_t stream) {
  if (!try_gemm(g, stream)) {
    fail("cublaslt gemm: no cuBLASLt algorithm for {} m={} n={} k={} (transa={}, transb={}, lda={}, ldb={}, ldd={}, bias={}) on device {}",
         dtype_name(g.dtype), g.m, g.n, g.k, g.transa, g.transb, g.lda, g.ldb, g.ldd, g.bias != nullptr, device_);
  }
}

bool CublasLtContext::try_gemm(const GemmArgs& g, cudaStream_t stream) {
  const unsigned al_a = alignment_of(g.A), al_b = alignment_of(g.B), al_d = alignment_of(g.D), al_bias = g.bias ? alignment_of(g.bias) : 256;
  const unsigned al_aux = g.aux ? alignment_of(g.aux) : 256;
  const Key key{
      static_cast<int>(g.dtype), g.transa, g.transb, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, g.beta != 0.0f, g.bias != nullptr, al_a, al_b, al_d, al_bias,
      static_cast<int>(g.act),   g.ldaux,  al_aux};
  {
    // A problem already known to have no algorithm (the caller's fallback runs) costs no descriptors.
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = algos_.find(key);
    if (it != algos_.end() && !it->second) return false;
  }
  const cudaDataType_t t = cuda_type(g.dtype);
  Descs ds;
  DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // no TF32: see the header
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.act) {
    case GemmArgs::Act::none:
      epi = g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      break;
    case GemmArgs::Act::gelu_aux:
      epi = g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      break;
    case GemmArgs::Act::dgelu:
      DSTRAIN_CHECK(g.bias == nullptr && g.beta == 0.0f, "cublaslt gemm: the DGELU epilogue takes no bias and beta 0");
      epi = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (g.bias) {
    DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  }
  if (g.act != GemmArgs::Act::none) {
    DSTRAIN_CHECK(g.aux != nullptr && g.ldaux >= g.m, "cublaslt gemm: a GELU epilogue needs the aux matrix (ld >= m = {})", g.m);
    const auto ldaux = static_cast<std::int64_t>(g.ldaux);
    DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
    DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux)));
    DSTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof(t)));
  }
  // Stored shapes (before op): A is m x k or k x m, B k x n or n x k.
  const auto rows_a = static_cast<std::uint64_t>(g.transa ? g.k : g.m), cols_a = static_cast<std::uint64_t>(g.transa ? g.m : g.k);
  const auto rows_b = static_cast<std::uint64_t>(g.transb ? g.n : g.k), cols_b = static_cast<std::uint64_t>(g.transb ? g.k : g.n);
  DSTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, t, rows_a, cols_a, g.lda));
  DSTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, t, rows_b, cols_b, g.ldb));
  DSTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, t, static_cast<std::uint64_t>(g.m), static_cast<std::uint64_t>(g.n), g.ldd));

  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = algos_.find(key);
    if (it != algos_.end()) {
      algo = it->second;
    } else {
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds.pref));
      const std::size_t ws = kWorkspaceBytes;
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
      const std::uint32_t aa = al_a, ab = al_b, ad = al_d;
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
      DSTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &result, &found);
      if (st == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
      algos_.emplace(key, algo);
    }
  }
  if (!algo) return false;
  const float alpha = 1.0f, beta = g.beta;
  DSTRAIN_CUBLAS_CHECK(
      cublasLtMatmul(handle_, ds.op, &alpha, g.A, ds.a, g.B, ds.b, &beta, g.D, ds.d, g.D, ds.d, &*algo, workspace_, kWorkspaceBytes, stream));
  return true;
}

}  // namespace dstrain::cuda
