// cuda_rank_reduce: an element-wise reduction over the buffers of W ranks that share one GPU (the
// local communicator's ranks as threads of one process, zero/local_communicator.h), with exactly the
// host reduction's semantics, so a collective gives the same bits on the GPU as on the CPU:
//   - ranks are combined in order 0, 1, ..., W−1: acc = in[0][i]; acc = op(acc, in[r][i]);
//   - fp16/bf16 load into fp32, accumulate in fp32 and round once (RNE) into every output;
//     fp32 accumulates in fp32; int32 sums wrap around (two's complement);
//   - max propagates NaN (the first NaN in rank order wins, its bits kept), as a sum would;
//   - avg = sum / W in the accumulation type (fp32), rounded once; not defined for int32.
// NaN bits follow ops/dtype.h's policy for loads and stores; a NaN that arithmetic creates
// (inf − inf, NaN + x) has the GPU's bits, which the CPU's hardware may choose differently.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "ops/dtype.h"

namespace dstrain {

enum class RankReduceOp { sum, avg, max };

// The most input (or output) buffers one call takes: the pointers travel as kernel parameters.
inline constexpr int kRankReduceMaxBuffers = 64;

// out[k][i] = op over r in [0, n_in) of in[r][i], for every k in [0, n_out) and i in [0, n), on
// `stream` (asynchronous). Outputs may be inputs (in place: each element's inputs are all read
// before any of its outputs is written); distinct outputs must not overlap each other. dtype: fp32,
// fp16, bf16 or int32 (sum and max). n == 0 does nothing. Throws Error for a bad dtype/op, counts
// outside [1, kRankReduceMaxBuffers], null pointers, and launch failures.
void cuda_rank_reduce(const void* const* in, int n_in, void* const* out, int n_out, DType dtype, std::size_t n, RankReduceOp op, cudaStream_t stream);

}  // namespace dstrain
