// The engine's side of tensor and sequence parallelism (docs/parallelism.md): the layers' groups
// over the mesh's tensor- and sequence-parallel communicators, and whole parameters from the
// tensor-parallel ranks' pieces.
//
// The layers of a tensor-parallel rank hold pieces of the cut parameters (ParamSpec::piece); ZeRO
// shards, reduces and updates those pieces along the data-parallel axis as if they were whole
// parameters. What needs the whole parameter — the initial values (the same as one rank's), weight
// files, the gradient norm — goes through here.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "models/layer.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "ops/tensor.h"
#include "zero/communicator.h"

namespace dstrain {

// TensorParallelGroup over a Communicator: sum and max are its all_reduce.
class CommunicatorTensorGroup final : public TensorParallelGroup {
 public:
  explicit CommunicatorTensorGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  void sum(Tensor buf) override { comm_.all_reduce(buf, ReduceOp::sum); }
  void max(Tensor buf) override { comm_.all_reduce(buf, ReduceOp::max); }

 private:
  Communicator& comm_;
};

// SequenceParallelGroup over a Communicator: all_to_all is its all_to_all.
class CommunicatorSequenceGroup final : public SequenceParallelGroup {
 public:
  explicit CommunicatorSequenceGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  void all_to_all(Tensor send, Tensor recv) override { comm_.all_to_all(send, recv); }

 private:
  Communicator& comm_;
};

// The spec of the whole parameter a piece belongs to (shape = the whole shape, piece cleared).
ParamSpec whole_spec(const ParamSpec& spec);

// Error naming the fix when `layers` were not built for a tensor-parallel group of `ranks` ranks:
// a piece built for another size, or a group of several ranks and no piece at all.
void check_layers_fit_group(const std::vector<const Layer*>& layers, int ranks);

// Collective over `tp` (every rank, the same parameters in the same order): the whole fp32 value of
// a parameter whose piece (fp32, host) this rank holds, assembled from every rank's piece.
// `whole` (host fp32, the whole shape) is written.
void gather_whole(Communicator& tp, const ParamSpec& spec, const Tensor& piece, const Tensor& whole);

}  // namespace dstrain
