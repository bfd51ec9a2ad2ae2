// ParamSplit: how one parameter may be cut across the ranks of a tensor-parallel or expert-parallel
// group — what tensor, sequence and expert parallelism ask of a model (docs/parallelism.md). The
// layer that owns a parameter declares it in its ParamSpec; whether a run cuts it is the engine's
// choice. A model that declares nothing (every parameter replicated) still trains, data-parallel.
//
// Our linear weights are nn.Linear's (out, in) (models/layer.h), so
//   rows      cuts dim 0: a column-parallel linear (Megatron's QKV, MLP up / gate / c_fc) and its
//             bias — each rank computes some output features, no communication in forward;
//   columns   cuts dim 1: a row-parallel linear (attention output, MLP down) — each rank holds
//             some input features and the outputs are summed over the group (its bias is
//             replicated, added once after the sum);
//   vocabulary cuts dim 0 of a vocabulary table (the token embedding, the LM head): each rank
//             owns some token rows; the lookup's result is summed over the group and the
//             cross-entropy is computed without gathering the logits;
//   experts   cuts dim 0 of a stack of expert weights (E, ...): each rank owns whole experts.
//
// A cut dimension is cut in whole units: a head's width for attention (heads are never split), a
// group of query heads sharing one key/value head under grouped-query attention, 1 for a plain
// hidden dimension. A fused tensor (GPT-2's c_attn = [q | k | v], Llama's qkv_proj) is cut part by
// part: each part is split on its own and a rank holds its piece of every part. Units are
// distributed as DeepSpeed's AutoTP distributes heads: n units over W ranks give rank r
// n / W + (r < n % W ? 1 : 0) consecutive units (6 key/value heads over 4 ranks: 2, 2, 1, 1), so
// uneven counts are allowed and a rank may hold none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/tensor.h"

namespace dstrain {

enum class SplitKind { replicated, rows, columns, vocabulary, experts };

// "replicated", "rows", "columns", "vocabulary", "experts".
const char* split_kind_name(SplitKind kind);

struct ParamSplit {
  // One part of the cut dimension: `size` elements along it, cut in units of `unit` (size % unit == 0).
  struct Part {
    std::int64_t size = 0;
    std::int64_t unit = 1;
  };

  SplitKind kind = SplitKind::replicated;
  // The parts of the cut dimension, in order; empty: one part, the whole dimension in units of 1.
  std::vector<Part> parts;

  static ParamSplit replicated() { return {}; }
  static ParamSplit rows(std::vector<Part> parts = {}) { return {SplitKind::rows, std::move(parts)}; }
  static ParamSplit columns(std::vector<Part> parts = {}) { return {SplitKind::columns, std::move(parts)}; }
  static ParamSplit vocabulary() { return {SplitKind::vocabulary, {}}; }
  static ParamSplit experts() { return {SplitKind::experts, {}}; }

  bool is_replicated() const { return kind == SplitKind::replicated; }
  // The dimension cut: 0 for rows, vocabulary and experts, 1 for columns; -1 when replicated.
  int dim() const;
  // One line for tables and errors: "rows [768/64 | 768/64 | 768/64]", "columns", "replicated".
  std::string describe() const;
};

// A contiguous range [begin, begin + size) of the cut dimension.
struct SplitRange {
  std::int64_t begin = 0;
  std::int64_t size = 0;
};

// The ranges of the cut dimension that rank `rank` of `ranks` holds, one per part (some may be
// empty), for a parameter of `shape` split as `split`. A replicated parameter: the whole dim 0.
// Error naming the parameter when the parts do not add up to the dimension or a part is not a
// multiple of its unit.
std::vector<SplitRange> split_ranges(const ParamSplit& split, const Shape& shape, int ranks, int rank, const std::string& name);

// The units (heads, groups, elements, experts) each of `ranks` ranks gets of `units`: AutoTP's
// n / W + (r < n % W).
std::int64_t units_of_rank(std::int64_t units, int ranks, int rank);

// The shape of rank `rank`'s piece of a parameter of shape `whole` split as `split` over `ranks`
// ranks: the cut dimension shrinks to the sum of the rank's ranges (possibly 0). A replicated
// parameter keeps its shape.
Shape piece_shape(const ParamSplit& split, const Shape& whole, int ranks, int rank, const std::string& name);

// Host copies between a whole parameter and rank `rank`'s piece of it (contiguous, the piece's
// ranges packed in part order, as piece_shape lays them out). Both fp32 or both the same dtype;
// host memory. Replicated: the piece is the whole.
void copy_whole_to_piece(const Tensor& whole, const Tensor& piece, const ParamSplit& split, int ranks, int rank, const std::string& name);
void copy_piece_to_whole(const Tensor& piece, const Tensor& whole, const ParamSplit& split, int ranks, int rank, const std::string& name);

// A run of consecutive elements that lie consecutively both in the whole parameter and in a rank's
// piece of it: elements [local_offset, local_offset + numel) of the piece (row-major in its
// piece_shape) are elements [whole_offset, whole_offset + numel) of the whole (row-major).
struct ElementRun {
  std::int64_t whole_offset = 0;
  std::int64_t local_offset = 0;
  std::int64_t numel = 0;
  friend bool operator==(const ElementRun&, const ElementRun&) = default;
};

// Elements [local_offset, local_offset + local_numel) of rank `rank`'s piece of a parameter of
// shape `whole` split as `split` over `ranks` ranks, as runs of the whole parameter's elements, in
// the piece's order (local offsets increasing, together exactly the range asked for). Runs that
// continue each other in both spaces are merged: a replicated parameter, or one rank holding the
// whole, gives one run (whole offset = local offset); a dim-0 split (rows, vocabulary, experts) at
// most one run per part; a dim-1 split (columns) one run per row and part. This is how a training
// checkpoint stores a piece in the whole parameter's element space (docs/checkpoints.md), so that
// it loads at any tensor-parallel size. Error naming the parameter when the range is not inside the
// piece.
std::vector<ElementRun> piece_runs(const ParamSplit& split, const Shape& whole, int ranks, int rank, std::int64_t local_offset, std::int64_t local_numel,
                                   const std::string& name);

// Assembling a whole parameter from every rank's piece with one all-gather: pieces may differ in
// size (uneven splits), so each travels in a slot of the largest piece's element count.
std::int64_t piece_slot_numel(const ParamSplit& split, const Shape& whole, int ranks, const std::string& name);
// `slots`: host, ranks · slot elements, rank r's piece (packed as copy_whole_to_piece packs it) at
// element r · slot — what the all-gather of the padded pieces gives. Writes every rank's piece into
// `whole` (host, the whole shape, the slots' dtype).
void assemble_whole(const Tensor& slots, std::int64_t slot, const Tensor& whole, const ParamSplit& split, int ranks, const std::string& name);

}  // namespace dstrain
