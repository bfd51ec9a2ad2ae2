// Vocabulary-parallel cross-entropy, CPU: rows in parallel, each row's sums in double in column
// order (deterministic for any thread count). On a cuda device: ops/cuda/vocab_parallel_cross_entropy.cu.
#include "ops/kernels/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/cpu/backend_dispatch.h"
#include "ops/cpu/cpu_common.h"
#include "ops/kernels/kernel_check.h"

namespace dstrain {
namespace {

using namespace kernel_check;

struct ShardShape {
  std::int64_t BT = 0, Vr = 0;
};

// The logits' rows and columns; the per-row tensors' sizes; valid within the columns.
ShardShape check_shard(const char* op, const Tensor& logits, std::int64_t valid, std::initializer_list<std::pair<const char*, const Tensor*>> rows,
                       std::int64_t row_width = 1) {
  require_present(op, {"logits", logits});
  require_floating(op, {"logits", logits});
  if (logits.shape.rank < 2) fail("{}: tensor 'logits' has shape {} but (BT, Vr) or (B, T, Vr) is expected", op, logits.shape.str());
  ShardShape s;
  s.Vr = logits.shape[logits.shape.rank - 1];
  s.BT = s.Vr > 0 ? logits.numel() / s.Vr : 0;
  if (s.Vr == 0) {
    Shape lead = logits.shape;
    lead.rank -= 1;
    s.BT = lead.numel();
  }
  if (valid < 0 || valid > s.Vr) fail("{}: {} real columns of a shard of {} columns", op, valid, s.Vr);
  for (const auto& [name, t] : rows) {
    const std::int64_t want = std::string_view(name) == "stats" ? s.BT * row_width : s.BT;
    if (t->numel() != want) fail("{}: tensor '{}' has {} elements but the logits' {} rows need {}", op, name, t->numel(), s.BT, want);
  }
  return s;
}

}  // namespace

void vocab_shard_max(Tensor rowmax, Tensor logits, std::int64_t valid) {
  const char* op = "vocab_shard_max";
  const bool gpu = cpu::on_cuda(op, {{"rowmax", rowmax}, {"logits", logits}});
  require_dtype(op, {"rowmax", rowmax}, DType::fp32);
  const ShardShape s = check_shard(op, logits, valid, {{"rowmax", &rowmax}});
  DSTRAIN_RETURN_ON_CUDA(gpu, vocab_shard_max(rowmax, logits, valid));
  cpu::dispatch_float(op, logits.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(logits.data);
    float* m = static_cast<float*>(rowmax.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.BT * valid))
    for (std::int64_t i = 0; i < s.BT; ++i) {
      float r = -std::numeric_limits<float>::infinity();
      for (std::int64_t v = 0; v < valid; ++v) r = std::max(r, cpu::load(x[i * s.Vr + v]));
      m[i] = r;
    }
  });
}

void vocab_shard_sum_exp(Tensor stats, Tensor logits, Tensor rowmax, Tensor targets, std::int64_t first, std::int64_t valid) {
  const char* op = "vocab_shard_sum_exp";
  const bool gpu = cpu::on_cuda(op, {{"stats", stats}, {"logits", logits}, {"rowmax", rowmax}, {"targets", targets}});
  require_dtype(op, {"stats", stats}, DType::fp32);
  require_dtype(op, {"rowmax", rowmax}, DType::fp32);
  require_dtype(op, {"targets", targets}, DType::int32);
  const ShardShape s = check_shard(op, logits, valid, {{"stats", &stats}, {"rowmax", &rowmax}, {"targets", &targets}}, 2);
  DSTRAIN_RETURN_ON_CUDA(gpu, vocab_shard_sum_exp(stats, logits, rowmax, targets, first, valid));
  cpu::dispatch_float(op, logits.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(logits.data);
    const float* m = static_cast<const float*>(rowmax.data);
    const auto* tg = static_cast<const std::int32_t*>(targets.data);
    float* st = static_cast<float*>(stats.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.BT * valid))
    for (std::int64_t i = 0; i < s.BT; ++i) {
      double sum = 0.0;
      const T* row = x + i * s.Vr;
      for (std::int64_t v = 0; v < valid; ++v) sum += std::exp(static_cast<double>(cpu::load(row[v]) - m[i]));
      const std::int64_t t = static_cast<std::int64_t>(tg[i]) - first;
      st[2 * i] = static_cast<float>(sum);
      st[2 * i + 1] = tg[i] >= 0 && t >= 0 && t < valid ? cpu::load(row[t]) : 0.0f;
    }
  });
}

float vocab_parallel_losses(Tensor losses, Tensor lse, Tensor rowmax, Tensor stats, Tensor targets) {
  const char* op = "vocab_parallel_losses";
  const bool gpu = cpu::on_cuda(op, {{"losses", losses}, {"lse", lse}, {"rowmax", rowmax}, {"stats", stats}, {"targets", targets}});
  for (const auto& [name, t] : {std::pair{"losses", &losses}, {"lse", &lse}, {"rowmax", &rowmax}, {"stats", &stats}})
    require_dtype(op, {name, *t}, DType::fp32);
  require_dtype(op, {"targets", targets}, DType::int32);
  const std::int64_t BT = targets.numel();
  if (losses.numel() != BT || lse.numel() != BT || rowmax.numel() != BT || stats.numel() != 2 * BT) {
    fail("{}: losses, lse and rowmax need {} elements and stats {} (one per target), got {}, {}, {} and {}", op, BT, 2 * BT, losses.numel(),
         lse.numel(), rowmax.numel(), stats.numel());
  }
  DSTRAIN_RETURN_ON_CUDA(gpu, vocab_parallel_losses(losses, lse, rowmax, stats, targets));  // the mean from a host copy, as here
  const auto* tg = static_cast<const std::int32_t*>(targets.data);
  const float* m = static_cast<const float*>(rowmax.data);
  const float* st = static_cast<const float*>(stats.data);
  float* l = static_cast<float*>(losses.data);
  float* z = static_cast<float*>(lse.data);
  double total = 0.0;
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < BT; ++i) {
    z[i] = m[i] + std::log(st[2 * i]);
    if (tg[i] < 0) {
      l[i] = 0.0f;
      continue;
    }
    l[i] = z[i] - st[2 * i + 1];
    total += l[i];
    ++n;
  }
  return n > 0 ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
}

void vocab_shard_cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, float dloss, std::int64_t first,
                                        std::int64_t valid) {
  const char* op = "vocab_shard_cross_entropy_backward";
  const bool gpu = cpu::on_cuda(op, {{"dlogits", dlogits}, {"logits", logits}, {"lse", lse}, {"targets", targets}});
  require_dtype(op, {"lse", lse}, DType::fp32);
  require_dtype(op, {"targets", targets}, DType::int32);
  const ShardShape s = check_shard(op, logits, valid, {{"lse", &lse}, {"targets", &targets}});
  require_shape(op, {"dlogits", dlogits}, logits.shape, "(the shape of logits)");
  require_same_dtype(op, {{"dlogits", dlogits}, {"logits", logits}});
  DSTRAIN_RETURN_ON_CUDA(gpu, vocab_shard_cross_entropy_backward(dlogits, logits, lse, targets, dloss, first, valid));
  cpu::dispatch_float(op, logits.dtype, [&]<typename T>(cpu::TypeTag<T>) {
    const T* x = static_cast<const T*>(logits.data);
    T* d = static_cast<T*>(dlogits.data);
    const float* z = static_cast<const float*>(lse.data);
    const auto* tg = static_cast<const std::int32_t*>(targets.data);
#pragma omp parallel for schedule(static) if (cpu::parallel_worth(s.BT * s.Vr))
    for (std::int64_t i = 0; i < s.BT; ++i) {
      const T* row = x + i * s.Vr;
      T* drow = d + i * s.Vr;
      if (tg[i] < 0) {
        for (std::int64_t v = 0; v < s.Vr; ++v) drow[v] = cpu::store<T>(0.0f);
        continue;
      }
      const std::int64_t t = static_cast<std::int64_t>(tg[i]) - first;
      for (std::int64_t v = 0; v < s.Vr; ++v) {
        float g = 0.0f;
        if (v < valid) g = (std::exp(cpu::load(row[v]) - z[i]) - (v == t ? 1.0f : 0.0f)) * dloss;
        drow[v] = cpu::store<T>(g);
      }
    }
  });
}

}  // namespace dstrain
