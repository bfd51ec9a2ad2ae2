// Sequence parallelism as a model sees it: DeepSpeed-Ulysses (Jacobs et al., 2023;
// docs/parallelism.md). The SP ranks of a group each hold Tl = T / SP consecutive tokens of every
// sequence; everything but attention is token-wise and runs on them alone. Around attention an
// all-to-all turns the rank's tokens of every head into every token of its heads — each rank then
// attends over the whole sequence for NH / SP query heads (and NKV / SP key/value heads) — and a
// second all-to-all turns the attention's output back:
//
//   sequence_to_heads: (B, Tl, W)     this rank's tokens, every head of each part
//                   -> (B, SP·Tl, W/SP) every token, this rank's heads of each part
//   heads_to_sequence: the inverse
//
// W is a row of parts (GPT-2's q | k | v, Llama's q | k | v with fewer k/v heads), each cut evenly
// across the SP ranks in whole heads; a rank's slice of each part travels together, so one
// all-to-all moves q, k and v. Bytes per rank and call: (SP−1)/SP · B·Tl·W·s (the ring volume of
// zero/communicator.h's all_to_all).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ops/tensor.h"

namespace dstrain {

// Which sequence-parallel rank the layers are built for: tokens [rank·Tl, (rank+1)·Tl).
struct SequenceParallelRank {
  int rank = 0;
  int ranks = 1;
  // ALST's tiled loss (models/lm_head_loss.h): positions per tile of the LM head's logits, so that
  // the (T, V) logits never exist whole; 0: untiled.
  std::int64_t loss_tile_rows = 0;
  // ALST's tiled MLP (models/row_tiles.h): positions per tile of the blocks' MLP, whose hidden
  // features (B·T × 4C for GPT-2, 3 × B·T × I for Llama) are then never kept — backward computes
  // each tile's again; 0 (or a tile of the whole micro-batch): untiled.
  std::int64_t mlp_tile_rows = 0;
  bool active() const { return ranks > 1; }
  // Whether a (B, T) micro-batch's MLP runs in tiles.
  bool tiles_mlp(std::int64_t tokens) const { return mlp_tile_rows > 0 && mlp_tile_rows < tokens; }
};

// The collectives of a sequence-parallel group (the engine provides them over the mesh's SP
// communicator).
class SequenceParallelGroup {
 public:
  virtual ~SequenceParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // send, recv: SP·n elements each; chunk j of send goes to rank j, chunk i of recv came from rank i.
  virtual void all_to_all(Tensor send, Tensor recv) = 0;
};

// The group a layer built for `sp` was handed, checked (an Error naming the layer otherwise).
SequenceParallelGroup& layer_group(SequenceParallelGroup* group, SequenceParallelRank sp, const std::string& layer);

// Elements of the send and of the receive buffer of sequence_to_heads / heads_to_sequence for a
// (B, Tl, W) tensor: B·Tl·W each.
inline std::int64_t ulysses_buffer_elems(std::int64_t B, std::int64_t Tl, std::int64_t W) { return B * Tl * W; }

// x (B, Tl, W) -> out (B, SP·Tl, W/SP), through `send` and `recv` (the storage dtype, B·Tl·W
// elements each, on the activations' device). parts: the widths of W's parts, in order (each divisible by SP in
// whole heads, which the layer checked).
void sequence_to_heads(SequenceParallelGroup& group, const Tensor& x, const Tensor& out, std::span<const std::int64_t> parts, const Tensor& send,
                       const Tensor& recv);

// x (B, SP·Tl, W/SP) -> out (B, Tl, W): the inverse of sequence_to_heads.
void heads_to_sequence(SequenceParallelGroup& group, const Tensor& x, const Tensor& out, std::span<const std::int64_t> parts, const Tensor& send,
                       const Tensor& recv);

}  // namespace dstrain
