#include "ops/cuda/rank_reduce.h"

#include "ops/cuda/cuda_check.h"
#include "ops/error.h"

namespace dstrain {

namespace detail {
// Defined in rank_reduce.cu: launches the kernel after the checks below; returns the launch status.
cudaError_t launch_rank_reduce_kernel(const void* const* in, int n_in, void* const* out, int n_out, DType dtype, std::size_t n, RankReduceOp op,
                                      cudaStream_t stream);
}  // namespace detail

void cuda_rank_reduce(const void* const* in, int n_in, void* const* out, int n_out, DType dtype, std::size_t n, RankReduceOp op,
                      cudaStream_t stream) {
  DSTRAIN_CHECK(is_floating(dtype) || dtype == DType::int32 || dtype == DType::fp64,
                "cuda_rank_reduce: dtype {} cannot be reduced; it takes fp32, fp16, bf16, fp64 or int32", dtype_name(dtype));
  DSTRAIN_CHECK(dtype != DType::int32 || op != RankReduceOp::avg,
                "cuda_rank_reduce: avg is not defined for int32 (an integer mean would truncate); use sum and divide");
  DSTRAIN_CHECK(n_in >= 1 && n_in <= kRankReduceMaxBuffers && n_out >= 1 && n_out <= kRankReduceMaxBuffers,
                "cuda_rank_reduce: {} inputs and {} outputs; each count must be between 1 and {} (the pointers are kernel parameters)", n_in, n_out,
                kRankReduceMaxBuffers);
  if (n == 0) return;
  for (int r = 0; r < n_in; ++r) DSTRAIN_CHECK(in[r] != nullptr, "cuda_rank_reduce: input {} of {} is a null pointer", r, n_in);
  for (int k = 0; k < n_out; ++k) DSTRAIN_CHECK(out[k] != nullptr, "cuda_rank_reduce: output {} of {} is a null pointer", k, n_out);
  DSTRAIN_CUDA_CHECK(detail::launch_rank_reduce_kernel(in, n_in, out, n_out, dtype, n, op, stream));
}

}  // namespace dstrain
