// grad_norm_overflow, CPU: blocks fixed by n, parallel over blocks, 8 interleaved double
// accumulators per block (so the loop vectorises without reassociating anything; the loop per ISA,
// ops/cpu/reduce_isa.h), block sums added in order. scale_grads: one elementwise pass.
#include "ops/kernels/grad_norm_overflow.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/isa_dispatch.h"
#include "ops/cpu/reduce_isa.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

constexpr std::int64_t kMaxBlocks = 256;       // partials on the stack: 256 x 16 bytes
constexpr std::int64_t kMinBlockElems = 4096;  // below this a block is not worth a thread
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
  const auto range = cpu::isa_select(cpu::scalar::sum_squares_range, cpu::avx2::sum_squares_range, cpu::avx512::sum_squares_range);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(n))
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = std::min(n, b * per), end = std::min(n, begin + per);
    GradNormOverflow& p = part[static_cast<std::size_t>(b)];
    range(grads.dtype, grads.data, begin, end, &p.norm_sq, &p.nonfinite);
  }
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
