// The engine's side of expert parallelism (docs/parallelism.md §8): the MoE layers' group over the
// mesh's expert-parallel communicator, which parameters are an expert-parallel rank's pieces, and
// what the engine refuses before step 1.
//
// An expert-parallel rank holds E/EP whole experts of every sparse layer (ParamSpec::piece of a
// ParamSplit::experts stack); everything else is whole on every rank. ZeRO shards, reduces and
// gathers those pieces over the expert-data-parallel group (ModelStates' expert unit,
// zero/model_states.h) and the rest over the data group. What needs a whole expert stack — weight
// files, the full parameter of a consolidation — gathers the pieces over the expert-parallel group
// here, as tensor parallelism gathers its pieces over its group.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "config_schema/ds_config.h"
#include "models/expert_parallel.h"
#include "models/layer.h"
#include "ops/allocator.h"
#include "ops/buffer.h"
#include "ops/device.h"
#include "zero/communicator.h"

namespace dstrain {

// ExpertParallelGroup over a Communicator: the layers' token exchange (all_to_all_v) and its counts.
// `staging` (the training device's allocator on a GPU, else nullptr) carries exchange_counts' n > 1
// values through device memory where the backend needs it.
class CommunicatorExpertGroup final : public ExpertParallelGroup {
 public:
  CommunicatorExpertGroup(Communicator& comm, Allocator* staging) : comm_(comm), staging_(staging) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.world_size(); }
  std::vector<std::int64_t> exchange_counts(std::span<const std::int64_t> send_counts, std::int64_t n) override;
  void all_to_all_v(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv, std::span<const std::int64_t> recv_counts) override;

 private:
  Communicator& comm_;
  Allocator* staging_;
  Buffer staging_buffer_;  // exchange_counts' device copies (n > 1, a device group)
};

// An expert-parallel rank's piece of a stack of experts: cut across the expert-parallel group (not
// the tensor-parallel one, which keeps experts whole).
inline bool is_expert_piece(const ParamSpec& spec) { return spec.is_piece() && spec.split.kind == SplitKind::experts; }
// A tensor-parallel rank's piece of a cut parameter.
inline bool is_tensor_piece(const ParamSpec& spec) { return spec.is_piece() && spec.split.kind != SplitKind::experts; }

// The expert-parallel size of EngineOptions' groups (1 without them): Error when only one of the two
// is given, or when EP x the expert-data group's ranks is not the data group's. (Whether the layers
// were built for it: check_layers_fit_group(..., PieceGroup::expert_parallel), engine/tensor_parallel.h.)
int check_expert_groups(Communicator* expert_parallel, Communicator* expert_data, Communicator* data);

// Error naming the key and the fix when the engine cannot train `config` with `ep_ranks`
// expert-parallel ranks on `device` over groups of backend `ep_backend`: optimizers whose rule reads
// each tensor whole (Lamb, Muon, Adafactor) or compresses the exchange (the 1-bit family) — the
// expert stacks are pieces on different ranks and those rules would see only a rank's experts; a
// backend that cannot move the device's memory (mpi on a GPU, nccl on the CPU).
void check_expert_parallel_engine(const config::DsConfig& config, const Device& device, int ep_ranks, std::string_view ep_backend);

}  // namespace dstrain
