#include "ops/kernels/tensor_ops.h"

#include <algorithm>
#include <cstring>

#include <omp.h>

#include "ops/cpu/backend_dispatch.h"
#include "ops/error.h"

namespace dstrain {
namespace {

template <typename T>
void add_impl(T* out, const T* a, const T* b, std::int64_t n) {
#pragma omp parallel for simd if (n >= (std::int64_t{1} << 16))
  for (std::int64_t i = 0; i < n; ++i) out[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

void add_f32(float* out, const float* a, const float* b, std::int64_t n) {
#pragma omp parallel for simd if (n >= (std::int64_t{1} << 16))
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Host copies from this size on are split over the OpenMP threads. One core's memcpy does not use
// this machine's memory bandwidth: on the 2-core CI VM, 1.7 GB between huge-page buffers took
// 55-67 ms on two threads against 107-136 ms on one (the decoupled checkpoint save's snapshot,
// docs/checkpoints.md "Host memory"). The threshold keeps the fork of the team (microseconds)
// small beside the copy (~0.1 ms per MiB on one core) and still splits a GPT-2 d12 layer's
// 768 x 768 fp32 weight (2.4 MB).
constexpr std::size_t kParallelCopyBytes = std::size_t{1} << 20;

void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  const bool overlap = dst < src + n && src < dst + n;  // memmove's case: copied in one pass
  const auto threads = static_cast<std::size_t>(omp_get_max_threads());
  if (n < kParallelCopyBytes || overlap || threads < 2 || omp_in_parallel() != 0) {
    std::memmove(dst, src, n);
    return;
  }
  // About 8 page-aligned chunks per thread, handed out as the threads finish the last: a thread
  // whose core another process holds does fewer of them instead of the whole copy waiting for its
  // fixed share.
  const std::size_t chunk = std::max<std::size_t>(std::size_t{256} << 10, (n / (threads * 8) + 4095) / 4096 * 4096);
  const auto chunks = static_cast<std::int64_t>((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t lo = static_cast<std::size_t>(c) * chunk;
    std::memcpy(dst + lo, src + lo, std::min(chunk, n - lo));
  }
}

}  // namespace

void zero_tensor(Tensor t) {
  const bool gpu = cpu::on_cuda("zero_tensor", {{"t", t}});
  if (t.numel() == 0) return;
  DSTRAIN_RETURN_ON_CUDA(gpu, zero_tensor(t));
  std::memset(t.data, 0, t.nbytes());
}

void copy_tensor(Tensor dst, Tensor src) {
  DSTRAIN_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy_tensor: dst {} and src {} differ in dtype or element count", dst.str(),
                src.str());
  if (dst.data == src.data || dst.numel() == 0) return;
  // Devices may differ (host <-> cuda): each side is checked on its own.
  const bool gpu_dst = cpu::on_cuda("copy_tensor", {{"dst", dst}});
  const bool gpu_src = cpu::on_cuda("copy_tensor", {{"src", src}});
  DSTRAIN_RETURN_ON_CUDA(gpu_dst || gpu_src, copy_tensor(dst, src));
  copy_bytes(static_cast<std::byte*>(dst.data), static_cast<const std::byte*>(src.data), dst.nbytes());
}

void copy_rows(Tensor dst, std::int64_t dst_offset, std::int64_t dst_pitch, Tensor src, std::int64_t src_offset, std::int64_t src_pitch,
               std::int64_t rows, std::int64_t width) {
  const bool gpu = cpu::on_cuda("copy_rows", {{"dst", dst}, {"src", src}});
  DSTRAIN_CHECK(dst.dtype == src.dtype, "copy_rows: dst {} and src {} differ in dtype", dst.str(), src.str());
  DSTRAIN_CHECK(rows >= 0 && width >= 0 && dst_offset >= 0 && src_offset >= 0 && dst_pitch >= width && src_pitch >= width,
                "copy_rows: {} rows of {} elements at offsets {} / {} with pitches {} / {} do not describe rows", rows, width, dst_offset, src_offset,
                dst_pitch, src_pitch);
  if (rows == 0 || width == 0) return;
  DSTRAIN_CHECK(dst_offset + (rows - 1) * dst_pitch + width <= dst.numel() && src_offset + (rows - 1) * src_pitch + width <= src.numel(),
                "copy_rows: {} rows of {} elements (pitches {} / {}, offsets {} / {}) run past dst {} or src {}", rows, width, dst_pitch, src_pitch,
                dst_offset, src_offset, dst.str(), src.str());
  DSTRAIN_RETURN_ON_CUDA(gpu, copy_rows(dst, dst_offset, dst_pitch, src, src_offset, src_pitch, rows, width));
  const std::size_t es = dtype_size(dst.dtype);
  auto* d = static_cast<std::byte*>(dst.data);
  const auto* s = static_cast<const std::byte*>(src.data);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::memcpy(d + static_cast<std::size_t>(dst_offset + r * dst_pitch) * es, s + static_cast<std::size_t>(src_offset + r * src_pitch) * es,
                static_cast<std::size_t>(width) * es);
  }
}

void convert_tensor(Tensor dst, Tensor src) {
  const bool gpu = cpu::on_cuda("convert_tensor", {{"dst", dst}, {"src", src}});
  DSTRAIN_CHECK(dst.numel() == src.numel(), "convert_tensor: dst {} and src {} hold different numbers of elements", dst.str(), src.str());
  if (dst.dtype == src.dtype) return copy_tensor(dst, src);
  DSTRAIN_CHECK(is_floating(dst.dtype) && is_floating(src.dtype),
                "convert_tensor: {} -> {} is not a floating-point conversion; it takes fp32, fp16 or bf16", dtype_name(src.dtype),
                dtype_name(dst.dtype));
  if (dst.numel() == 0) return;
  DSTRAIN_RETURN_ON_CUDA(gpu, convert_tensor(dst, src));
  convert(src.data, src.dtype, dst.data, dst.dtype, static_cast<std::size_t>(dst.numel()));
}

void residual_forward(Tensor out, Tensor a, Tensor b) {
  const bool gpu = cpu::on_cuda("residual_forward", {{"out", out}, {"a", a}, {"b", b}});
  DSTRAIN_CHECK(out.shape == a.shape && out.shape == b.shape && out.dtype == a.dtype && out.dtype == b.dtype,
                "residual_forward: out {}, a {}, b {} must have the same shape and dtype", out.str(), a.str(), b.str());
  DSTRAIN_CHECK(is_floating(out.dtype), "residual_forward: dtype {} is not a floating storage type; use fp32, fp16 or bf16", dtype_name(out.dtype));
  const std::int64_t n = out.numel();
  if (n == 0) return;
  DSTRAIN_RETURN_ON_CUDA(gpu, residual_forward(out, a, b));
  switch (out.dtype) {
    case DType::fp32:
      add_f32(out.as<float>(), a.as<float>(), b.as<float>(), n);
      break;
    case DType::fp16:
      add_impl(out.as<fp16_t>(), a.as<fp16_t>(), b.as<fp16_t>(), n);
      break;
    case DType::bf16:
      add_impl(out.as<bf16_t>(), a.as<bf16_t>(), b.as<bf16_t>(), n);
      break;
    default:
      break;
  }
}

}  // namespace dstrain
