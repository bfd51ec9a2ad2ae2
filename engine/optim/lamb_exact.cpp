#include "engine/optim/lamb_exact.h"

#include <cmath>
#include <vector>

#include "engine/optim/host_segment.h"
#include "ops/error.h"

namespace dstrain {
namespace {

inline float denom(float v, float eps, bool inside) { return inside ? std::sqrt(v + eps) : std::sqrt(v) + eps; }

}  // namespace

bool has_split_tensors(OptimizerPartition& partition) {
  bool split = false;
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments)
      for (const TensorPiece& p : s.pieces) split = split || p.numel != p.tensor_numel;
  });
  return split;
}

void lamb_step_exact(OptimizerPartition& partition, const LambConfig& c, std::span<const TensorCut> cuts) {
  const std::size_t nt = static_cast<std::size_t>(partition.tensor_count());
  DSTRAIN_CHECK(cuts.empty() || cuts.size() == nt, "lamb_step_exact: {} tensor cuts for a partition of {} tensors", cuts.size(), nt);
  check_cuts_fit(partition, cuts, "Lamb");
  if (partition.tensor_parallel_size() > 1 && cuts.empty()) {
    fail("Lamb: the partition is a tensor-parallel rank's but the optimizer was not told which tensors are cut; call Optimizer::set_parameters "
         "with the owned parameters first");
  }
  // sums[2k]: ‖θ‖² of tensor k's pieces here, sums[2k + 1]: ‖u‖².
  std::vector<double> sums(2 * nt, 0.0);
  const float b1 = c.beta1, b2 = c.beta2, eps = c.eps, gs = c.grad_scale;
  const bool inside = c.eps_inside_sqrt;
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      const float wd = s.weight_decay ? c.weight_decay : 0.0f;
      HostSegment h(s, 2);
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      const float* g = h.grads();
      for (const TensorPiece& piece : s.pieces) {
        double w2 = 0.0, u2 = 0.0;
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
          const float gi = g[i] * gs;
          const float mi = b1 * m[i] + (1.0f - b1) * gi;
          const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
          m[i] = mi;
          v[i] = vi;
          const float u = mi / denom(vi, eps, inside) + wd * p[i];
          w2 += static_cast<double>(p[i]) * static_cast<double>(p[i]);
          u2 += static_cast<double>(u) * static_cast<double>(u);
        }
        sums[2 * static_cast<std::size_t>(piece.tensor)] += w2;
        sums[2 * static_cast<std::size_t>(piece.tensor) + 1] += u2;
      }
      h.commit();  // m, v (the master is unchanged: the lowp copy is rewritten identically)
    }
  });
  partition.all_reduce_sum(sums);
  // A tensor cut by tensor parallelism: the group's pieces hold the rest of its norms.
  std::vector<ValueRange> cut_sums;
  for (std::size_t k = 0; k < cuts.size(); ++k)
    if (cuts[k].cut) cut_sums.push_back({2 * k, 2});
  sum_cut_values(partition, sums, cut_sums);
  std::vector<float> coeff(nt, 1.0f);
  for (std::size_t k = 0; k < nt; ++k) {
    const float w_norm = static_cast<float>(std::sqrt(sums[2 * k])), u_norm = static_cast<float>(std::sqrt(sums[2 * k + 1]));
    if (w_norm != 0.0f && u_norm != 0.0f) {
      float r = w_norm / u_norm;
      if (r > c.max_coeff) r = c.max_coeff;
      if (r < c.min_coeff) r = c.min_coeff;
      coeff[k] = r;
    }
  }
  // step_size as the kernel computes it (ops/cpu/lamb.cpp): bias corrections in double, then fp32.
  float step_size = c.lr;
  if (c.bias_correction) {
    const double t = static_cast<double>(c.step);
    const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
    const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
    step_size = c.lr * std::sqrt(bc2) / bc1;
  }
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      const float wd = s.weight_decay ? c.weight_decay : 0.0f;
      HostSegment h(s, 2);
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      for (const TensorPiece& piece : s.pieces) {
        const float rate = step_size * coeff[static_cast<std::size_t>(piece.tensor)];
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
          const float u = m[i] / denom(v[i], eps, inside) + wd * p[i];
          p[i] = p[i] - rate * u;
        }
      }
      h.commit();
    }
  });
}

}  // namespace dstrain
