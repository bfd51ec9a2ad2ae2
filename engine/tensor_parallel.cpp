#include "engine/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "models/param_split.h"
#include "ops/error.h"

namespace dstrain {

void TensorParallelPartition::tensor_parallel_sum(std::span<double> values) {
  if (values.empty()) return;
  tp_.all_reduce(Tensor(values.data(), DType::fp64, Shape{static_cast<std::int64_t>(values.size())}), ReduceOp::sum);
}

void TensorParallelPartition::tensor_parallel_all_gather(std::span<const float> send, std::span<float> recv) {
  const auto n = static_cast<std::int64_t>(send.size());
  if (static_cast<std::int64_t>(recv.size()) != n * tp_.world_size())
    fail("tensor_parallel_all_gather: {} elements received for {} sent by each of {} ranks", recv.size(), n, tp_.world_size());
  tp_.all_gather(Tensor(const_cast<float*>(send.data()), DType::fp32, Shape{n}), Tensor(recv.data(), DType::fp32, Shape{n * tp_.world_size()}));
}

ParamSpec whole_spec(const ParamSpec& spec) {
  ParamSpec w = spec;
  w.shape = spec.whole_shape();
  w.piece = ParamPiece{};
  return w;
}

void check_layers_fit_group(const std::vector<const Layer*>& layers, int ranks) {
  bool any_piece = false;
  for (const Layer* layer : layers) {
    for (const ParamSpec& p : layer->params()) {
      if (!p.is_piece()) continue;
      any_piece = true;
      if (p.piece.ranks != ranks) {
        fail("initialize: parameter '{}' was built for {} tensor-parallel ranks but the engine's tensor-parallel group has {}; build the model with "
             "make_model(architecture, {{rank, {}}})",
             p.name, p.piece.ranks, ranks, ranks);
      }
    }
  }
  if (ranks > 1 && !any_piece) {
    fail("initialize: the engine has a tensor-parallel group of {} ranks but the model's layers hold whole parameters; build the model with "
         "make_model(architecture, {{rank, {}}})",
         ranks, ranks);
  }
}

void gather_whole(Communicator& tp, const ParamSpec& spec, const Tensor& piece, const Tensor& whole) {
  const int W = tp.world_size();
  const Shape full = spec.whole_shape();
  if (whole.dtype != DType::fp32 || piece.dtype != DType::fp32 || whole.numel() != full.numel()) {
    fail("gather_whole: parameter '{}': a host fp32 piece and whole of {} elements are needed, got {} and {}", spec.name, full.numel(), piece.str(),
         whole.str());
  }
  if (!spec.is_piece()) {
    std::memcpy(whole.data, piece.data, static_cast<std::size_t>(whole.numel()) * sizeof(float));
    return;
  }
  // Pieces may differ in size (uneven splits): each travels in a slot of the largest size.
  const std::int64_t slot = piece_slot_numel(spec.split, full, W, spec.name);
  std::vector<float> send(static_cast<std::size_t>(slot), 0.0f), recv(static_cast<std::size_t>(slot) * static_cast<std::size_t>(W), 0.0f);
  std::memcpy(send.data(), piece.data, static_cast<std::size_t>(piece.numel()) * sizeof(float));
  tp.all_gather(Tensor(send.data(), DType::fp32, Shape{slot}), Tensor(recv.data(), DType::fp32, Shape{slot * W}));
  assemble_whole(Tensor(recv.data(), DType::fp32, Shape{slot * W}), slot, Tensor(whole.data, DType::fp32, full), spec.split, W, spec.name);
}

}  // namespace dstrain
