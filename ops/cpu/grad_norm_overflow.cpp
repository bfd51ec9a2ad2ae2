// grad_norm_overflow, CPU: blocks fixed by n, parallel over blocks, 8 interleaved double
// accumulators per block (so the loop vectorises without reassociating anything), block sums
// added in order. scale_grads: one elementwise pass.
#include "ops/kernels/grad_norm_overflow.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

constexpr std::int64_t kMaxBlocks = 256;       // partials on the stack: 256 x 16 bytes
constexpr std::int64_t kMinBlockElems = 4096;  // below this a block is not worth a thread
constexpr int kLanes = 8;

// inf or NaN: all exponent bits set. Branch-free so the loop vectorises.
inline double nonfinite_bit(float x) { return (std::bit_cast<std::uint32_t>(x) & 0x7f800000u) == 0x7f800000u ? 1.0 : 0.0; }

template <typename G>
GradNormOverflow block_sum(const G* __restrict g, std::int64_t begin, std::int64_t end) {
  std::array<double, kLanes> sq{}, nf{};
  std::int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float x = cpu::load(g[i + k]);
      const double d = static_cast<double>(x);
      sq[static_cast<std::size_t>(k)] += d * d;
      nf[static_cast<std::size_t>(k)] += nonfinite_bit(x);
    }
  }
  for (int k = 0; i < end; ++i, ++k) {
    const float x = cpu::load(g[i]);
    const double d = static_cast<double>(x);
    sq[static_cast<std::size_t>(k)] += d * d;
    nf[static_cast<std::size_t>(k)] += nonfinite_bit(x);
  }
  GradNormOverflow r;
  for (int k = 0; k < kLanes; ++k) {
    r.norm_sq += sq[static_cast<std::size_t>(k)];
    r.nonfinite += nf[static_cast<std::size_t>(k)];
  }
  return r;
}

}  // namespace

GradNormOverflow grad_norm_overflow(Tensor grads) {
  const char* op = "grad_norm_overflow";
  const bool gpu = cpu::on_cuda(op, {{"grads", grads}});
  const std::int64_t n = grads.numel();
  if (n == 0) return {};
  require_present(op, {"grads", grads});
  require_floating(op, {"grads", grads});
  DSTRAIN_RETURN_ON_CUDA(gpu, grad_norm_overflow(grads));
  // Block boundaries from n alone: the thread count never changes what is summed with what.
  const std::int64_t blocks = std::clamp<std::int64_t>((n + kMinBlockElems - 1) / kMinBlockElems, 1, kMaxBlocks);
  const std::int64_t per = (n + blocks - 1) / blocks;
  std::array<GradNormOverflow, kMaxBlocks> part{};
  cpu::dispatch_float(op, grads.dtype, [&]<typename G>(cpu::TypeTag<G>) {
    const G* g = static_cast<const G*>(grads.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t begin = std::min(n, b * per), end = std::min(n, begin + per);
      part[static_cast<std::size_t>(b)] = block_sum(g, begin, end);
    }
  });
  GradNormOverflow total;
  for (std::int64_t b = 0; b < blocks; ++b) total += part[static_cast<std::size_t>(b)];
  return total;
}

void scale_grads(Tensor grads, float factor) {
  const char* op = "scale_grads";
  const bool gpu = cpu::on_cuda(op, {{"grads", grads}});
  const std::int64_t n = grads.numel();
  if (n == 0) return;
  require_present(op, {"grads", grads});
  require_floating(op, {"grads", grads});
  DSTRAIN_RETURN_ON_CUDA(gpu, scale_grads(grads, factor));
  cpu::dispatch_float(op, grads.dtype, [&]<typename G>(cpu::TypeTag<G>) {
    G* g = static_cast<G*>(grads.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
    for (std::int64_t i = 0; i < n; ++i) g[i] = cpu::store<G>(cpu::load(g[i]) * factor);
  });
}

}  // namespace dstrain
