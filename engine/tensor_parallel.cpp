#include "engine/tensor_parallel.h"

#include "engine/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "models/param_split.h"
#include "ops/buffer.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

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

void check_layers_fit_group(const std::vector<const Layer*>& layers, int ranks, PieceGroup group) {
  const bool experts = group == PieceGroup::expert_parallel;
  const char* what = experts ? "expert-parallel" : "tensor-parallel";
  // The make_model call that builds a rank's layers for the group.
  const std::string fix = experts ? fmt::format("make_model(architecture, tp, sp, {{rank, {}}})", ranks)
                                  : fmt::format("make_model(architecture, {{rank, {}}})", ranks);
  bool any_piece = false;
  for (const Layer* layer : layers) {
    for (const ParamSpec& p : layer->params()) {
      if (!(experts ? is_expert_piece(p) : is_tensor_piece(p))) continue;
      any_piece = true;
      if (p.piece.ranks != ranks)
        fail("initialize: parameter '{}' was built for {} {} ranks but the engine's {} group has {}; build the model with {}", p.name, p.piece.ranks,
             what, what, ranks, fix);
    }
  }
  if (ranks > 1 && !any_piece) {
    fail("initialize: the engine has {} {} group of {} ranks but the model's layers hold {}; build the model with {}", experts ? "an" : "a", what, ranks,
         experts ? "every expert whole" : "whole parameters", fix);
  }
}

void all_reduce_host(Communicator& comm, const Tensor& values, ReduceOp op, Allocator* staging) {
  if (staging == nullptr) {
    comm.all_reduce(values, op);  // host memory: complete on return (local, mpi)
    return;
  }
  const Buffer buf(*staging, values.nbytes(), MemoryPurpose::buffers);
  const Tensor t = buf.tensor(values.dtype, values.shape);
  copy_tensor(t, values);
  comm.all_reduce(t, op);
  // The copy back (and the buffer's next user) after the collective; the host waits for it within
  // the communicator's timeout, so a dead peer is an Error, not a hang in the copy.
  comm.order_compute_after_collectives();
  comm.synchronize();
  copy_tensor(values, t);
}

void gather_whole(Communicator& tp, const ParamSpec& spec, const Tensor& piece, const Tensor& whole, Allocator* staging) {
  const int W = tp.world_size();
  const Shape full = spec.whole_shape();
  if (whole.dtype != DType::fp32 || piece.dtype != DType::fp32 || whole.numel() != full.numel()) {
    fail("gather_whole: parameter '{}': a host fp32 piece and whole of {} elements are needed, got {} and {}", spec.name, full.numel(), piece.str(),
         whole.str());
  }
  if (!spec.is_piece()) {
    if (whole.numel() > 0) std::memcpy(whole.data, piece.data, static_cast<std::size_t>(whole.numel()) * sizeof(float));
    return;
  }
  // Pieces may differ in size (uneven splits): each travels in a slot of the largest size.
  const std::int64_t slot = piece_slot_numel(spec.split, full, W, spec.name);
  std::vector<float> send(static_cast<std::size_t>(slot), 0.0f), recv(static_cast<std::size_t>(slot) * static_cast<std::size_t>(W), 0.0f);
  if (piece.numel() > 0) std::memcpy(send.data(), piece.data, static_cast<std::size_t>(piece.numel()) * sizeof(float));  // a rank may hold none
  const Tensor host_send(send.data(), DType::fp32, Shape{slot}), host_recv(recv.data(), DType::fp32, Shape{slot * W});
  if (staging == nullptr) {
    tp.all_gather(host_send, host_recv);
  } else if (slot > 0) {
    // Through device memory (the group's backend communicates it), as all_reduce_host.
    const Buffer dev_send(*staging, static_cast<std::size_t>(slot) * sizeof(float), MemoryPurpose::buffers);
    const Buffer dev_recv(*staging, static_cast<std::size_t>(slot * W) * sizeof(float), MemoryPurpose::buffers);
    const Tensor ds = dev_send.tensor(DType::fp32, Shape{slot}), dr = dev_recv.tensor(DType::fp32, Shape{slot * W});
    copy_tensor(ds, host_send);
    tp.all_gather(ds, dr);
    tp.order_compute_after_collectives();
    tp.synchronize();
    copy_tensor(host_recv, dr);
  }
  assemble_whole(host_recv, slot, Tensor(whole.data, DType::fp32, full), spec.split, W, spec.name);
}

}  // namespace dstrain
