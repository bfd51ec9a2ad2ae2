// Expert parallelism as a model sees it (docs/parallelism.md, docs/models.md §8.6): a family
// builds the sparse layers of one expert-parallel rank — each stacked expert parameter
// (ParamSplit::experts) reduced to the rank's E/EP whole experts, everything else whole — and those
// layers move their tokens to and from the experts' ranks through ExpertParallelGroup, which the
// engine provides over a Communicator (the expert-parallel group of the device mesh). Models sit
// below the communicators (docs/design.md), so they name only what they call: the routing counts'
// exchange and the variable all-to-all.
//
// The ranks of an expert-parallel group are data-parallel ranks: each has its own micro-batch.
// Rank r holds experts [r·E/EP, (r+1)·E/EP) (E % EP == 0 is required). A sparse layer routes its
// own tokens over all E experts as without expert parallelism, sends each expert's rows to the
// expert's rank, runs its local experts over the rows every rank sent it, and sends the outputs
// back (models/moe_mlp.h has the steps).
//
// What the engine must do for it:
//   - the expert weights' gradients leave backward scaled by 1/EP (the layer folds it into the
//     weight-gradient GEMMs): a rank's expert gradient sums the contributions of its EP peers'
//     tokens, each formed with its own rank's loss scale, while the objective is the mean over all
//     data-parallel ranks. Averaging the expert gradients over the expert-data-parallel group
//     (the DP/EP ranks that hold the same experts) then gives exactly the gradient of EP = 1
//     averaged over all DP ranks. Every other parameter is averaged over all DP ranks as usual.
//   - every rank of the group runs every sparse layer's forward and backward, in the same order
//     (the layers' exchanges are collectives of the group), a rank with no tokens for a peer too.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/layer.h"
#include "ops/tensor.h"

namespace dstrain {

// Which expert-parallel rank the layers are built for.
struct ExpertParallelRank {
  int rank = 0;
  int ranks = 1;
  bool active() const { return ranks > 1; }
};

// The collectives of an expert-parallel group. Every rank of the group calls them in the same order.
class ExpertParallelGroup {  // the engine implements it over a Communicator
 public:
  virtual ~ExpertParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // send_counts: size()·n values, n per destination rank in rank order; returns size()·n: the n
  // values each source rank sent to this rank, in source order.
  virtual std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t> send_counts, std::int64_t n) = 0;
  // MPI_Alltoallv semantics in elements of the tensors' dtype: send holds size() blocks in rank
  // order (send_counts[j] elements for rank j); recv gets block i (recv_counts[i]) from rank i;
  // offsets are prefix sums. The compute queued after it is ordered after it.
  virtual void all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv, std::span<const std::int64_t> recv_counts) = 0;
};

// `whole` as expert-parallel rank ep.rank's piece when it is a stack of experts
// (ParamSplit::experts): its E/EP experts, ParamSpec::piece set to {whole shape, ep.rank, ep.ranks}.
// Any other spec, or ep.ranks == 1, comes back unchanged (tensor parallelism never cuts experts).
ParamSpec expert_piece_spec(ParamSpec whole, ExpertParallelRank ep);

// The group a layer built for `ep` was handed, checked: an Error naming the layer when it is
// missing or does not match the build (a driver that forgot ForwardArgs::expert_parallel).
ExpertParallelGroup& expert_layer_group(ExpertParallelGroup* group, ExpertParallelRank ep, const std::string& layer);

// Error naming `key` (the config key that gives E, e.g. "num_local_experts") when `ranks`
// expert-parallel ranks cannot split E experts: ranks < 1, or E % ranks != 0 (it names the sizes
// that divide E).
void check_expert_split(std::int64_t experts, int ranks, const std::string& key);

}  // namespace dstrain
