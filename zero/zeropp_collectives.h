// The collectives of ZeRO++ and MiCS (docs/zero.md §10), built from a group's plain collectives
// and the block quantization of ops/kernels/quantize.h:
//
//   quantized_all_gather      qwZ: each rank's piece quantized to int8 (DeepSpeed's block size for
//                             the piece), one all_gather of the packed words, every piece —
//                             this rank's own included — dequantized into place, so that every
//                             rank computes with the same weights
//   hierarchical_all_gather   MiCS's mics_hierarchical_params_gather: an all_gather across the
//                             nodes among the ranks with the same local index, then one within
//                             the node, then a permutation into rank order: each piece crosses
//                             the node boundary once per other node instead of once per rank there
//   quantized_reduce_scatter  qgZ: DeepSpeed's all_to_all_quant_reduce — int4 blocks, an
//                             all_to_all within the node, dequantize and sum in fp32, requantize,
//                             an all_to_all across the nodes, dequantize and sum in fp32; the
//                             result is the average over the group's W ranks
//
// Layout: the group's ranks are laid out node by node (NodeSplit below): rank r = a·L + l on node
// a ∈ [0, N) with local index l ∈ [0, L). Buffers are flat, of the group's storage dtype, and every
// piece is n elements (the W·n buffers ZeRO's flat layout cuts; n a multiple of 8). Scratch comes
// from `scratch` (transient buffers, freed on return).
#pragma once

#include <cstdint>
#include <memory>

#include "ops/allocator.h"
#include "ops/tensor.h"
#include "zero/communicator.h"

namespace dstrain {

// qgZ's int4 block size (elements per fp32 scale). DeepSpeed quantizes each tensor in max(rows,
// cols, W) groups — about one block per row of a weight matrix, min(rows, cols) elements; dstrain's
// flat chunks span tensors, so it uses one fixed block, no larger than any hidden size it trains.
inline constexpr std::int64_t kGradientQuantBlock = 512;

// A group's split into its nodes: `local` holds the ranks of this rank's node (rank = local index
// l), `cross` the ranks with the same local index on every node (rank = node index a).
struct NodeSplit {
  int nodes = 1;           // N
  int ranks_per_node = 1;  // L
  std::unique_ptr<Communicator> local, cross;
};

// Collective over `group`. Error naming `what` (the config key that asks for it) unless every node
// holds the same number of the group's ranks and each node's ranks are consecutive in the group.
NodeSplit split_by_node(Communicator& group, const char* what);

// recv (W·n) = every rank's `send` (n), through int8 blocks of deepspeed_weight_quant_block(n).
// send must not overlap recv, except as shard_of(recv, rank, W) (in place, as all_gather allows).
void quantized_all_gather(Communicator& group, const Tensor& send, const Tensor& recv, Allocator& scratch);

// recv (W·n) = every rank's `send` (n), as all_gather over the group that `nodes` splits.
void hierarchical_all_gather(const NodeSplit& nodes, const Tensor& send, const Tensor& recv, Allocator& scratch);

// `chunk` (W·n, every rank's whole gradients of one bucket): afterwards shard_of(chunk, rank, W)
// holds the average over the W ranks (the rest of `chunk` is left undefined), through int4 blocks
// of kGradientQuantBlock. Sums in fp32, rounded once into the chunk's dtype.
void quantized_reduce_scatter(const NodeSplit& nodes, const Tensor& chunk, Allocator& scratch);

// The bytes each collective above sends per rank (ring_bytes_sent's convention), for the docs'
// formulas and the tests that count them: the packed words of a quantized piece of n elements.
std::int64_t quantized_piece_bytes(std::int64_t n, int bits, std::int64_t block);

}  // namespace dstrain
