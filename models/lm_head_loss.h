// The LM head's logits and loss from the final norm's output, shared by the families' heads: whole
// (the logits (B, T, V) saved for backward, which turns them into their gradient in place), with
// the vocabulary cut across tensor-parallel ranks (the vocabulary-parallel cross-entropy of
// layer_args.h), and — ALST's tiled loss (Arctic Long Sequence Training, 2025) — in tiles of
// positions, so that the (T, V) logits never exist whole: forward computes each tile's logits,
// its losses and lse, and drops them; backward computes each tile's logits again, turns them into
// their gradient and multiplies them into d(x) and d(W). One more head GEMM (the recompute) for
// B·T·V·s bytes of activations kept (e.g. 1.6 GB at T = 32K, V = 50K, bf16). The loss is
// bit-identical to the untiled one (each position's lse and loss come from the same row-wise
// kernels; the mean sums the same fp32 losses in double in position order); d(W) sums the tiles'
// products in tile order.
#pragma once

#include <cstdint>

#include "models/layer.h"
#include "models/tensor_parallel.h"
#include "ops/tensor.h"

namespace dstrain {

// ALST's tile for a run: the positions whose logits — `vocab_rows` of the rank's vocabulary, `bytes`
// per element — take at most kLossTileBytes (64 MiB), at least one. What the trainer builds the head
// with under sequence parallelism (train/rank_trainer.cpp) and the memory estimate counts
// (train/memory_estimate.h).
inline constexpr std::int64_t kLossTileBytes = std::int64_t{64} << 20;
std::int64_t loss_tile_rows_for(std::int64_t vocab_rows, std::int64_t bytes);

struct LmHeadLoss {
  std::int64_t vocab = 0;      // real tokens (ids < vocab)
  std::int64_t padded = 0;     // rows of the whole table (vocab padded)
  TensorParallelRank tp{};     // the vocabulary's cut
  std::int64_t tile_rows = 0;  // positions per tile; 0: untiled

  bool tiled() const { return tile_rows > 0; }
  // This rank's rows of the table (its logits' width).
  std::int64_t rows() const;
  // The saved logits: (B, T, rows) untiled, nothing tiled.
  Shape saved_logits_shape(std::int64_t B, std::int64_t T) const;
  // Scratch of a tile's logits: (min(tile_rows, B·T), rows) tiled, nothing untiled.
  Shape tile_shape(std::int64_t B, std::int64_t T) const;
  // Scratch of the vocabulary-parallel cross-entropy's per-position max and (sum, target logit):
  // the positions of a tile (or of the micro-batch), with tensor parallelism; nothing otherwise.
  std::int64_t stat_rows(std::int64_t B, std::int64_t T) const;

  // x: the normalised input (B, T, C); w: this rank's rows of the table (rows, C). Writes
  // a.output's per-position losses and lse (B, T), and logits (untiled); returns the mean over
  // this rank's non-ignored targets. group: the tensor-parallel group (with tp.active()).
  float forward(const ForwardArgs& a, const Tensor& x, const Tensor& w, const Tensor& logits, const Tensor& lse, const Tensor& tile,
                const Tensor& rowmax, const Tensor& stats, const Tensor& mm, TensorParallelGroup* group) const;
  // dx (B, T, C) written: this rank's share of d(x) (the caller sums it over the group);
  // dw += d(W). logits: the forward's (untiled); tile: scratch (tiled).
  void backward(const BackwardArgs& a, const Tensor& x, const Tensor& w, const Tensor& dw, const Tensor& dx, const Tensor& logits, const Tensor& lse,
                const Tensor& tile, const Tensor& mm) const;
};

}  // namespace dstrain
