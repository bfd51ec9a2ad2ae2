// Small tensor helpers the layers and the engine need between kernels: zero fill, copy (also
// between the host and a device), dtype conversion, residual add. Dispatched on the tensors'
// device like every ops/kernels entry point (ops/cpu/backend_dispatch.h).
#pragma once

#include "ops/tensor.h"

namespace dstrain {

// t = 0 (any dtype). CUDA: queued on the device's legacy default stream.
void zero_tensor(Tensor t);

// dst = src: same dtype, same number of elements (shapes may differ); dst == src is a no-op.
// The one op whose tensors may be on different devices: host <-> cuda and cuda <-> cuda copies
// are cudaMemcpy on the legacy default stream, so a copy into host memory has completed (with
// everything queued before it) when copy_tensor returns, and a copy out of host memory has
// read it. Without the CUDA backend a cuda tensor is an Error. Host copies of 1 MiB and more
// (not overlapping, not inside a parallel region) are split over the OpenMP threads.
void copy_tensor(Tensor dst, Tensor src);

// dst = src converted to dst's dtype (fp32 / fp16 / bf16; round to nearest even, as convert() in
// ops/dtype.h); same number of elements, same device. Same dtype: copy_tensor.
void convert_tensor(Tensor dst, Tensor src);

// Rows of a strided copy (cudaMemcpy2D's shape): for r in [0, rows), the `width` elements at
// src_offset + r·src_pitch of src go to dst_offset + r·dst_pitch of dst (offsets and pitches in
// elements). Same dtype and device; every row inside both tensors; dst and src must not overlap.
// What packs a layout for a collective (DeepSpeed-Ulysses' all-to-alls, models/sequence_parallel.h)
// without a loop of small copies on the host. CUDA: one cudaMemcpy2DAsync on the compute stream.
void copy_rows(Tensor dst, std::int64_t dst_offset, std::int64_t dst_pitch, Tensor src, std::int64_t src_offset, std::int64_t src_pitch,
               std::int64_t rows, std::int64_t width);

// out = a + b, computed in fp32 and rounded once into the storage dtype (fp32 / fp16 / bf16).
// Same shape and dtype; out may alias a or b.
void residual_forward(Tensor out, Tensor a, Tensor b);

}  // namespace dstrain
