#include "models/lm_head_loss.h"

#include <algorithm>
#include <vector>

#include "models/layer_args.h"
#include "models/row_tiles.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/kernels/vocab_parallel_cross_entropy.h"

namespace dstrain {

namespace {

Tensor vec_range(const Tensor& t, std::int64_t r0, std::int64_t n) {
  return Tensor(static_cast<char*>(t.data) + static_cast<std::size_t>(r0) * dtype_size(t.dtype), t.dtype, Shape{n}, t.device);
}

}  // namespace

std::int64_t loss_tile_rows_for(std::int64_t vocab_rows, std::int64_t bytes) {
  // A row wider than the tile is a tile of one row (and vocab_rows · bytes is never formed then, so
  // a vast vocabulary cannot overflow it).
  if (vocab_rows < 1 || bytes < 1 || vocab_rows >= kLossTileBytes / bytes) return 1;
  return std::max<std::int64_t>(1, kLossTileBytes / (vocab_rows * bytes));
}

std::int64_t LmHeadLoss::rows() const { return tp.active() ? layer_args::vocab_piece(padded, vocab, tp).rows : padded; }

Shape LmHeadLoss::saved_logits_shape(std::int64_t B, std::int64_t T) const { return tiled() ? Shape{0} : Shape{B, T, rows()}; }

Shape LmHeadLoss::tile_shape(std::int64_t B, std::int64_t T) const { return tiled() ? Shape{std::min(tile_rows, B * T), rows()} : Shape{0}; }

std::int64_t LmHeadLoss::stat_rows(std::int64_t B, std::int64_t T) const { return tp.active() ? (tiled() ? std::min(tile_rows, B * T) : B * T) : 0; }

float LmHeadLoss::forward(const ForwardArgs& a, const Tensor& x, const Tensor& w, const Tensor& logits, const Tensor& lse, const Tensor& tile,
                          const Tensor& rowmax, const Tensor& stats, const Tensor& mm, TensorParallelGroup* group) const {
  const layer_args::VocabPiece piece = layer_args::vocab_piece(padded, vocab, tp.active() ? tp : TensorParallelRank{});
  if (!tiled()) {
    matmul_forward(logits, x, w, Tensor{}, mm);  // (B, T, rows) = x · Wᵀ
    return tp.active() ? layer_args::vocab_parallel_head_loss_forward(a, lse, logits, piece, *group, rowmax, stats)
                       : layer_args::head_loss_forward(a, lse, logits, vocab);
  }
  const std::int64_t C = x.shape[x.shape.rank - 1], BT = x.numel() / C, R = rows();
  const Tensor targets(a.batch.targets.data, DType::int32, Shape{BT}, a.batch.targets.device);
  for (std::int64_t r0 = 0; r0 < BT; r0 += tile_rows) {
    const std::int64_t n = std::min(tile_rows, BT - r0);
    const Tensor t = row_range(tile, 0, n, R);
    matmul_forward(t, row_range(x, r0, n, C), w, Tensor{}, mm);
    const Tensor losses = vec_range(a.output, r0, n), l = vec_range(lse, r0, n), tg = vec_range(targets, r0, n);
    if (tp.active()) {
      const Tensor m = vec_range(rowmax, 0, n), st = vec_range(stats, 0, 2 * n);
      vocab_shard_max(m, t, piece.valid);
      group->max(m);
      vocab_shard_sum_exp(st, t, m, tg, piece.first, piece.valid);
      group->sum(st);
      (void)vocab_parallel_losses(losses, l, m, st, tg);
    } else {
      (void)softmax_cross_entropy_forward(losses, l, t, tg, vocab);
    }
  }
  // The mean as the whole-batch kernels form it: the fp32 losses summed in double in position
  // order (ignored positions add their 0), over the non-ignored count.
  std::vector<float> host(static_cast<std::size_t>(BT));
  copy_tensor(Tensor(host.data(), DType::fp32, Shape{BT}), Tensor(a.output.data, DType::fp32, Shape{BT}, a.output.device));
  std::vector<std::int32_t> tgt(static_cast<std::size_t>(BT));
  copy_tensor(Tensor(tgt.data(), DType::int32, Shape{BT}), targets);
  double sum = 0.0;
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < BT; ++i) {
    sum += host[static_cast<std::size_t>(i)];
    count += tgt[static_cast<std::size_t>(i)] >= 0 ? 1 : 0;
  }
  return count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

void LmHeadLoss::backward(const BackwardArgs& a, const Tensor& x, const Tensor& w, const Tensor& dw, const Tensor& dx, const Tensor& logits,
                          const Tensor& lse, const Tensor& tile, const Tensor& mm) const {
  const layer_args::VocabPiece piece = layer_args::vocab_piece(padded, vocab, tp.active() ? tp : TensorParallelRank{});
  zero_tensor(dx);
  if (!tiled()) {
    if (tp.active()) {
      layer_args::vocab_parallel_head_loss_backward(a, lse, logits, piece);
    } else {
      layer_args::head_loss_backward(a, lse, logits, vocab);
    }
    matmul_backward(dx, dw, Tensor{}, logits, x, w, mm);
    return;
  }
  // Tiled: the forward kept no logits (and did not fuse their gradient); each tile's again.
  const std::int64_t C = x.shape[x.shape.rank - 1], BT = x.numel() / C, R = rows();
  const std::int64_t n_targets = count_targets(a.batch);
  const float dloss = n_targets > 0 ? a.dloss / static_cast<float>(n_targets) : 0.0f;
  const Tensor targets(a.batch.targets.data, DType::int32, Shape{BT}, a.batch.targets.device);
  for (std::int64_t r0 = 0; r0 < BT; r0 += tile_rows) {
    const std::int64_t n = std::min(tile_rows, BT - r0);
    const Tensor t = row_range(tile, 0, n, R), xt = row_range(x, r0, n, C);
    matmul_forward(t, xt, w, Tensor{}, mm);
    const Tensor l = vec_range(lse, r0, n), tg = vec_range(targets, r0, n);
    if (tp.active()) {
      vocab_shard_cross_entropy_backward(t, t, l, tg, dloss, piece.first, piece.valid);
    } else {
      softmax_cross_entropy_backward(t, t, l, tg, dloss, vocab);
    }
    matmul_backward(row_range(dx, r0, n, C), dw, Tensor{}, t, xt, w, mm);
  }
}

}  // namespace dstrain
