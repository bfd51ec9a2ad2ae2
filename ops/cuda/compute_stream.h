// The stream dstrain's compute runs on: every kernel, cuBLASLt call and stream-ordered copy of the
// CUDA backend, and what the NCCL and local communicators and the copy stream (ops/cuda/copy_stream.h) order
// themselves against. The legacy default stream, named explicitly (cudaStreamLegacy, not 0) so
// that it stays the same stream under nvcc's --default-stream per-thread: one in-order queue per
// device that every host thread shares, which the local communicator's ordering relies on.
#pragma once

#include <cuda_runtime_api.h>

namespace dstrain::cuda {

inline cudaStream_t compute_stream() { return cudaStreamLegacy; }

}  // namespace dstrain::cuda
