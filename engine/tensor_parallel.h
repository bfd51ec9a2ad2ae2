// The engine's side of tensor and sequence parallelism (docs/parallelism.md): the layers' groups
// over the mesh's tensor- and sequence-parallel communicators, and whole parameters from the
// tensor-parallel ranks' pieces.
//
// The layers of a tensor-parallel rank hold pieces of the cut parameters (ParamSpec::piece); ZeRO
// shards, reduces and updates those pieces along the data-parallel axis as if they were whole
// parameters. What needs the whole parameter — the initial values (the same as one rank's), weight
// files, the gradient norm — goes through here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "models/layer.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "ops/allocator.h"
#include "ops/tensor.h"
#include "zero/communicator.h"
#include "zero/optimizer_partition.h"

namespace dstrain {

// TensorParallelGroup over a Communicator: sum and max are its all_reduce, all_gather and
// reduce_scatter its own, on the layers' tensors
// in place (device memory on a GPU: what NCCL and the local backend on a GPU communicate). The
// layer reads the result next, so the compute queued after the call is ordered after the
// collective (NCCL runs it on a stream of its own; a no-op for backends that complete in order).
class CommunicatorTensorGroup final : public TensorParallelGroup {
 public:
  explicit CommunicatorTensorGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  void sum(Tensor buf) override {
    comm_.all_reduce(buf, ReduceOp::sum);
    comm_.order_compute_after_collectives();
  }
  void max(Tensor buf) override {
    comm_.all_reduce(buf, ReduceOp::max);
    comm_.order_compute_after_collectives();
  }
  void all_gather(Tensor local, Tensor whole) override {
    comm_.all_gather(local, whole);
    comm_.order_compute_after_collectives();
  }
  void reduce_scatter(Tensor whole, Tensor local) override {
    comm_.reduce_scatter(whole, local, ReduceOp::sum);
    comm_.order_compute_after_collectives();
  }

 private:
  Communicator& comm_;
};

// SequenceParallelGroup over a Communicator: all_to_all is its all_to_all.
class CommunicatorSequenceGroup final : public SequenceParallelGroup {
 public:
  explicit CommunicatorSequenceGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  void all_to_all(Tensor send, Tensor recv) override {
    comm_.all_to_all(send, recv);
    comm_.order_compute_after_collectives();  // the layer reads recv next (NCCL: a stream of its own)
  }

 private:
  Communicator& comm_;
};

// Collective over `comm`: host `values` reduced in place, complete on return. `staging`: the
// training device's allocator when the group communicates device memory (a GPU run: NCCL cannot
// read host memory), and the values travel through a buffer from it; nullptr: in place on the host.
void all_reduce_host(Communicator& comm, const Tensor& values, ReduceOp op, Allocator* staging);

// The optimizer's view of a tensor-parallel rank's partition (zero/optimizer_partition.h): the ZeRO
// partition of its pieces along the data-parallel group (`inner`), and the tensor-parallel group
// `tp`, over which Lamb, Muon and Adafactor add the pieces' partial sums and gather Muon's whole
// matrices (engine/optim/tensor_cut.h). Host values: tensor parallelism trains on the CPU in this
// build (check_tensor_parallel_engine).
class TensorParallelPartition final : public OptimizerPartition {
 public:
  TensorParallelPartition(OptimizerPartition& inner, Communicator& tp) : inner_(inner), tp_(tp) {}
  void for_each_subgroup(const std::function<void(std::span<const OptimizerSegment>)>& fn) override { inner_.for_each_subgroup(fn); }
  void all_reduce_sum(std::span<double> values) override { inner_.all_reduce_sum(values); }
  void all_reduce_sum(std::span<float> values) override { inner_.all_reduce_sum(values); }
  std::int32_t tensor_count() const override { return inner_.tensor_count(); }
  int tensor_parallel_size() const override { return tp_.world_size(); }
  int tensor_parallel_rank() const override { return tp_.rank(); }
  void tensor_parallel_sum(std::span<double> values) override;
  void tensor_parallel_all_gather(std::span<const float> send, std::span<float> recv) override;

 private:
  OptimizerPartition& inner_;
  Communicator& tp_;
};

// The spec of the whole parameter a piece belongs to (shape = the whole shape, piece cleared).
ParamSpec whole_spec(const ParamSpec& spec);

// Error naming the fix when `layers` were not built for a tensor-parallel group of `ranks` ranks:
// a piece built for another size, or a group of several ranks and no piece at all.
// The group a piece is cut across: tensor-parallel (rows, columns, vocabulary) or expert-parallel
// (an expert stack, engine/expert_parallel.h).
enum class PieceGroup { tensor_parallel, expert_parallel };
void check_layers_fit_group(const std::vector<const Layer*>& layers, int ranks, PieceGroup group = PieceGroup::tensor_parallel);

// Collective over `tp` (every rank, the same parameters in the same order): the whole fp32 value of
// a parameter whose piece (fp32, host) this rank holds, assembled from every rank's piece.
// `whole` (host fp32, the whole shape) is written. `staging` as in all_reduce_host: the pieces are
// all-gathered through device buffers from it when the group communicates device memory.
void gather_whole(Communicator& tp, const ParamSpec& spec, const Tensor& piece, const Tensor& whole, Allocator* staging = nullptr);

}  // namespace dstrain
