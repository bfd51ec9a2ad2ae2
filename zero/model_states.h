// ModelStates: a model's parameters, gradients and optimizer states, held as ZeRO stage 0-3 says,
// on one rank of a data-parallel group, and the collectives that keep them consistent.
//
// Layout (zero/flat_layout.h): each layer's owned parameters are packed into flat buffers that
// split evenly across the W ranks; layer regions sit back to back in one model-wide buffer per
// kind. Parameters are views into these buffers and every collective reads and writes them in
// place. Per rank, with Ψ = the model's (padded) parameter elements, s = storage bytes (4 fp32,
// 2 fp16/bf16), masters fp32 only under fp16/bf16:
//
//   stage  params (s)        grads (s)              optimizer partition (fp32)   collectives per step
//   0      Ψ                 Ψ                      Ψ·B                          all-reduce grads (buckets)
//   1      Ψ                 Ψ                      Ψ·B/W                        reduce-scatter grads, all-gather params
//   2      Ψ                 Ψ/W (+ one layer's     Ψ·B/W                        reduce-scatter per layer in backward,
//                            full grads, transient)                              all-gather params
//   3      Ψ/W (+ gathered   Ψ/W (+ transient)      Ψ·B/W                        all-gather before forward and
//          layers)                                                               backward, reduce-scatter grads
//
// B, the optimizer partition's fp32 buffers: the optimizer's declared states (Adam 2, SGD with
// momentum 1, ...) plus 1 for the masters when they are kept apart from the params (fp16 / bf16, or
// a partition that is not on the training device). The partition lives in a StateStore
// (zero/state_store.h) on the device, in host memory or on NVMe, and the optimizer visits it one
// sub-group at a time (for_each_subgroup; docs/training_state.md).
//
// Stage 3 layers with fewer than param_persistence_threshold parameters keep them whole on every
// rank (they are all-gathered after each step, as stages 1-2 do); the rest are gathered per call
// by a ParamCoordinator (prefetch, max live, reuse distance; zero/param_coordinator.h). Gradients
// are averaged over the ranks (ReduceOp::avg), so every stage computes d(mean loss over the global
// batch). Collectives run through a CommQueue: with overlap_comm on a worker thread, overlapping
// the backward (and stage 3's prefetch) with compute.
//
// Expert parallelism (MoE; docs/parallelism.md): with an `expert_comm`, each layer's owned
// parameters split in two flat units. The primary unit holds the parameters replicated over the
// whole data-parallel group `comm` (W ranks), as above. The expert unit holds the specs with
// split.kind == SplitKind::experts: a rank holds only its own experts' slice, replicated over the
// expert-data-parallel group `expert_comm` (W_e ranks, a subset of comm's; e.g. W 4, EP 2: rank 0's
// expert_comm is {0, 2}, rank 1's {1, 3}), so that unit has its own FlatLayout for W_e ranks and is
// partitioned, reduced (avg: divided by W_e), stage-3 gathered (its own persistence decision) and
// all-gathered after the step over expert_comm. A layer without expert specs has no expert unit;
// one with only expert specs has an empty primary unit. Every public method below covers both
// units under the engine's layer index (views in params() order, partitions() and owned_pieces()
// in this rank's one shard space, primary unit before expert unit in each layer); layout(i) is
// the primary unit's, slots(i) / expert_layout(i) show both.
//
// The step's sums (all_reduce_sum: norm², overflow count, loss; the per-tensor optimizers' partial
// sums) stay over `comm`. At stages 1-3 every element of the model lies in exactly one partition
// among comm's ranks: primary shards are disjoint over comm, expert shards disjoint over each
// expert_comm, and the expert groups' ranks in different expert-parallel positions hold different
// experts. So the sum over comm of each rank's partition norm² is the global norm². Two caveats for
// callers: at stage 0 a partition is not split, so a rank counts its primary segments only where
// comm's rank is 0 and its expert segments (PartitionSegment::expert) only where expert_comm's rank
// is 0; and a per-tensor sum (Lamb's trust ratio, Muon's gathers) of an expert tensor over comm adds
// the same tensor index of different experts: such a tensor needs its sum over expert_comm instead.
//
// The hooks follow the engine's step loop (docs/design.md "The step, as data flows"):
//   begin_pass(train)                       once per micro-step (or evaluation)
//   acquire(i) ... layer call ... release(i)   around every forward, recompute and backward call
//   before_backward(i) / after_backward(i)  around layer i's backward
//   end_backward()                          after the last layer's backward: waits for every
//                                           reduction and releases gathered params
//   for_each_subgroup(): the optimizer's work (OptimizerPartition); after_update(): the post-step
//   all-gather; zero_grads().
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ops/allocator.h"
#include "ops/kernels/copy_stream.h"
#include "ops/buffer.h"
#include "models/layer.h"
#include "zero/comm_queue.h"
#include "zero/communicator.h"
#include "zero/flat_layout.h"
#include "zero/optimizer_partition.h"
#include "zero/gradient_reduction.h"
#include "zero/param_coordinator.h"
#include "zero/param_store.h"
#include "zero/state_store.h"
#include "zero/zeropp_collectives.h"

namespace dstrain {

struct ZeroSettings {
  int stage = 0;
  DType storage = DType::fp32;  // params and grads as the layers see them
  // The optimizer's per-element fp32 states, by name, in its order (Optimizer::state_names()).
  std::vector<std::string> optimizer_states{};
  // Where the optimizer partition lives, and the store that holds it there (nullptr: a device
  // store on the training allocator; it must then be `device`). A home other than the device keeps
  // the fp32 masters apart from the params even in fp32 training, as DeepSpeed's offload does.
  StateHome optimizer_home = StateHome::device;
  StateStoreFactory store_factory{};
  // Stage 3: where the partitioned layers' storage-dtype shards live (offload_param; docs/offload.md
  // §6), and the store that holds them there (nullptr: a resident store on the training allocator;
  // it must then be `device`). Offloaded params keep the fp32 masters apart from the params, as
  // DeepSpeed's stage 3 always does.
  StateHome param_home = StateHome::device;
  ParamStoreFactory param_store_factory{};
  // Host memory for the staging buffers an offloaded sub-group's grads and params pass through
  // next to a GPU (the engine's host allocator: page-locked, so the copies run asynchronously);
  // nullptr: cpu_allocator().
  Allocator* staging_host = nullptr;
  std::int64_t sub_group_size = 1'000'000'000;  // elements per optimizer sub-group
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;
  // false: gradients are all-reduced and each rank keeps its piece (DeepSpeed's reduce_scatter:
  // false; twice the traffic of the reduce-scatter used by default).
  bool reduce_scatter = true;
  // DeepSpeed's gradient_allreduce_op / prescale_gradients / gradient_predivide_factor /
  // communication_data_type (zero/gradient_reduction.h).
  GradientReduction reduction{};
  std::int64_t prefetch_bucket_size = 50'000'000;
  std::int64_t param_persistence_threshold = 100'000;    // a stage-3 layer with fewer elements stays whole
  std::int64_t model_persistence_threshold = INT64_MAX;  // cap on the elements kept whole that way
  std::int64_t max_live_parameters = 1'000'000'000;
  std::int64_t max_reuse_distance = 1'000'000'000;
  // ZeRO++ and MiCS, stage 3 only (docs/zero.md §10). The group's node layout comes from the
  // communicator (Communicator::node_of).
  bool quantized_weights = false;         // zero_quantized_weights (qwZ): int8 parameter all-gathers
  int hpz_partition_size = 1;             // zero_hpz_partition_size (hpZ): the backward gathers within groups of h ranks
  bool quantized_gradients = false;       // zero_quantized_gradients (qgZ): int4 hierarchical gradient reduce-scatter
  int mics_shard_size = 0;                // mics_shard_size (0: off): shard over groups of s ranks, replicate across them
  bool mics_hierarchical_gather = false;  // mics_hierarchical_params_gather
};

// The ranks of MiCS's shard group (mics_shard_size, or all `data_ranks` without MiCS) and of hpZ's
// groups within it (min(zero_hpz_partition_size, shard), as DeepSpeed's
// _create_zero_param_parallel_group takes them; 1: no hpZ). Error naming the key when a size does
// not divide the ranks it splits: the pre-flight's check and ModelStates' are this one.
struct ZeroppGroupSizes {
  int shard = 1;
  int hpz = 1;
};
ZeroppGroupSizes zeropp_group_sizes(std::int64_t data_ranks, std::int64_t mics_shard_size, std::int64_t hpz_partition_size);

// One contiguous run of this rank's optimizer partition inside one sub-group, with one layer and
// one weight-decay setting. `grads` is the reduced (averaged) gradient in the storage dtype and
// `param` the storage-dtype parameter the layers read, both on the training device; the masters and
// optimizer states are at [shard_offset, shard_offset + numel) of the StateStore's buffers.
struct PartitionSegment {
  std::size_t layer = 0;
  std::size_t group = 0;          // the StateStore sub-group it lies in
  std::int64_t layer_offset = 0;  // the first element's offset in the layer's flat buffer (any split; an expert unit's after the primary's `used`)
  std::int64_t shard_offset = 0;  // ... and in the rank's shard space
  std::int64_t numel = 0;
  Tensor grads, param;             // param empty: it lives in a swapped ParamStore unit (below)
  std::ptrdiff_t param_unit = -1;  // partitioned layers: the ParamStore unit, and the first element's offset in it
  std::int64_t unit_offset = 0;
  bool weight_decay = true;
  std::vector<TensorPiece> pieces;  // with offsets from the segment's start
  bool expert = false;              // in the layer's expert unit: split and reduced over expert_communicator()
};

// One piece of one owned parameter that this rank holds in its optimizer partition: elements
// [tensor_offset, tensor_offset + numel) of the parameter, at shard_offset of the shard space
// (docs/training_state.md §5). Every element of every owned parameter is in exactly one piece of
// exactly one rank (stage 0: the single rank's view covers all); an expert unit's parameters are
// different tensors on each expert-parallel position, each in exactly one piece of one rank of the
// expert_comm that holds it.
struct OwnedPiece {
  std::size_t layer = 0;
  const FlatSlot* slot = nullptr;
  std::int32_t tensor = 0;  // index among the owned parameters, layer order
  std::int64_t tensor_offset = 0;
  std::int64_t numel = 0;
  std::int64_t shard_offset = 0;
};

class ModelStates final : public OptimizerPartition {
 public:
  // specs[i]: layer i's params(); names[i]: its name. comm == nullptr: one rank. Allocates every
  // persistent buffer from `allocator`; params, masters and moments start at zero. expert_comm:
  // the expert-data-parallel group of the expert specs (above); nullptr: none, every owned spec in
  // the primary unit (the layout of a model without expert parallelism).
  ModelStates(std::vector<std::vector<ParamSpec>> specs, std::vector<std::string> names, const ZeroSettings& settings, Communicator* comm,
              Allocator& allocator, Communicator* expert_comm = nullptr);
  ~ModelStates();
  ModelStates(const ModelStates&) = delete;
  ModelStates& operator=(const ModelStates&) = delete;

  int stage() const { return s_.stage; }
  int rank() const;
  int world() const { return world_; }
  // Layer i's primary unit; its expert unit (nullptr when it has none); every owned slot of layer i,
  // primary unit then expert unit.
  const FlatLayout& layout(std::size_t i) const;
  const FlatLayout* expert_layout(std::size_t i) const;
  std::vector<const FlatSlot*> slots(std::size_t i) const;
  // The ParamSpec of an owned slot of layer i (of either unit).
  const ParamSpec& spec(std::size_t i, const FlatSlot& slot) const { return specs_[i][slot.spec]; }

  // ---- the step loop's hooks ----
  // Call traces of a training micro-step and an evaluation (stage 3's schedule).
  void set_traces(std::vector<std::size_t> train, std::vector<std::size_t> eval);
  void begin_pass(bool train);
  void acquire(std::size_t i);
  void release(std::size_t i);
  // Layer i's params (and, during backward, grads) in params() order, tied entries the owner's.
  // Valid between acquire(i) and release(i).
  void views(std::size_t i, std::vector<Tensor>& params, std::vector<Tensor>* grads);
  void before_backward(std::size_t i);
  // Layer i's own gradients are final for this micro-step: reduce them (stage 0/1 only at the
  // gradient-accumulation boundary, stage 2/3 every micro-step).
  void after_backward(std::size_t i, bool boundary);
  void end_backward(bool boundary);
  void end_eval();
  // Stage 0: whether the backward all-reduces the gradients (DeepSpeed's enable_backward_allreduce,
  // default true). The 1-bit optimizers turn it off after their warm-up and communicate the
  // momentum themselves (docs/optimizers_onebit.md); each rank's grads are then its own. Takes
  // effect from the next backward.
  void set_gradient_all_reduce(bool on) { gradient_all_reduce_ = on; }
  bool gradient_all_reduce() const { return gradient_all_reduce_; }
  Communicator* communicator() const { return comm_; }
  Communicator* expert_communicator() const { return expert_comm_; }
  // The collectives of the groups ZeRO++ and MiCS split off the data-parallel group (MiCS's shard
  // and replica groups, hpZ's group, the node split of qgZ and the hierarchical gather), summed:
  // the engine adds them to the data-parallel group's own to report a step's traffic.
  CommStats group_stats() const;
  // MiCS: this rank's index among the ranks holding the same partition (the replica group); 0
  // without MiCS. The step's norm counts each partition once: where this is 0.
  int partition_replica() const { return mics_replica_ ? mics_replica_->rank() : 0; }
  // hpZ: the bytes of this rank's secondary shard of the partitioned layers' 16-bit weights.
  std::uint64_t secondary_param_bytes() const { return secondary_.bytes(); }

  // ---- the optimizer step ----
  // This rank's partition, every segment once, in shard order (the grads the step's norm reads).
  const std::vector<PartitionSegment>& partitions() const { return segments_; }
  // OptimizerPartition: visits the store's sub-groups (prefetch the next, acquire, stage the grads
  // where the store's memory is not the device's, fn, write the params back, release).
  void for_each_subgroup(const std::function<void(std::span<const OptimizerSegment>)>& fn) override;
  void all_reduce_sum(std::span<double> values) override;
  void all_reduce_sum(std::span<float> values) override;
  std::int32_t tensor_count() const override { return tensor_count_; }
  // The optimizer partition's store, and the index of its first optimizer state (1 when buffer 0
  // holds the masters, else 0: the masters are the params).
  StateStore& store() { return *store_; }
  const StateStore& store() const { return *store_; }
  bool masters_apart() const { return masters_apart_; }
  std::size_t first_state_buffer() const { return masters_apart_ ? 1 : 0; }
  // Reads / writes elements [shard_begin, shard_begin + out.numel()) of store buffer `b` through the
  // store (acquire / release per sub-group); `out` / `in` fp32 on any device.
  void read_shard(std::size_t b, std::int64_t shard_begin, const Tensor& out);
  void write_shard(std::size_t b, std::int64_t shard_begin, const Tensor& in);
  // The pieces of owned parameters in this rank's optimizer partition, in shard order.
  const std::vector<OwnedPiece>& owned_pieces() const { return owned_pieces_; }
  // The storage-dtype parameter elements of an owned piece, in place on the training device: where
  // the optimizer writes its update of them (the whole layer's params, or this rank's stage-3
  // shard). A checkpoint saves and restores the 16-bit copies there (docs/training_state.md §5);
  // after writing pieces, after_update() spreads them to the ranks that hold the layer whole.
  // Empty when the piece lives in a swapped ParamStore unit (offload_param "nvme"): read and write
  // it with read_owned_param / write_owned_param, which work for every piece.
  Tensor owned_param(const OwnedPiece& piece) const;
  // Elements [first, first + out.numel()) of the piece into `out`.
  void read_owned_param(const OwnedPiece& piece, const Tensor& out, std::int64_t first = 0);
  // `in` into elements [first, first + in.numel()) of the piece: of the storage dtype, or rounded to it.
  void write_owned_param(const OwnedPiece& piece, const Tensor& in, std::int64_t first = 0);
  // Stage 3: the parameter partition's store (nullptr below stage 3).
  const ParamStore* param_store() const { return param_store_.get(); }
  // The post-step all-gather of the updated parameters (stages 1-2; stage 3's persistent layers).
  void after_update();
  void zero_grads();
  // Sum over the ranks, in place, in order with the other collectives (the step's one small
  // all-reduce of norm², overflow count and loss, in fp64). No-op on one rank.
  void all_reduce_sum(Tensor values);

  // ---- whole parameters ----
  // Collective on every rank: calls fn(layer, slot, value) for every owned parameter with its full
  // fp32 master value (a temporary; a view in place at stage 0).
  void gather_masters(const std::function<void(std::size_t layer, const FlatSlot& slot, const Tensor& fp32)>& fn);
  // Every rank: fill(layer, slot, out) writes parameter `slot`'s full fp32 value into `out`; each rank
  // keeps its part as master and rounds it into the storage-dtype params (collective-free).
  void set_masters(const std::function<void(std::size_t layer, const FlatSlot& slot, const Tensor& fp32)>& fill);
  // Stage 0-2, or a persistent stage-3 layer: the storage-dtype param / grad of a slot, in place.
  // Empty tensor when it is partitioned (stage 3 params, stage 2-3 grads).
  Tensor full_param(std::size_t layer, const FlatSlot& slot) const;
  Tensor full_grad(std::size_t layer, const FlatSlot& slot) const;
  // Stage 0 with a device store: the fp32 master of a slot, in place; empty otherwise.
  Tensor full_master(std::size_t layer, const FlatSlot& slot) const;
  // Gathers every partitioned layer for a reader outside the step (sampling); collective. Held
  // until the next begin_pass.
  void acquire_all();

  // ---- statistics ----
  std::int64_t padded_numel() const { return total_numel_; }  // Ψ, padding included
  std::int64_t peak_gathered_elements() const;                // stage 3: the most parameter elements gathered at once

 private:
  // A layer's flat units and the layer's view of them (zero/model_states_units.h).
  struct Unit;
  struct Layer;
  // The constructor's build steps, in order (model_states.cpp; the layout and the partition in
  // model_states_layout.cpp; the ZeRO++ / MiCS groups in model_states_groups.cpp; stage 3's gathers in
  // model_states_gather.cpp).
  struct LayoutSizes {
    std::int64_t full = 0;                 // elements of the layers kept whole (params_full_)
    std::int64_t shard = 0;                // elements of this rank's shard of every layer (the optimizer partition)
    std::vector<std::int64_t> unit_numel;  // stage 3: the partitioned layers' shards (the parameter store's units)
    std::int64_t secondary = 0;            // hpZ: this rank's secondary shards of the partitioned primary units
  };
  LayoutSizes lay_out_layers();
  std::size_t add_unit(std::size_t layer, bool expert, LayoutSizes& sizes, std::int64_t& persisted);
  void place_gradients();
  void allocate_params_and_grads(const LayoutSizes& sizes);
  std::vector<FlatRange> make_optimizer_store(std::int64_t shard);
  void cut_partition(const std::vector<FlatRange>& groups);
  void allocate_staging(const std::vector<FlatRange>& groups);
  void start_communication();
  // Layer i's units (primary, then expert when it has one); the unit of layer i holding `slot`.
  std::vector<std::size_t> unit_ids(std::size_t i) const;
  const Unit& unit_of(std::size_t i, const FlatSlot& slot) const;
  void make_zeropp_groups();
  void gather_layer(std::size_t j);
  void gather_unit(Unit& u);
  void wait_layer(std::size_t j);
  void free_layer(std::size_t j);
  void free_unit(Unit& u);
  // after_backward's reduction of one unit, by stage.
  void queue_all_reduce(const Unit& u);
  void reduce_whole_grads(const Unit& u);
  void reduce_transient_grads(Unit& u);
  // Writes `values` (any float dtype) at `offset` of a partitioned layer's shard, wherever it lives.
  void write_unit(std::size_t unit, std::int64_t offset, const Tensor& values);  // converted to the storage dtype
  void flush_allreduce(Communicator* comm, std::int64_t begin, std::int64_t end);
  void partition_sum(const Tensor& values);
  void sum_over(Communicator* comm, const Tensor& values);  // in place, through device staging where needed
  struct Staging;
  Staging staging(std::int64_t numel) const;
  // wait(t): queue_->wait, then device work queued afterwards is ordered after t's own collectives
  // (CommQueue::mark, Communicator::order_compute_after); drain(): after all of them.
  // drain() also waits for them on the host (Communicator::synchronize(), bounded by the comm
  // timeout): it ends a pass or a step, where the host would block on the compute stream next
  // anyway (a loss or norm read, a batch upload), and there a dead NCCL peer must surface as the
  // communicator's timeout Error instead of an unbounded wait inside a cudaMemcpy.
  void wait(CommQueue::Ticket t);
  void drain();
  std::vector<Communicator*> groups() const;  // every group this rank's states communicate over, once each
  Tensor region(const Buffer& b, DType t, std::int64_t begin, std::int64_t count) const;

  ZeroSettings s_;
  Communicator* comm_;
  int world_ = 1;
  // ZeRO++ / MiCS groups (make_zeropp_groups). partition_comm_ is the group the primary units split,
  // gather and reduce-scatter over: MiCS's shard group, else comm_.
  Communicator* partition_comm_ = nullptr;
  std::unique_ptr<Communicator> mics_shard_, mics_replica_, hpz_;
  std::unique_ptr<NodeSplit> nodes_;  // qgZ (over more than one node) and MiCS's hierarchical gather
  Buffer secondary_;                  // hpZ: this rank's secondary shard of every partitioned primary unit
  Communicator* expert_comm_ = nullptr;
  Allocator& alloc_;
  std::vector<std::unique_ptr<Unit>> units_;  // every layer's units, layer order, primary before expert
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::string> names_;
  std::vector<std::vector<ParamSpec>> specs_;
  std::int64_t total_numel_ = 0;
  // Model-wide buffers (regions per layer; see the table above).
  Buffer params_full_, grads_full_, grads_shard_;
  std::unique_ptr<ParamStore> param_store_;  // stage 3: the partitioned layers' shards, one unit per layer
  std::unique_ptr<StateStore> store_;        // the optimizer partition: masters (when apart) + optimizer states
  bool masters_apart_ = false;
  std::int32_t tensor_count_ = 0;
  std::vector<OwnedPiece> owned_pieces_;
  std::vector<std::pair<std::size_t, std::size_t>> group_segments_;  // per sub-group: [first, last) of segments_
  // Staging of a sub-group's grads and params in the store's memory, when that is not the device's.
  // Next to a GPU each holds two halves (sub-group g uses half g % 2), so that the next sub-group's
  // grads and the last one's params travel while the optimizer works on this one (docs/offload.md §12).
  Buffer stage_grads_, stage_params_;
  std::size_t stage_half_bytes_ = 0;  // the bytes of one half (0: no host staging)
  std::size_t stage_halves_ = 1;
  Buffer stage_params_device_;  // offload_param with sub-groups on a GPU: the 16-bit output before the parameter store
  // Copies between the training device and host memory on a stream of their own (a GPU with
  // offload; nullptr otherwise: on the CPU every copy is a memcpy in place).
  std::unique_ptr<CopyStream> copies_;
  // Device training with several ranks: all_reduce_sum's host values go through this buffer.
  static constexpr std::size_t kReduceStagingBytes = 512;
  Buffer reduce_staging_;
  std::vector<PartitionSegment> segments_;
  std::unique_ptr<CommQueue> queue_;
  std::unique_ptr<ParamCoordinator> coordinator_;
  std::vector<std::size_t> train_trace_, eval_trace_;
  // Stages 2-3: reductions of whole-layer gradients not yet known complete. Bounded, so that with
  // overlap_comm the backward cannot run ahead and hold every layer's whole gradients at once.
  std::vector<CommQueue::Ticket> reductions_in_flight_;
  // Stage 0: the grads_full_ range awaiting its all-reduce, per group (primary units', expert units').
  struct PendingRange {
    std::int64_t begin = -1, end = -1;
  };
  std::array<PendingRange, 2> pending_{};
  bool all_acquired_ = false;
  bool training_pass_ = false;  // the current pass computes gradients (hpZ fills its secondary shards)
  bool gradient_all_reduce_ = true;
};

}  // namespace dstrain
