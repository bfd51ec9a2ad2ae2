#include "engine/optim/tensor_cut.h"

#include <algorithm>

#include "ops/error.h"

namespace dstrain {

TensorCut tensor_cut_of(const ParamSpec& spec) {
  TensorCut c;
  c.cut = spec.is_piece();
  c.name = spec.name;
  c.split = spec.split;
  c.whole = spec.whole_shape();
  c.piece = spec.shape;
  if (!c.cut) return c;
  c.rank = spec.piece.rank;
  c.ranks = spec.piece.ranks;
  for (const SplitRange& r : split_ranges(c.split, c.whole, c.ranks, c.rank, c.name))
    for (std::int64_t i = 0; i < r.size; ++i) c.whole_index.push_back(r.begin + i);
  c.cut_last = c.split.dim() == c.piece.rank - 1;
  return c;
}

void check_cut_fits(const OptimizerPartition& partition, const TensorCut& c, const char* optimizer) {
  const int ranks = partition.tensor_parallel_size();
  if (c.cut && (c.ranks != ranks || c.rank != partition.tensor_parallel_rank())) {
    fail("{}: parameter '{}' is tensor-parallel rank {}'s piece of {} but the optimizer's partition is rank {} of a tensor-parallel group of {}; "
         "build the model's layers for the mesh the engine runs on (make_model(architecture, {{rank, {}}}))",
         optimizer, c.name, c.rank, c.ranks, partition.tensor_parallel_rank(), ranks, ranks);
  }
}

void check_cuts_fit(const OptimizerPartition& partition, std::span<const TensorCut> cuts, const char* optimizer) {
  for (const TensorCut& c : cuts) check_cut_fits(partition, c, optimizer);
}

void sum_cut_values(OptimizerPartition& partition, std::span<double> values, std::span<const ValueRange> ranges) {
  if (partition.tensor_parallel_size() <= 1 || ranges.empty()) return;
  std::vector<double> packed;
  for (const ValueRange& r : ranges) packed.insert(packed.end(), values.begin() + static_cast<std::ptrdiff_t>(r.offset),
                                                   values.begin() + static_cast<std::ptrdiff_t>(r.offset + r.count));
  partition.tensor_parallel_sum(packed);
  std::size_t at = 0;
  for (const ValueRange& r : ranges) {
    std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(at), r.count, values.begin() + static_cast<std::ptrdiff_t>(r.offset));
    at += r.count;
  }
}

void gather_whole_matrix(OptimizerPartition& partition, const TensorCut& cut, std::span<const float> piece, std::span<float> whole) {
  DSTRAIN_CHECK(static_cast<std::int64_t>(piece.size()) == cut.piece.numel() && static_cast<std::int64_t>(whole.size()) == cut.whole.numel(),
                "gather_whole_matrix: '{}': {} and {} elements for a piece {} of {}", cut.name, piece.size(), whole.size(), cut.piece.str(),
                cut.whole.str());
  if (!cut.cut) {
    std::copy(piece.begin(), piece.end(), whole.begin());
    return;
  }
  const int W = cut.ranks;
  const std::int64_t slot = piece_slot_numel(cut.split, cut.whole, W, cut.name);
  std::vector<float> send(static_cast<std::size_t>(slot), 0.0f), recv(static_cast<std::size_t>(slot * W), 0.0f);
  std::copy(piece.begin(), piece.end(), send.begin());
  partition.tensor_parallel_all_gather(send, recv);
  assemble_whole(Tensor(recv.data(), DType::fp32, Shape{slot * W}), slot, Tensor(whole.data(), DType::fp32, cut.whole), cut.split, W, cut.name);
}

}  // namespace dstrain
