// The element-wise reduction over ranks that every host backend computes, in one place so that
// their results are bit-identical: the local backend (zero/local_communicator.h) applies it to the
// other threads' buffers, the MPI backend (zero/mpi_communicator.h) to the chunks an all-to-all
// brought from the other processes.
//
// Semantics (the Communicator contract, zero/communicator.h): inputs are combined in rank order
// 0, 1, ..., W−1; fp16/bf16 accumulate in fp32 and round once at the end; fp32 in fp32; fp64 in
// double; int32 sums wrap around (no undefined signed overflow); avg divides the sum by W in the
// accumulation type; max lets a NaN win (a max that hid a NaN gradient would hide an overflow).
#pragma once

#include <cstdint>
#include <vector>

#include "ops/dtype.h"
#include "zero/communicator.h"

namespace dstrain {

// out[k][i] = op over r of in[r][i] (in rank order), for every output k and i in [0, n). `in`
// holds one pointer per rank (in.size() = W). An output may alias an input: each block of inputs
// is read before its outputs are written (all-reduce in place). Error for uint16.
void reduce_over_ranks(DType dtype, const std::vector<const void*>& in, const std::vector<void*>& out, std::int64_t n, ReduceOp op);

}  // namespace dstrain
