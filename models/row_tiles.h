// Row tiles of activations. ALST (Arctic Long Sequence Training, 2025) computes the parts of a
// layer whose intermediates grow with the sequence a tile of positions at a time — the LM head's
// logits (models/lm_head_loss.h) and the MLP's hidden features (the blocks' tiled MLP) — so that
// only one tile's intermediate exists at once, and backward computes each tile's again. A (B, T, W)
// activation is B·T rows of W; a tile is a run of them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ops/tensor.h"

namespace dstrain {

// Rows [r0, r0 + n) of a (B, T, W) or (rows, W) tensor, as a 2-D (n, W) view.
inline Tensor row_range(const Tensor& t, std::int64_t r0, std::int64_t n, std::int64_t width) {
  return Tensor(static_cast<char*>(t.data) + static_cast<std::size_t>(r0 * width) * dtype_size(t.dtype), t.dtype, Shape{n, width}, t.device);
}

// Calls fn(r0, n) for the tiles of `rows` rows, `tile_rows` at a time (the last may be shorter).
template <typename Fn>
void for_each_row_tile(std::int64_t rows, std::int64_t tile_rows, Fn&& fn) {
  for (std::int64_t r0 = 0; r0 < rows; r0 += tile_rows) fn(r0, std::min(tile_rows, rows - r0));
}

}  // namespace dstrain
