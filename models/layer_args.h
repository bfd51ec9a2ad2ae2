// Private helpers of the layer implementations: argument count checks, dropout keys, the heads' loss.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "ops/error.h"
#include "ops/kernels/dropout.h"
#include "ops/kernels/matmul.h"
#include "ops/kernels/tensor_ops.h"
#include "ops/kernels/softmax_cross_entropy.h"
#include "ops/kernels/vocab_parallel_cross_entropy.h"
#include "ops/tensor.h"
#include "models/layer.h"
#include "models/param_split.h"
#include "models/residual_shards.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"

namespace dstrain::layer_args {

inline void expect_count(const std::string& layer, const char* what, std::span<const Tensor> got, std::size_t want) {
  if (got.size() != want) {
    fail("layer '{}': {} has {} tensors but the layer declares {}; pass them in the order of the layer's specs", layer, what, got.size(), want);
  }
}

// The dropout of call site k of a layer: off when not training or p == 0.
inline DropoutParams dropout(float p, const RngKey& base, std::uint32_t k, bool train) {
  DropoutParams d;
  d.p = train ? p : 0.0f;
  d.rng = base;
  d.rng.site = base.site + k;
  return d;
}

// Dropout over a tensor a rank holds only part of — attention probabilities over a rank's own
// heads (tensor parallelism), a rank's tokens (sequence parallelism): stream 0 draws the one-rank
// model's masks, the others streams of their own (Megatron's model-parallel RNG), since their
// element indices are not the one-rank model's and must not repeat another rank's masks.
inline DropoutParams parallel_dropout(float p, const RngKey& base, std::uint32_t k, bool train, int stream) {
  DropoutParams d = dropout(p, base, k, train);
  if (stream > 0) d.rng.seed ^= 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(stream);
  return d;
}

// The stream of a rank's attention heads: one per (tensor-parallel, sequence-parallel) rank.
inline int attention_stream(TensorParallelRank tp, SequenceParallelRank sp) { return tp.rank * sp.ranks + sp.rank; }

// A head's loss: the mean cross-entropy of logits (B, T, Vp) over the non-ignored targets, so
// each position's loss has weight 1 / n. When training fuses the loss gradient
// (a.fuse_loss_grad), the logits become their gradient in the same pass and backward starts
// from them; otherwise head_loss_backward turns them into it.
inline float head_loss_forward(const ForwardArgs& a, Tensor lse, Tensor logits, std::int64_t vocab) {
  if (!a.fuse_loss_grad) return softmax_cross_entropy_forward(a.output, lse, logits, a.batch.targets, vocab);
  const std::int64_t n = count_targets(a.batch);
  const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
  return softmax_cross_entropy_forward_backward(a.output, lse, logits, a.batch.targets, dloss, vocab);
}

// logits -> d(loss)/d(logits) in place, unless the forward did it (a.loss_grad_done).
inline void head_loss_backward(const BackwardArgs& a, Tensor lse, Tensor logits, std::int64_t vocab) {
  if (a.loss_grad_done) return;
  const std::int64_t n = count_targets(a.batch);
  const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
  softmax_cross_entropy_backward(logits, logits, lse, a.batch.targets, dloss, vocab);
}

// A row-parallel projection (attention output, MLP down) under tensor parallelism: this rank's
// partial product whole = inp · wᵀ, the bias added once (by rank 0, which holds the most heads),
// then summed over the group into the residual stream's layout: `local`, this rank's rows of the
// sum when the stream is cut (Megatron's sequence parallelism, a reduce-scatter), or the sum in
// place (an all-reduce; `whole` is `local`). A rank whose input has no columns (no heads) adds
// zeros. Without a group: the plain linear.
inline void row_parallel_forward(const Tensor& whole, const Tensor& local, const Tensor& inp, const Tensor& w, const Tensor& b, const Tensor& mm,
                                 TensorParallelRank tp, const ResidualShards& shards) {
  if (inp.shape[inp.shape.rank - 1] == 0) {
    zero_tensor(whole);
  } else {
    matmul_forward(whole, inp, w, tp.rank == 0 ? b : Tensor{}, mm);
  }
  shards.reduce(whole, local);
}

// The residual stream's helpers of a layer built for `tp` on a (B, T) micro-batch: its group
// (null without tensor parallelism) and whether the stream is cut (models/residual_shards.h).
inline ResidualShards residual_shards(TensorParallelGroup* group, TensorParallelRank tp, const LayerDims& d, const std::string& layer) {
  if (!tp.active()) return {};
  return {&layer_group(group, tp, layer), tp.shards_residual(d.B * d.T)};
}

// The dropout stream of the residual stream's dropouts: one per sequence-parallel rank (their
// tokens differ), and per tensor-parallel rank too where the stream is cut.
inline int residual_stream(TensorParallelRank tp, SequenceParallelRank sp, const ResidualShards& shards) {
  return shards.sharded ? attention_stream(tp, sp) : sp.rank;
}

// The shape of a norm's per-token statistics (mean, rstd) over the residual stream `residual`
// ((B, T, C) or a rank's (1, n, C)): its first two dimensions.
inline Shape token_stats_shape(const Shape& residual) { return Shape{residual[0], residual[1]}; }

// A tensor-parallel rank's rows of a vocabulary table of `padded` rows whose first `vocab` are real
// tokens: rows [first, first + rows), of which the first `valid` are real.
struct VocabPiece {
  std::int64_t first = 0;
  std::int64_t rows = 0;
  std::int64_t valid = 0;
};

inline VocabPiece vocab_piece(std::int64_t padded, std::int64_t vocab, TensorParallelRank tp) {
  const SplitRange r = split_ranges(ParamSplit::vocabulary(), Shape{padded, 1}, tp.ranks, tp.rank, "vocabulary")[0];
  const std::int64_t valid = r.begin >= vocab ? 0 : (r.begin + r.size <= vocab ? r.size : vocab - r.begin);
  return {r.begin, r.size, valid};
}

// The head's loss under tensor parallelism: `logits` (B, T, rows) are this rank's vocabulary
// columns; the vocabulary-parallel cross-entropy (ops/kernels/vocab_parallel_cross_entropy.h)
// with its max and sum over the group, never gathering the logits. rowmax (BT) and stats (BT, 2)
// fp32 scratch. With fuse_loss_grad the logits become their gradient, as in head_loss_forward.
inline float vocab_parallel_head_loss_forward(const ForwardArgs& a, Tensor lse, Tensor logits, const VocabPiece& piece, TensorParallelGroup& group,
                                              Tensor rowmax, Tensor stats) {
  vocab_shard_max(rowmax, logits, piece.valid);
  group.max(rowmax);
  vocab_shard_sum_exp(stats, logits, rowmax, a.batch.targets, piece.first, piece.valid);
  group.sum(stats);
  const float mean = vocab_parallel_losses(a.output, lse, rowmax, stats, a.batch.targets);
  if (a.fuse_loss_grad) {
    const std::int64_t n = count_targets(a.batch);
    const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
    vocab_shard_cross_entropy_backward(logits, logits, lse, a.batch.targets, dloss, piece.first, piece.valid);
  }
  return mean;
}

// logits -> d(loss)/d(logits) on this rank's columns, unless the forward did it.
inline void vocab_parallel_head_loss_backward(const BackwardArgs& a, Tensor lse, Tensor logits, const VocabPiece& piece) {
  if (a.loss_grad_done) return;
  const std::int64_t n = count_targets(a.batch);
  const float dloss = n > 0 ? a.dloss / static_cast<float>(n) : 0.0f;
  vocab_shard_cross_entropy_backward(logits, logits, lse, a.batch.targets, dloss, piece.first, piece.valid);
}

}  // namespace dstrain::layer_args
