// Fused softmax + cross-entropy, CPU: rows in parallel; the row loops per ISA
// (ops/cpu/softmax_cross_entropy_isa.h): one pass over V in chunks (chunk max, rescale the running
// sum if the max grew, chunk sum of exp in fp32 added to a double total).
#include "ops/kernels/softmax_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/cpu/cpu_common.h"
#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/isa_dispatch.h"
#include "ops/cpu/softmax_cross_entropy_isa.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct CeShape {
  std::int64_t BT, Vp;
  Shape lead;
};

CeShape check_ce(const char* op, const char* lname, const Tensor& logits, const Tensor& targets, const Tensor& lse, std::int64_t V,
                 bool host_targets) {
  require_present(op, {lname, logits});
  if (logits.shape.rank < 2) fail("{}: tensor '{}' has shape {} but (BT, Vp) or (B, T, Vp) is expected", op, lname, logits.shape.str());
  CeShape s;
  s.Vp = logits.shape[logits.shape.rank - 1];
  s.lead = logits.shape;
  s.lead.rank -= 1;
  s.BT = s.lead.numel();
  if (V <= 0 || V > s.Vp) fail("{}: the real vocabulary V = {} must be in [1, Vp = {}] ({} has shape {})", op, V, s.Vp, lname, logits.shape.str());
  require_shape(op, {"targets", targets}, s.lead, "(the leading dimensions of " + std::string(lname) + ")");
  require_dtype(op, {"targets", targets}, DType::int32);
  require_shape(op, {"lse", lse}, s.lead, "(the leading dimensions of " + std::string(lname) + ")");
  require_dtype(op, {"lse", lse}, DType::fp32);
  require_floating(op, {lname, logits});
  if (!host_targets) return s;  // device memory: the CUDA backend validates its copy
  const auto* t = static_cast<const std::int32_t*>(targets.data);
  for (std::int64_t i = 0; i < s.BT; ++i) {
    if (t[i] != -1 && (t[i] < 0 || t[i] >= V)) {
      fail("{}: target {} at position {} is neither -1 (ignored) nor in the real vocabulary [0, {})", op, t[i], i, V);
    }
  }
  return s;
}

}  // namespace

float softmax_cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, std::int64_t V) {
  const char* op = "softmax_cross_entropy_forward";
  const bool gpu = cpu::on_cuda(op, {{"losses", losses}, {"lse", lse}, {"logits", logits}, {"targets", targets}});
  const CeShape s = check_ce(op, "logits", logits, targets, lse, V, !gpu);
  require_shape(op, {"losses", losses}, s.lead, "(the leading dimensions of logits)");
  require_dtype(op, {"losses", losses}, DType::fp32);
  DSTRAIN_RETURN_ON_CUDA(gpu, softmax_cross_entropy_forward(losses, lse, logits, targets, V));
  auto* loss = static_cast<float*>(losses.data);
  auto* lp = static_cast<float*>(lse.data);
  const auto* tg = static_cast<const std::int32_t*>(targets.data);
  const auto row_lse = cpu::isa_select(cpu::scalar::ce_row_lse, cpu::avx2::ce_row_lse, cpu::avx512::ce_row_lse);
  const auto* x = static_cast<const std::byte*>(logits.data);
  const std::size_t row_bytes = static_cast<std::size_t>(s.Vp) * dtype_size(logits.dtype);
  cpu::dispatch_float(op, logits.dtype, [&]<typename T>(cpu::TypeTag<T>) {
#pragma omp parallel for schedule(dynamic, 4) if (cpu::parallel_worth(s.BT * s.Vp))
    for (std::int64_t i = 0; i < s.BT; ++i) {
      const auto* row = reinterpret_cast<const T*>(x + static_cast<std::size_t>(i) * row_bytes);
      const float l = row_lse(logits.dtype, row, V);
      lp[i] = l;
      loss[i] = tg[i] < 0 ? 0.0f : l - cpu::load(row[tg[i]]);
    }
  });
  double total = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < s.BT; ++i) {
    if (tg[i] >= 0) {
      total += static_cast<double>(loss[i]);
      ++count;
    }
  }
  return count == 0 ? 0.0f : static_cast<float>(total / static_cast<double>(count));
}

void softmax_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t V) {
  const char* op = "softmax_cross_entropy_backward";
  const bool gpu = cpu::on_cuda(op, {{"dlogits", dlogits}, {"logits", logits}, {"lse", lse}, {"targets", targets}});
  const CeShape s = check_ce(op, "logits", logits, targets, lse, V, !gpu);
  require_shape(op, {"dlogits", dlogits}, logits.shape, "(the shape of logits)");
  require_same_dtype(op, {{"logits", logits}, {"dlogits", dlogits}});
  DSTRAIN_RETURN_ON_CUDA(gpu, softmax_cross_entropy_backward(dlogits, logits, lse, targets, dloss, V));
  const auto* lp = static_cast<const float*>(lse.data);
  const auto* tg = static_cast<const std::int32_t*>(targets.data);
  const auto row_backward = cpu::isa_select(cpu::scalar::ce_row_backward, cpu::avx2::ce_row_backward, cpu::avx512::ce_row_backward);
  const auto* x = static_cast<const std::byte*>(logits.data);
  auto* dx = static_cast<std::byte*>(dlogits.data);  // may equal x: each element is read before it is written
  const std::size_t row_bytes = static_cast<std::size_t>(s.Vp) * dtype_size(logits.dtype);
#pragma omp parallel for schedule(dynamic, 4) if (cpu::parallel_worth(s.BT * s.Vp))
  for (std::int64_t i = 0; i < s.BT; ++i) {
    const std::size_t at = static_cast<std::size_t>(i) * row_bytes;
    row_backward(logits.dtype, dx + at, x + at, V, s.Vp, tg[i], lp[i], dloss);
  }
}

float softmax_cross_entropy_forward_backward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, float dloss, std::int64_t V) {
  const char* op = "softmax_cross_entropy_forward_backward";
  const bool gpu = cpu::on_cuda(op, {{"losses", losses}, {"lse", lse}, {"logits", logits}, {"targets", targets}});
  const CeShape s = check_ce(op, "logits", logits, targets, lse, V, !gpu);
  require_shape(op, {"losses", losses}, s.lead, "(the leading dimensions of logits)");
  require_dtype(op, {"losses", losses}, DType::fp32);
  DSTRAIN_RETURN_ON_CUDA(gpu, softmax_cross_entropy_forward_backward(losses, lse, logits, targets, dloss, V));
  const float mean = softmax_cross_entropy_forward(losses, lse, logits, targets, V);
  softmax_cross_entropy_backward(logits, logits, lse, targets, dloss, V);
  return mean;
}

}  // namespace dstrain
