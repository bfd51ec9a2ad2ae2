// TensorCut: what the per-tensor optimizers (Lamb, Muon, Adafactor) need to know of an owned tensor
// that tensor parallelism cuts (ParamSpec::piece and ParamSpec::split, models/param_split.h): the
// whole parameter's shape and where this rank's piece sits in it.
//
// Their rules read quantities of the whole tensor — Lamb's ‖θ‖ and ‖u‖, Adafactor's RMS and its row
// and column means, Muon's whole matrix — and a tensor-parallel rank holds a piece of it (on top of
// ZeRO's cut of that piece across the data-parallel ranks). So the pieces' partial sums, already
// summed over the data-parallel ranks (OptimizerPartition::all_reduce_sum), are summed over the
// tensor-parallel group too (OptimizerPartition::tensor_parallel_sum; sum_cut_values below), and
// Muon gathers the whole matrix from the group's pieces (gather_whole_matrix). A replicated
// parameter (a norm weight, a row-parallel bias) is whole on every rank of the group, with the same
// values and gradient: its sums are not added over the group (that would count it once per rank).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "models/layer.h"
#include "models/param_split.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

struct TensorCut {
  bool cut = false;  // this rank holds a tensor-parallel piece of the parameter (false: the tensor is whole here)
  std::string name;
  ParamSplit split;
  int rank = 0, ranks = 1;
  Shape whole;  // the whole parameter's shape (= piece when not cut)
  Shape piece;  // this rank's
  // Cut: the whole parameter's index along the cut dimension of each index of the piece along it
  // (the rank's ranges of models/param_split.h, packed in part order).
  std::vector<std::int64_t> whole_index;

  // Element e of the piece (row-major) as (row, column) of the whole tensor, a matrix or a vector
  // (one row). Not for a 3-D stack cut along dim 0 (experts), which Adafactor refuses before.
  // Inline: the per-element loops of Adafactor call it.
  std::pair<std::int64_t, std::int64_t> whole_row_col(std::int64_t e) const {
    const std::int64_t cols = piece.rank == 0 ? 1 : piece[piece.rank - 1];
    std::int64_t row = cols == 0 ? 0 : e / cols, col = cols == 0 ? 0 : e % cols;
    if (cut) {
      if (cut_last) col = whole_index[static_cast<std::size_t>(col)];
      else row = whole_index[static_cast<std::size_t>(row)];
    }
    return {row, col};
  }
  bool cut_last = false;  // cut: the cut dimension is the last one (columns, or a vector's only one); else rows of a matrix
};

// The cut of an owned parameter's spec (cut false for a whole or replicated one).
TensorCut tensor_cut_of(const ParamSpec& spec);

// Error naming the fix when some tensor was cut for another tensor-parallel group than the
// partition's (the layers built for one mesh, the engine run on another); `optimizer` names the rule.
void check_cut_fits(const OptimizerPartition& partition, const TensorCut& cut, const char* optimizer);
void check_cuts_fit(const OptimizerPartition& partition, std::span<const TensorCut> cuts, const char* optimizer);

// A run of per-tensor values: values[offset, offset + count).
struct ValueRange {
  std::size_t offset = 0, count = 0;
};

// Adds the tensor-parallel group's partial sums to `ranges` of `values` (the values of cut
// tensors; the caller lists each cut tensor's, every rank of the group the same list), in one
// fp64 all-reduce of those values only. Call it after the data-parallel sum. Collective over the
// tensor-parallel group; nothing with one tensor-parallel rank or an empty list.
void sum_cut_values(OptimizerPartition& partition, std::span<double> values, std::span<const ValueRange> ranges);

// The whole matrix of cut tensor `cut` (fp32, whole.numel() elements) from every tensor-parallel
// rank's `piece` (piece.numel() elements): one all-gather over the group, the pieces in slots of the
// largest. Collective over the tensor-parallel group.
void gather_whole_matrix(OptimizerPartition& partition, const TensorCut& cut, std::span<const float> piece, std::span<float> whole);

}  // namespace dstrain
