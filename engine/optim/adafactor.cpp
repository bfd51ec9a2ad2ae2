#include "engine/optim/adafactor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/optim/host_segment.h"
#include "ops/error.h"

namespace dstrain {
namespace {

inline float lerp(float a, float b, float w) { return std::abs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

}  // namespace

AdafactorTensor adafactor_tensor_of(const ParamSpec& spec) {
  AdafactorTensor t;
  const Shape s = spec.whole_shape();
  t.cut = tensor_cut_of(spec);
  t.matrix = s.rank >= 2;
  t.cols = s.rank == 0 ? 1 : s[s.rank - 1];
  t.rows = t.cols == 0 ? 0 : s.numel() / t.cols;
  t.logical_rows = spec.init.rows > 0 && s.rank == 2 ? spec.init.rows : t.rows;
  if (s.rank > 2)
    fail("Adafactor: parameter '{}' has {} dimensions; dstrain's Adafactor factors matrices (2 dimensions) and vectors", spec.name, s.rank);
  return t;
}

void adafactor_step(OptimizerPartition& partition, std::span<const AdafactorTensor> tensors, const AdafactorStepConfig& c) {
  const std::size_t nt = static_cast<std::size_t>(partition.tensor_count());
  DSTRAIN_CHECK(tensors.size() == nt, "adafactor_step: {} tensor descriptions for a partition of {} tensors", tensors.size(), nt);
  const double t = static_cast<double>(c.step);
  const auto beta_hat = static_cast<float>(std::pow(t, c.beta2_decay));
  const double rho = std::min(c.lr, 1.0 / std::sqrt(t));
  const float eps1 = c.eps1 ? static_cast<float>(*c.eps1) : std::numeric_limits<float>::epsilon();
  const float gs = c.maximize ? -c.grad_scale : c.grad_scale;
  for (const AdafactorTensor& tk : tensors) check_cut_fits(partition, tk.cut, "Adafactor");

  // Layout of the all-reduced sums: [‖θ‖² per tensor] then, per matrix, [row Σg² (R), column Σg² (C),
  // held row factors (R), held column factors (C)], rows and columns of the whole matrix.
  std::vector<std::size_t> at(nt, 0);
  std::size_t total = nt;
  for (std::size_t k = 0; k < nt; ++k)
    if (tensors[k].matrix) {
      at[k] = total;
      total += static_cast<std::size_t>(2 * (tensors[k].rows + tensors[k].cols));
    }
  std::vector<double> sums(total, 0.0);
  // The values a cut tensor's other pieces add to (over the tensor-parallel group).
  std::vector<ValueRange> cut_sums, cut_norms;
  for (std::size_t k = 0; k < nt; ++k) {
    if (!tensors[k].cut.cut) continue;
    cut_sums.push_back({k, 1});
    cut_norms.push_back({k, 1});
    if (tensors[k].matrix) cut_sums.push_back({at[k], static_cast<std::size_t>(2 * (tensors[k].rows + tensors[k].cols))});
  }

  // Pass 1: ‖θ‖², the gradient's row and column sums of squares, the held factors.
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      HostSegment h(s, 2);
      const float *p = h.master(), *g = h.grads(), *r = h.state(0), *cv = h.state(1);
      for (const TensorPiece& piece : s.pieces) {
        const AdafactorTensor& at_k = tensors[static_cast<std::size_t>(piece.tensor)];
        double w2 = 0.0;
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) w2 += static_cast<double>(p[i]) * static_cast<double>(p[i]);
        sums[static_cast<std::size_t>(piece.tensor)] += w2;
        if (!at_k.matrix) continue;
        const std::int64_t R = at_k.rows, C = at_k.cols;
        double* row_g2 = sums.data() + at[static_cast<std::size_t>(piece.tensor)];
        double* col_g2 = row_g2 + R;
        double* row_held = col_g2 + C;
        double* col_held = row_held + R;
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
          const auto [row, col] = at_k.cut.whole_row_col(piece.tensor_offset + (i - piece.offset));
          const double gi = static_cast<double>(g[i] * gs);
          row_g2[row] += gi * gi;
          col_g2[col] += gi * gi;
          if (col == 0) row_held[row] += r[i];
          if (row == 0) col_held[col] += cv[i];
        }
      }
    }
  });
  partition.all_reduce_sum(sums);
  sum_cut_values(partition, sums, cut_sums);

  // The new factors (every rank computes the same), and each matrix's mean row factor.
  std::vector<std::vector<float>> row_var(nt), col_var(nt);
  std::vector<float> row_mean(nt, 0.0f);
  for (std::size_t k = 0; k < nt; ++k) {
    const AdafactorTensor& tk = tensors[k];
    if (!tk.matrix) continue;
    const std::int64_t R = tk.rows, C = tk.cols;
    const double* row_g2 = sums.data() + at[k];
    const double* col_g2 = row_g2 + R;
    const double* row_held = col_g2 + C;
    const double* col_held = row_held + R;
    row_var[k].resize(static_cast<std::size_t>(R));
    col_var[k].resize(static_cast<std::size_t>(C));
    double rsum = 0.0;
    for (std::int64_t i = 0; i < R; ++i) {
      const auto mean = static_cast<float>(row_g2[i] / static_cast<double>(C));
      row_var[k][static_cast<std::size_t>(i)] = lerp(static_cast<float>(row_held[i]), mean, beta_hat);
      rsum += row_var[k][static_cast<std::size_t>(i)];
    }
    for (std::int64_t j = 0; j < C; ++j) {
      const auto mean = static_cast<float>(col_g2[j] / static_cast<double>(tk.logical_rows));
      col_var[k][static_cast<std::size_t>(j)] = lerp(static_cast<float>(col_held[j]), mean, beta_hat);
    }
    row_mean[k] = std::max(static_cast<float>(rsum / static_cast<double>(tk.logical_rows)), eps1);
  }
  const float eps1_sq = eps1 * eps1;
  // (row, col): the element's place in the whole matrix.
  auto update_of = [&](std::size_t k, std::int64_t row, std::int64_t col, float gi, float v) {
    const AdafactorTensor& tk = tensors[k];
    float var = v;
    if (tk.matrix) var = row_var[k][static_cast<std::size_t>(row)] * col_var[k][static_cast<std::size_t>(col)] / row_mean[k];
    return gi * (1.0f / std::sqrt(std::max(var, eps1_sq)));
  };

  // Pass 2: the vectors' variances and every tensor's ‖U‖²; the factors written back where held.
  std::vector<double> u2(nt, 0.0);
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      HostSegment h(s, 2);
      const float* g = h.grads();
      float *r = h.state(0), *cv = h.state(1);
      for (const TensorPiece& piece : s.pieces) {
        const std::size_t k = static_cast<std::size_t>(piece.tensor);
        const AdafactorTensor& tk = tensors[k];
        double acc = 0.0;
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
          const auto [row, col] = tk.cut.whole_row_col(piece.tensor_offset + (i - piece.offset));
          const float gi = g[i] * gs;
          if (!tk.matrix) {
            r[i] = lerp(r[i], gi * gi, beta_hat);
          } else {
            if (col == 0) r[i] = row_var[k][static_cast<std::size_t>(row)];
            if (row == 0) cv[i] = col_var[k][static_cast<std::size_t>(col)];
          }
          const float u = update_of(k, row, col, gi, r[i]);
          acc += static_cast<double>(u) * static_cast<double>(u);
        }
        u2[k] += acc;
      }
      h.commit();
    }
  });
  partition.all_reduce_sum(u2);
  sum_cut_values(partition, u2, cut_norms);

  // Pass 3: decay, then θ −= α / max(1, RMS(U)/d) · U.
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      const double wd = s.weight_decay ? c.weight_decay : 0.0;
      const auto decay = static_cast<float>(1.0 - c.lr * wd);
      HostSegment h(s, 2);
      float* p = h.master();
      const float *g = h.grads(), *r = h.state(0);
      for (const TensorPiece& piece : s.pieces) {
        const std::size_t k = static_cast<std::size_t>(piece.tensor);
        const double n = static_cast<double>(tensors[k].logical_numel());
        const double alpha = std::max(c.eps2, std::sqrt(sums[k]) / std::sqrt(n)) * rho;
        const double denom = std::max(1.0, std::sqrt(u2[k]) / (std::sqrt(n) * c.d));
        const auto step = static_cast<float>(-alpha / denom);
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) {
          const auto [row, col] = tensors[k].cut.whole_row_col(piece.tensor_offset + (i - piece.offset));
          const float u = update_of(k, row, col, g[i] * gs, r[i]);
          if (wd != 0.0) p[i] = p[i] * decay;
          p[i] = p[i] + step * u;
        }
      }
      h.commit();
    }
  });
}

}  // namespace dstrain
