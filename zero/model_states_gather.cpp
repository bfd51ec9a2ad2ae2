// ModelStates' stage-3 gathers (zero/model_states.h): a partitioned unit's whole params gathered
// for a call — from the partition (plain, qwZ's int8, MiCS's two-level gather) or from hpZ's
// secondary shards — waited for and freed, as the ParamCoordinator schedules them
// (zero/param_coordinator.h, docs/zero.md §5, §10).
#include <utility>
#include <vector>

#include "ops/kernels/tensor_ops.h"
#include "zero/model_states_units.h"

namespace dstrain {

void ModelStates::gather_layer(std::size_t j) {
  for (const std::size_t u : unit_ids(j))
    if (units_[u]->partitioned) gather_unit(*units_[u]);
}

// All-gathers a partitioned unit's whole params over its group into `gathered`: from the
// partition (int8-quantized with qwZ, through the nodes with MiCS's hierarchical gather), or, with
// hpZ once this training pass has gathered the unit, from the secondary shards within the h ranks.
void ModelStates::gather_unit(Unit& u) {
  const FlatLayout& lo = u.layout;
  u.gathered = Buffer(alloc_, static_cast<std::size_t>(lo.numel) * dtype_size(s_.storage), MemoryPurpose::params);
  const bool zeropp = !u.expert && u.world > 1;
  if (zeropp && hpz_ && u.secondary_valid) {
    const int h = hpz_->world_size();
    std::vector<std::pair<Tensor, Tensor>> parts;  // (this rank's secondary piece, the chunk)
    for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
      const FlatRange c = lo.chunk_range(k);
      parts.emplace_back(region(secondary_, s_.storage, u.secondary_begin + c.begin / h, c.size() / h), region(u.gathered, s_.storage, c.begin, c.size()));
    }
    u.gather_ticket = queue_->submit([comm = hpz_.get(), parts = std::move(parts)] {
      for (const auto& [send, recv] : parts) comm->all_gather(send, recv);
    });
    return;
  }
  // This rank's shard: in place where it is in the training device's memory; otherwise fetched from
  // the parameter store (offload_param: host memory, or read from NVMe unless prefetched) into a
  // transient buffer the collective sends from.
  Tensor shard = param_store_->in_place(u.store_unit);
  if (shard.empty() || shard.device != alloc_.device()) {
    u.fetched = Buffer(alloc_, static_cast<std::size_t>(lo.shard_numel()) * dtype_size(s_.storage), MemoryPurpose::params);
    const Tensor fetched = u.fetched.tensor(s_.storage, Shape{lo.shard_numel()});
    const Tensor home = param_store_->acquire(u.store_unit);
    if (copies_ && home.device.is_cpu()) {
      // Host to GPU on the copy stream. The host waits for the copy before the unit goes back to
      // its store, whose NVMe buffers are few and are reused at once (docs/offload.md §12); the
      // all-gather, issued after that wait, then runs after the copy without a device-side wait.
      copies_->wait_host(copies_->to_device(fetched, home));
    } else {
      copy_tensor(fetched, home);
    }
    param_store_->release(u.store_unit, false);
    shard = fetched;
  }
  struct Part {
    Tensor send, recv, secondary;  // this rank's shard piece, the chunk in the gathered buffer, its hpZ share
  };
  std::vector<Part> parts;
  const bool fill_secondary = zeropp && hpz_ && training_pass_;
  for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
    const FlatRange c = lo.chunk_range(k);
    Part p{shard.slice_rows(lo.shard_offset(k), lo.shard_offset(k) + c.size() / lo.world), region(u.gathered, s_.storage, c.begin, c.size()), {}};
    if (fill_secondary) p.secondary = region(secondary_, s_.storage, u.secondary_begin + c.begin / hpz_->world_size(), c.size() / hpz_->world_size());
    parts.push_back(p);
  }
  u.secondary_valid = fill_secondary;
  Communicator* comm = u.world > 1 ? u.comm : nullptr;
  const bool quantized = zeropp && s_.quantized_weights;
  const NodeSplit* hierarchical = zeropp && s_.mics_hierarchical_gather ? nodes_.get() : nullptr;
  const int hpz_rank = hpz_ ? hpz_->rank() : 0;
  u.gather_ticket = queue_->submit([comm, parts = std::move(parts), quantized, hierarchical, hpz_rank, scratch = &alloc_] {
    for (const Part& p : parts) {
      if (comm == nullptr) {
        copy_tensor(p.recv, p.send);
        continue;
      }
      if (quantized) {
        quantized_all_gather(*comm, p.send, p.recv, *scratch);
      } else if (hierarchical != nullptr) {
        hierarchical_all_gather(*hierarchical, p.send, p.recv, *scratch);
      } else {
        comm->all_gather(p.send, p.recv);
      }
      if (!p.secondary.empty()) {
        // hpZ: keep this rank's 1/h of the weights just gathered (dequantized, with qwZ: the
        // backward then computes with exactly the forward's weights).
        comm->order_compute_after_collectives();
        const std::int64_t m = p.secondary.numel();
        copy_tensor(p.secondary, p.recv.view(Shape{p.recv.numel()}).slice_rows(hpz_rank * m, (hpz_rank + 1) * m));
      }
    }
  });
}

void ModelStates::wait_layer(std::size_t j) {
  for (const std::size_t u : unit_ids(j))
    if (units_[u]->partitioned) wait(units_[u]->gather_ticket);
}

void ModelStates::free_layer(std::size_t j) {
  for (const std::size_t u : unit_ids(j))
    if (units_[u]->partitioned) free_unit(*units_[u]);
}

void ModelStates::free_unit(Unit& u) {
  wait(u.gather_ticket);
  u.gathered.reset();
  u.fetched.reset();
}

void ModelStates::acquire_all() {
  if (s_.stage != 3) return;
  if (coordinator_) coordinator_->end_pass();
  training_pass_ = false;
  for (const auto& u : units_)
    if (u->partitioned && u->gathered.empty()) gather_unit(*u);
  drain();
  all_acquired_ = true;
}

}  // namespace dstrain
