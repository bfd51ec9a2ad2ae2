#include "zero/model_states.h"

#include <array>
#include <algorithm>
#include <utility>

#include "ops/error.h"
#include "ops/log.h"
#include "ops/kernels/tensor_ops.h"
#include "zero/gradient_reduction.h"
#include "zero/model_states_units.h"

namespace dstrain {

ModelStates::ModelStates(std::vector<std::vector<ParamSpec>> specs, std::vector<std::string> names, const ZeroSettings& settings, Communicator* comm,
                         Allocator& allocator, Communicator* expert_comm)
    : s_(settings),
      comm_(comm),
      world_(comm != nullptr ? comm->world_size() : 1),
      expert_comm_(expert_comm),
      alloc_(allocator),
      names_(std::move(names)),
      specs_(std::move(specs)) {
  if (s_.stage < 0 || s_.stage > 3) fail("zero_optimization.stage: {} — ZeRO has stages 0, 1, 2 and 3", s_.stage);
  if (names_.size() != specs_.size()) fail("ModelStates: {} layer names for {} layers", names_.size(), specs_.size());
  if (expert_comm_ != nullptr && (expert_comm_->world_size() > world_ || world_ % expert_comm_->world_size() != 0)) {
    fail("ModelStates: an expert-data-parallel group of {} ranks does not divide the data-parallel group of {}", expert_comm_->world_size(), world_);
  }
  make_zeropp_groups();
  const LayoutSizes sizes = lay_out_layers();
  allocate_params_and_grads(sizes);
  const std::vector<FlatRange> groups = make_optimizer_store(sizes.shard);
  cut_partition(groups);
  allocate_staging(groups);
  start_communication();
}

// The whole layers' params, the stage-3 parameter store of the partitioned ones (where the
// placement puts it), and the gradients: whole at stages 0-1, this rank's shard at 2-3.
void ModelStates::allocate_params_and_grads(const LayoutSizes& sizes) {
  const auto make = [&](std::int64_t elems, DType t, MemoryPurpose p) {
    Buffer b(alloc_, static_cast<std::size_t>(elems) * dtype_size(t), p);
    if (elems > 0) zero_tensor(b.tensor(t, Shape{elems}));
    return b;
  };
  params_full_ = make(sizes.full, s_.storage, MemoryPurpose::params);
  if (s_.stage == 3) {
    ParamStoreLayout pl{s_.storage, sizes.unit_numel};
    if (s_.param_store_factory) {
      param_store_ = s_.param_store_factory(std::move(pl));
    } else {
      if (s_.param_home != StateHome::device) fail("ModelStates: parameter home '{}' needs a store factory", state_home_name(s_.param_home));
      param_store_ = std::make_unique<ResidentParamStore>(std::move(pl), alloc_, StateHome::device);
    }
    if (!param_store_) fail("ModelStates: the parameter store factory returned no store");
    if (param_store_->home() != s_.param_home) {
      fail("ModelStates: the parameter store lives in {} memory but the settings ask for {}", state_home_name(param_store_->home()),
           state_home_name(s_.param_home));
    }
  } else if (s_.param_home != StateHome::device) {
    fail("ModelStates: parameter offload (home '{}') is a ZeRO stage 3 feature; the stage is {}", state_home_name(s_.param_home), s_.stage);
  }
  if (sizes.secondary > 0) secondary_ = make(sizes.secondary, s_.storage, MemoryPurpose::params);
  if (s_.stage <= 1) {
    grads_full_ = make(total_numel_, s_.storage, MemoryPurpose::grads);
  } else {
    grads_shard_ = make(sizes.shard, s_.storage, MemoryPurpose::grads);
  }
}

// The optimizer partition (docs/training_state.md §1-3): fp32 masters when kept apart from the
// params, then the optimizer's states, in one store cut into sub-groups. Returns the sub-groups.
std::vector<FlatRange> ModelStates::make_optimizer_store(std::int64_t shard) {
  masters_apart_ = dstrain::masters_apart(s_.storage != DType::fp32, s_.optimizer_home, s_.param_home);
  StateStoreLayout sl;
  sl.numel = shard;
  if (masters_apart_) sl.names.emplace_back("master");
  for (const std::string& n : s_.optimizer_states) sl.names.push_back(n);
  sl.groups = StateStoreLayout::cut(shard, s_.sub_group_size);
  const std::vector<FlatRange> groups = sl.groups;
  if (s_.store_factory) {
    store_ = s_.store_factory(std::move(sl));
  } else {
    if (s_.optimizer_home != StateHome::device) {
      fail("ModelStates: optimizer partition home '{}' needs a store factory", state_home_name(s_.optimizer_home));
    }
    store_ = std::make_unique<ResidentStateStore>(std::move(sl), alloc_, StateHome::device);
  }
  if (!store_) fail("ModelStates: the state store factory returned no store");
  if (store_->home() != s_.optimizer_home) {
    fail("ModelStates: the state store lives in {} memory but the settings ask for {}", state_home_name(store_->home()),
         state_home_name(s_.optimizer_home));
  }

  return groups;
}

// Staging where the optimizer cannot use the training device's buffers in place:
// - a sub-group whose store memory is not the training device's (offload from a GPU): its grads
//   and params pass through host staging buffers (stage_grads_, stage_params_);
// - params the optimizer cannot write in place (offload_param): its 16-bit output goes through
//   a staging buffer where the optimizer works (stage_params_ on the host, stage_params_device_
//   on the device), then into the parameter store.
void ModelStates::allocate_staging(const std::vector<FlatRange>& groups) {
  std::int64_t most = 0;
  bool host_groups = false, unreachable_on_device = false, unreachable_on_host = false;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    most = std::max(most, groups[gi].size());
    const Device d = store_->group_device(gi);
    if (d != alloc_.device()) host_groups = true;
    for (std::size_t j = group_segments_[gi].first; j < group_segments_[gi].second; ++j) {
      const PartitionSegment& sg = segments_[j];
      if (!sg.param.empty() && sg.param.device == d) continue;
      (d.is_cpu() ? unreachable_on_host : unreachable_on_device) = true;
    }
  }
  const std::size_t bytes = static_cast<std::size_t>(most) * dtype_size(s_.storage);
  // Next to a GPU the host staging is two halves in the staging host memory (page-locked from
  // the engine), and the copies run on a copy stream of their own (for_each_subgroup); on the
  // CPU host groups are the device's own memory and nothing is copied through staging but the
  // offloaded params' 16-bit output.
  const bool copies = host_groups && !alloc_.device().is_cpu();
  Allocator& host = copies && s_.staging_host != nullptr ? *s_.staging_host : cpu_allocator();
  stage_half_bytes_ = bytes;
  stage_halves_ = copies ? 2 : 1;
  if (host_groups) stage_grads_ = Buffer(host, bytes * stage_halves_, MemoryPurpose::buffers);
  if (host_groups || unreachable_on_host) stage_params_ = Buffer(host, bytes * stage_halves_, MemoryPurpose::buffers);
  if (unreachable_on_device && !alloc_.device().is_cpu()) stage_params_device_ = Buffer(alloc_, bytes, MemoryPurpose::buffers);
  if (!alloc_.device().is_cpu() && (!stage_grads_.empty() || (param_store_ && param_store_->home() != StateHome::device))) {
    copies_ = make_copy_stream(alloc_.device(), "ZeRO offload");
  }
}

// The collectives' queue (a worker thread on the CPU with overlap_comm), the device staging of
// reductions, and stage 3's parameter coordinator (gather, prefetch, release).
void ModelStates::start_communication() {
  const std::size_t L = specs_.size();
  // A worker thread overlaps host collectives with compute; on a GPU the collectives are queued
  // on streams and overlap by themselves (NCCL's stream), so they are issued inline. One queue
  // for both groups: every rank submits their collectives in the same program order.
  queue_ = std::make_unique<CommQueue>(s_.overlap_comm && world_ > 1 && alloc_.device().is_cpu());
  // Each ticket remembers the partition group's last collective, so wait(t) orders compute after t's own
  // collectives only (a later prefetch or reduction keeps running beside compute).
  if (partition_comm_ != nullptr) queue_->set_marker([c = partition_comm_] { return c->sequence(); });
  if (world_ > 1 && !alloc_.device().is_cpu()) reduce_staging_ = Buffer(alloc_, kReduceStagingBytes, MemoryPurpose::buffers);
  if (s_.stage == 3) {
    // The coordinator schedules engine layers: a layer's gather is that of its partitioned units.
    std::vector<std::int64_t> numel(L, 0);
    std::vector<std::vector<std::size_t>> needs(L);
    for (std::size_t i = 0; i < L; ++i) {
      for (const std::size_t u : unit_ids(i))
        if (units_[u]->partitioned) numel[i] += units_[u]->layout.numel;
      needs[i] = layers_[i]->owners;
    }
    const auto prefetch = [this](std::size_t j) {
      for (const std::size_t u : unit_ids(j))
        if (units_[u]->partitioned) param_store_->prefetch(units_[u]->store_unit);
    };
    ParamCoordinatorSettings cs{s_.prefetch_bucket_size, s_.max_live_parameters, s_.max_reuse_distance};
    ParamCoordinatorCallbacks cb{[this](std::size_t j) { gather_layer(j); }, [this](std::size_t j) { wait_layer(j); },
                                 [this](std::size_t j) { free_layer(j); }, prefetch};
    coordinator_ = std::make_unique<ParamCoordinator>(std::move(numel), std::move(needs), names_, cs, std::move(cb));
  }
}

ModelStates::~ModelStates() {
  // Nothing may still write into buffers about to be freed.
  if (queue_) {
    try {
      queue_->drain();
    } catch (...) {
    }
  }
}

int ModelStates::rank() const { return comm_ != nullptr ? comm_->rank() : 0; }

Tensor ModelStates::region(const Buffer& b, DType t, std::int64_t begin, std::int64_t count) const {
  return b.tensor(t, Shape{count}, static_cast<std::size_t>(begin) * dtype_size(t));
}

void ModelStates::wait(CommQueue::Ticket t) {
  queue_->wait(t);
  if (comm_ == nullptr) return;
  // The queue's marks count the partition group's collectives (the gathers and reductions a
  // ticket waits for): after that group's collective number `mark` only.
  const std::uint64_t mark = queue_->mark(t);
  if (mark != 0) {
    partition_comm_->order_compute_after(mark);
  } else {
    partition_comm_->order_compute_after_collectives();  // an old ticket: after everything (never too early)
  }
  // The other groups' collectives (expert units, the step's sums, ZeRO++ / MiCS's groups): after
  // every one issued so far (never too early; a device group's later prefetch may wait for it).
  for (Communicator* c : groups())
    if (c != partition_comm_) c->order_compute_after_collectives();
}

void ModelStates::drain() {
  queue_->drain();
  for (Communicator* c : groups()) {
    c->order_compute_after_collectives();
    if (c->world_size() > 1) c->synchronize();
  }
}

void ModelStates::set_traces(std::vector<std::size_t> train, std::vector<std::size_t> eval) {
  train_trace_ = std::move(train);
  eval_trace_ = std::move(eval);
}

// ---- the step loop's hooks ----

void ModelStates::begin_pass(bool train) {
  if (!coordinator_) return;
  // hpZ: a new pass gathers its forward from the partition again (the weights may have changed).
  training_pass_ = train;
  for (const auto& u : units_) u->secondary_valid = false;
  if (all_acquired_) {
    for (const auto& u : units_)
      if (u->partitioned) free_unit(*u);
    all_acquired_ = false;
  }
  coordinator_->begin_pass(train ? std::span<const std::size_t>(train_trace_) : std::span<const std::size_t>(eval_trace_));
}

void ModelStates::acquire(std::size_t i) {
  if (coordinator_ && !all_acquired_) coordinator_->before(i);
  // An NVMe optimizer store reads the step's first sub-groups while the forward and backward run,
  // as its buffers' write-backs of the previous step finish (docs/offload.md §5).
  store_->prefetch_step();
}

void ModelStates::release(std::size_t i) {
  if (coordinator_ && !all_acquired_) coordinator_->after(i);
}

void ModelStates::views(std::size_t i, std::vector<Tensor>& params, std::vector<Tensor>* grads) {
  const Layer& ly = *layers_[i];
  params.clear();
  if (grads != nullptr) grads->clear();
  for (std::size_t j = 0; j < ly.refs.size(); ++j) {
    // Named copies, not a structured binding: the lambda below captures `slot`, which C++20 allows
    // for bindings but clang before 16 (the fuzz gate's Debian clang 14) does not.
    const auto owner = ly.refs[j].first;
    const auto slot = ly.refs[j].second;
    const Unit& o = *units_[owner];
    const Shape shape = specs_[i][j].shape;
    const auto at = [&](const Buffer& b, std::int64_t begin) {
      return b.tensor(s_.storage, shape, static_cast<std::size_t>(begin + slot->offset) * dtype_size(s_.storage));
    };
    if (o.partitioned) {
      if (o.gathered.empty()) {
        fail("ZeRO-3: layer '{}' reads the parameters of layer '{}', which are not gathered (ModelStates::acquire({}) must precede the call)",
             names_[i], names_[o.layer], i);
      }
      params.push_back(at(o.gathered, 0));
    } else {
      params.push_back(at(params_full_, o.full_begin));
    }
    if (grads == nullptr) continue;
    if (s_.stage <= 1) {
      grads->push_back(at(grads_full_, o.grad_begin));
    } else {
      if (o.transient_grads.empty())
        fail("ZeRO-{}: layer '{}' gradients requested outside its backward (before_backward({}) must precede it)", s_.stage, names_[i], i);
      grads->push_back(at(o.transient_grads, 0));
    }
  }
}

void ModelStates::before_backward(std::size_t i) {
  if (s_.stage <= 1) return;
  // At most two layers' reductions in flight (DeepSpeed's max_param_reduce_events is 2 too): the
  // next layer's whole gradients are allocated only once the oldest reduction has freed its own.
  constexpr std::size_t kMaxReductionsInFlight = 2;
  while (reductions_in_flight_.size() >= kMaxReductionsInFlight) {
    wait(reductions_in_flight_.front());
    reductions_in_flight_.erase(reductions_in_flight_.begin());
  }
  for (const std::size_t o : layers_[i]->owner_units) {
    Unit& ow = *units_[o];
    if (!ow.transient_grads.empty()) continue;
    ow.transient_grads = Buffer(alloc_, static_cast<std::size_t>(ow.layout.numel) * dtype_size(s_.storage), MemoryPurpose::grads);
    zero_tensor(ow.transient_grads.tensor(s_.storage, Shape{ow.layout.numel}));
  }
}

void ModelStates::flush_allreduce(Communicator* comm, std::int64_t begin, std::int64_t end) {
  Allocator* scratch = &alloc_;
  for (std::int64_t b = begin; b < end;) {
    const std::int64_t e = s_.reduce_bucket_size > 0 ? std::min(end, b + s_.reduce_bucket_size) : end;
    const Tensor t = region(grads_full_, s_.storage, b, e - b);
    queue_->submit([comm, t, scratch, g = s_.reduction] { reduce_gradients(*comm, t, false, g, ReductionPath::all_reduce, *scratch); });
    b = e;
  }
}

void ModelStates::after_backward(std::size_t i, bool boundary) {
  const std::size_t in_flight = reductions_in_flight_.size();
  for (const std::size_t ui : unit_ids(i)) {
    Unit& u = *units_[ui];
    if (u.layout.numel == 0) continue;
    if (s_.stage == 0) {
      if (boundary && u.world > 1 && gradient_all_reduce_) queue_all_reduce(u);
    } else if (s_.stage == 1) {
      if (boundary && u.world > 1) reduce_whole_grads(u);
    } else {
      reduce_transient_grads(u);
    }
  }
  // The layer's reductions count once in flight: its last ticket (the queue runs in order) frees
  // the whole gradients of both its units.
  if (reductions_in_flight_.size() > in_flight + 1) {
    const CommQueue::Ticket last = reductions_in_flight_.back();
    reductions_in_flight_.resize(in_flight);
    reductions_in_flight_.push_back(last);
  }
}

// Stage 0: backward runs from the last layer to the first, so the finished regions of a group's
// gradients in grads_full_ (place_gradients) form one contiguous range growing downwards:
// all-reduce it over the group in reduce_bucket_size pieces.
void ModelStates::queue_all_reduce(const Unit& u) {
  PendingRange& p = pending_[u.expert ? 1 : 0];
  const std::int64_t b = u.grad_begin, e = u.grad_begin + u.layout.numel;
  if (p.begin < 0) {
    p = {b, e};
  } else {
    DSTRAIN_CHECK(e == p.begin, "ZeRO-0: layer '{}' finished out of order for bucketing", names_[u.layer]);
    p.begin = b;
  }
  if (p.end - p.begin >= s_.reduce_bucket_size) {
    flush_allreduce(u.comm, p.begin, p.end);
    p = {};
  }
}

// Stage 1, at the boundary: reduce-scatter every chunk in place over the unit's group: rank r's
// piece of it becomes the average (with reduce_scatter off, an all-reduce of the whole chunk).
void ModelStates::reduce_whole_grads(const Unit& u) {
  const FlatLayout& lo = u.layout;
  std::vector<Tensor> chunks;
  for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
    const FlatRange c = lo.chunk_range(k);
    chunks.push_back(region(grads_full_, s_.storage, u.grad_begin + c.begin, c.size()));
  }
  queue_->submit([comm = u.comm, chunks = std::move(chunks), rs = s_.reduce_scatter, g = s_.reduction, scratch = &alloc_] {
    for (const Tensor& c : chunks) reduce_gradients(*comm, c, rs, g, reduction_path(1, rs), *scratch);
  });
}

// Stages 2-3, every micro-step: reduce-scatter the unit's whole gradients chunk by chunk over its
// group, add this rank's pieces into its gradient partition, and free the whole-gradient buffer.
void ModelStates::reduce_transient_grads(Unit& u) {
  const FlatLayout& lo = u.layout;
  Communicator* comm = u.world > 1 ? u.comm : nullptr;
  std::vector<std::pair<Tensor, Tensor>> parts;  // (chunk of the whole grads, this rank's partition piece)
  for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
    const FlatRange c = lo.chunk_range(k);
    parts.emplace_back(region(u.transient_grads, s_.storage, c.begin, c.size()),
                       region(grads_shard_, s_.storage, u.shard_begin + lo.shard_offset(k), c.size() / lo.world));
  }
  Buffer* transient = &u.transient_grads;
  // qgZ across nodes (on one node DeepSpeed, and dstrain, reduce-scatter the 16-bit gradients).
  const NodeSplit* quantized = s_.quantized_gradients && !u.expert && comm != nullptr ? nodes_.get() : nullptr;
  const CommQueue::Ticket t = queue_->submit([comm, r = u.rank, w = lo.world, parts = std::move(parts), transient, rs = s_.reduce_scatter,
                                              g = s_.reduction, path = reduction_path(s_.stage, s_.reduce_scatter), scratch = &alloc_, quantized] {
    for (const auto& [chunk, part] : parts) {
      if (quantized != nullptr) {
        quantized_reduce_scatter(*quantized, chunk, *scratch);
        comm->order_compute_after_collectives();
      } else if (comm != nullptr) {
        reduce_gradients(*comm, chunk, rs, g, path, *scratch);
        comm->order_compute_after_collectives();  // the add below reads what the collective wrote
      }
      residual_forward(part, part, shard_of(chunk, r, w));  // accumulate over micro-steps (fp32 add, one rounding)
    }
    transient->reset();
  });
  reductions_in_flight_.push_back(t);
}

void ModelStates::end_backward(bool boundary) {
  if (s_.stage == 0 && boundary) {
    for (const bool expert : {false, true}) {
      PendingRange& p = pending_[expert ? 1 : 0];
      if (p.begin < 0) continue;
      flush_allreduce(expert ? expert_comm_ : comm_, p.begin, p.end);
      p = {};
    }
  }
  if (boundary && mics_replica_ && mics_replica_->world_size() > 1 && !grads_shard_.empty()) {
    // MiCS: the partition's gradients, averaged within the shard group, averaged across the
    // replicas of the partition at the accumulation boundary (DeepSpeed's allreduce_mics_shard_grads),
    // in buckets of reduce_bucket_size elements: the mean over every data-parallel rank.
    const std::int64_t n = static_cast<std::int64_t>(grads_shard_.bytes() / dtype_size(s_.storage));
    std::vector<Tensor> buckets;
    for (std::int64_t b = 0; b < n; b += s_.reduce_bucket_size) buckets.push_back(region(grads_shard_, s_.storage, b, std::min(s_.reduce_bucket_size, n - b)));
    queue_->submit([comm = mics_replica_.get(), buckets = std::move(buckets)] {
      for (const Tensor& b : buckets) comm->all_reduce(b, ReduceOp::avg);
    });
  }
  drain();
  reductions_in_flight_.clear();
  if (coordinator_) coordinator_->end_pass();
}

void ModelStates::end_eval() {
  if (coordinator_) coordinator_->end_pass();
  drain();
}

// ---- the optimizer step ----

void ModelStates::after_update() {
  if (s_.stage == 0) return;
  // Every chunk of every unit kept whole: all-gather the updated pieces in place over its group.
  for (const auto& u : units_) {
    if (u->partitioned || u->layout.numel == 0 || u->world == 1) continue;
    std::vector<Tensor> chunks;
    for (std::int64_t k = 0; k < u->layout.chunk_count(); ++k) {
      const FlatRange c = u->layout.chunk_range(k);
      chunks.push_back(region(params_full_, s_.storage, u->full_begin + c.begin, c.size()));
    }
    queue_->submit([comm = u->comm, r = u->rank, w = u->world, chunks = std::move(chunks)] {
      for (const Tensor& c : chunks) comm->all_gather(shard_of(c, r, w), c);
    });
  }
  drain();
}

void ModelStates::zero_grads() {
  for (const Buffer* b : {&grads_full_, &grads_shard_})
    if (!b->empty()) zero_tensor(b->tensor(s_.storage, Shape{static_cast<std::int64_t>(b->bytes() / dtype_size(s_.storage))}));
}

void ModelStates::all_reduce_sum(Tensor values) { sum_over(comm_, values); }

void ModelStates::sum_over(Communicator* comm, const Tensor& values) {
  if (world_ == 1) return;
  // Host values with device collectives go through a device buffer: the small one kept for the
  // step's all-reduce, or a temporary one for more.
  Tensor t = values;
  Buffer temporary;
  if (values.device != alloc_.device()) {
    if (values.nbytes() <= reduce_staging_.bytes()) {
      t = reduce_staging_.tensor(values.dtype, values.shape);
    } else {
      temporary = Buffer(alloc_, values.nbytes(), MemoryPurpose::buffers);
      t = temporary.tensor(values.dtype, values.shape);
    }
    copy_tensor(t, values);
  }
  queue_->submit([comm, t] { comm->all_reduce(t, ReduceOp::sum); });
  drain();                 // the caller reads the sums next: bounded by the communicator's timeout first
  copy_tensor(values, t);  // a no-op when t is values
}

void ModelStates::all_reduce_sum(std::span<double> values) {
  // Stage 0: every rank holds the whole partition, so its sums are already the model's.
  if (s_.stage == 0 || world_ == 1 || values.empty()) return;
  partition_sum(Tensor(values.data(), DType::fp64, Shape{static_cast<std::int64_t>(values.size())}));
}

void ModelStates::all_reduce_sum(std::span<float> values) {
  if (s_.stage == 0 || world_ == 1 || values.empty()) return;
  partition_sum(Tensor(values.data(), DType::fp32, Shape{static_cast<std::int64_t>(values.size())}));
}

// The optimizers' sums over the partition: over the ranks that split it (MiCS: the shard group;
// its replicas hold the same partition and would count it again).
void ModelStates::partition_sum(const Tensor& values) { sum_over(mics_shard_ ? mics_shard_.get() : comm_, values); }

// ---- the optimizer partition ----

void ModelStates::for_each_subgroup(const std::function<void(std::span<const OptimizerSegment>)>& fn) {
  drain();  // every reduction has landed in the grads
  StateStore& st = *store_;
  const std::vector<FlatRange>& groups = st.layout().groups;
  const std::size_t first_state = first_state_buffer();
  const std::size_t elem = dtype_size(s_.storage);
  // Host staging of sub-group g: half g % 2 when there are two (next to a GPU), else the one.
  const auto staging = [&](const Buffer& b, std::size_t g, std::int64_t at, std::int64_t numel) {
    return b.tensor(s_.storage, Shape{numel}, (g % stage_halves_) * stage_half_bytes_ + static_cast<std::size_t>(at) * elem);
  };
  const auto staged_group = [&](std::size_t g) { return st.group_device(g) != alloc_.device(); };
  // Sub-group g's grads to its host staging half: on the copy stream next to a GPU (returns the
  // last copy's ticket), a memcpy otherwise. Issued one sub-group ahead, so they travel while the
  // optimizer updates the sub-group before (docs/offload.md §12).
  const auto send_grads = [&](std::size_t g) -> CopyStream::Ticket {
    CopyStream::Ticket last = 0;
    if (!staged_group(g)) return last;
    for (std::size_t j = group_segments_[g].first; j < group_segments_[g].second; ++j) {
      const PartitionSegment& sg = segments_[j];
      const Tensor dst = staging(stage_grads_, g, sg.shard_offset - groups[g].begin, sg.numel);
      if (copies_) {
        last = copies_->to_host(dst, sg.grads);
      } else {
        copy_tensor(dst, sg.grads);
      }
    }
    return last;
  };
  CopyStream::Ticket grads_sent = groups.empty() ? 0 : send_grads(0);
  std::array<CopyStream::Ticket, 2> params_sent{0, 0};  // the last params copy out of each staging half
  std::vector<OptimizerSegment> work;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g + 1 < groups.size()) st.prefetch(g + 1);
    const std::span<const Tensor> views = st.acquire(g);
    const FlatRange gr = groups[g];
    const auto [first, last] = group_segments_[g];
    // The optimizer writes params it cannot reach in place into the staging buffer; the parameter
    // store's units they go to start reading now, while the optimizer works (read-modify-write: a
    // unit may straddle two sub-groups).
    // This sub-group's memory (offload_optimizer.ratio < 1 keeps the first sub-groups on the device).
    const Device where = st.group_device(g);
    const bool staged = where != alloc_.device();
    const auto in_place = [&](const PartitionSegment& sg) { return !sg.param.empty() && sg.param.device == where; };
    for (std::size_t j = first; j < last; ++j)
      if (!in_place(segments_[j])) param_store_->prefetch(static_cast<std::size_t>(segments_[j].param_unit));
    work.clear();
    for (std::size_t j = first; j < last; ++j) {
      const PartitionSegment& sg = segments_[j];
      const std::int64_t at = sg.shard_offset - gr.begin;  // offset inside the sub-group's views
      const auto part = [&](const Tensor& v) { return v.slice_rows(at, at + sg.numel); };
      OptimizerSegment o;
      o.layer = static_cast<std::uint32_t>(sg.layer);
      o.layer_offset = sg.layer_offset;
      o.weight_decay = sg.weight_decay;
      o.pieces = sg.pieces;
      for (std::size_t b = first_state; b < views.size(); ++b) o.states.push_back(part(views[b]));
      // Staged: the grads were sent to the store's memory (send_grads); the updated params come
      // back below.
      o.grads = staged ? staging(stage_grads_, g, at, sg.numel) : sg.grads;
      if (masters_apart_) {
        o.params = part(views[0]);
        // A 16-bit copy is written in the update's own pass; an fp32 one (offloaded fp32 training)
        // is copied after it.
        if (s_.storage != DType::fp32 && (staged || !in_place(sg))) {
          o.params_lowp = where.is_cpu() ? staging(stage_params_, g, at, sg.numel)
                                         : stage_params_device_.tensor(s_.storage, Shape{sg.numel}, static_cast<std::size_t>(at) * elem);
        } else if (s_.storage != DType::fp32) {
          o.params_lowp = sg.param;
        }
      } else {
        o.params = sg.param;  // fp32 on the store's device: the master is the param
      }
      work.push_back(std::move(o));
    }
    // The next sub-group's grads travel while this one is updated; this one's must have arrived,
    // and the params copies that last read this staging half (sub-group g - 2) must be done.
    const CopyStream::Ticket next_grads = g + 1 < groups.size() ? send_grads(g + 1) : 0;
    if (copies_) {
      copies_->wait_host(grads_sent);
      copies_->wait_host(params_sent[g % 2]);
    }
    grads_sent = next_grads;
    fn(work);
    std::ptrdiff_t open_unit = -1;  // the parameter store unit acquired for the write-back below
    Tensor unit;
    // Updated params into device memory: on the copy stream from host staging next to a GPU (the
    // host goes on to the next sub-group), a memcpy or a synchronous copy otherwise.
    const auto put = [&](const Tensor& dst, const Tensor& src) {
      if (copies_ && src.device.is_cpu() && !dst.device.is_cpu()) {
        params_sent[g % 2] = copies_->to_device(dst, src);
      } else {
        copy_tensor(dst, src);
      }
    };
    for (std::size_t j = first; j < last; ++j) {
      const PartitionSegment& sg = segments_[j];
      const OptimizerSegment& o = work[j - first];
      if (!masters_apart_) continue;
      const Tensor& updated = s_.storage == DType::fp32 ? o.params : o.params_lowp;
      if (in_place(sg)) {
        if (s_.storage == DType::fp32 || staged) put(sg.param, updated);
        continue;
      }
      if (sg.param_unit != open_unit) {
        if (open_unit >= 0) param_store_->release(static_cast<std::size_t>(open_unit), true);
        open_unit = -1;
        unit = param_store_->acquire(static_cast<std::size_t>(sg.param_unit));
        open_unit = sg.param_unit;
      }
      put(unit.slice_rows(sg.unit_offset, sg.unit_offset + sg.numel), updated);
    }
    if (open_unit >= 0) param_store_->release(static_cast<std::size_t>(open_unit), true);  // written back to the home
    // fp32 training copies the params straight out of the store's memory, which release() may
    // hand to the next sub-group (NVMe buffers): those copies finish first.
    if (copies_ && s_.storage == DType::fp32) copies_->wait_host(params_sent[g % 2]);
    st.release(g, true);
  }
  // Every copy done before the step ends: the host may read or refill staging at the next step
  // without waiting, and the compute that follows (the next forward's reads of the params, the
  // zeroing of the grads) is issued after the copies finished.
  if (copies_) copies_->wait_host(std::max(params_sent[0], params_sent[1]));
}

void ModelStates::read_shard(std::size_t b, std::int64_t shard_begin, const Tensor& out) {
  StateStore& st = *store_;
  const FlatRange want{shard_begin, shard_begin + out.numel()};
  const std::vector<FlatRange>& groups = st.layout().groups;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const FlatRange r = intersect(want, groups[g]);
    if (r.empty()) continue;
    const std::span<const Tensor> views = st.acquire(g);
    DSTRAIN_CHECK(b < views.size(), "ModelStates::read_shard: buffer {} of {}", b, views.size());
    copy_tensor(out.slice_rows(r.begin - want.begin, r.end - want.begin), views[b].slice_rows(r.begin - groups[g].begin, r.end - groups[g].begin));
    st.release(g, false);
  }
}

void ModelStates::write_shard(std::size_t b, std::int64_t shard_begin, const Tensor& in) {
  StateStore& st = *store_;
  const FlatRange want{shard_begin, shard_begin + in.numel()};
  const std::vector<FlatRange>& groups = st.layout().groups;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const FlatRange r = intersect(want, groups[g]);
    if (r.empty()) continue;
    const std::span<const Tensor> views = st.acquire(g);
    DSTRAIN_CHECK(b < views.size(), "ModelStates::write_shard: buffer {} of {}", b, views.size());
    copy_tensor(views[b].slice_rows(r.begin - groups[g].begin, r.end - groups[g].begin), in.slice_rows(r.begin - want.begin, r.end - want.begin));
    st.release(g, true);
  }
}

Tensor ModelStates::owned_param(const OwnedPiece& piece) const {
  const Unit& ly = unit_of(piece.layer, *piece.slot);
  if (ly.partitioned) {
    const Tensor in = param_store_->in_place(ly.store_unit);
    const std::int64_t at = piece.shard_offset - ly.shard_begin;
    return in.empty() ? Tensor{} : in.slice_rows(at, at + piece.numel);
  }
  return region(params_full_, s_.storage, ly.full_begin + piece.slot->offset + piece.tensor_offset, piece.numel);
}

void ModelStates::read_owned_param(const OwnedPiece& piece, const Tensor& out, std::int64_t first) {
  const Tensor in = owned_param(piece);
  if (!in.empty()) {
    copy_tensor(out, in.slice_rows(first, first + out.numel()));
    return;
  }
  const Unit& ly = unit_of(piece.layer, *piece.slot);
  const std::int64_t at = piece.shard_offset - ly.shard_begin + first;
  const Tensor unit = param_store_->acquire(ly.store_unit);
  copy_tensor(out, unit.slice_rows(at, at + out.numel()));
  param_store_->release(ly.store_unit, false);
}

void ModelStates::write_owned_param(const OwnedPiece& piece, const Tensor& in, std::int64_t first) {
  const Unit& ly = unit_of(piece.layer, *piece.slot);
  if (ly.partitioned) {
    write_unit(ly.store_unit, piece.shard_offset - ly.shard_begin + first, in);
  } else {
    const Tensor dst = owned_param(piece).slice_rows(first, first + in.numel());
    if (in.dtype == dst.dtype) {
      copy_tensor(dst, in);
    } else {
      convert_tensor(dst, in);
    }
  }
}

void ModelStates::write_unit(std::size_t u, std::int64_t offset, const Tensor& values) {
  const Tensor unit = param_store_->acquire(u);
  const Tensor dst = unit.slice_rows(offset, offset + values.numel());
  if (values.dtype == dst.dtype) {
    copy_tensor(dst, values);
  } else if (values.device == dst.device) {
    convert_tensor(dst, values);
  } else {
    // Rounded where the values are, then moved: convert_tensor works within one device.
    Buffer tmp(values.device == alloc_.device() ? alloc_ : cpu_allocator(), static_cast<std::size_t>(values.numel()) * dtype_size(dst.dtype),
               MemoryPurpose::buffers);
    const Tensor t = tmp.tensor(dst.dtype, Shape{values.numel()});
    convert_tensor(t, values);
    copy_tensor(dst, t);
  }
  param_store_->release(u, true);
}

// ---- whole parameters ----

Tensor ModelStates::full_param(std::size_t layer, const FlatSlot& slot) const {
  const Unit& ly = unit_of(layer, slot);
  if (ly.partitioned) return {};
  return params_full_.tensor(s_.storage, specs_[layer][slot.spec].shape,
                             static_cast<std::size_t>(ly.full_begin + slot.offset) * dtype_size(s_.storage));
}

Tensor ModelStates::full_grad(std::size_t layer, const FlatSlot& slot) const {
  if (s_.stage >= 2) return {};
  const Unit& ly = unit_of(layer, slot);
  return grads_full_.tensor(s_.storage, specs_[layer][slot.spec].shape,
                            static_cast<std::size_t>(ly.grad_begin + slot.offset) * dtype_size(s_.storage));
}

Tensor ModelStates::full_master(std::size_t layer, const FlatSlot& slot) const {
  if (s_.stage >= 1) return {};
  if (!masters_apart_) return full_param(layer, slot);
  // Stage 0: the slot's masters sit at its layer offset of the shard space; in place only in a
  // resident device store whose one sub-group holds the whole slot.
  if (store_->home() != StateHome::device) return {};
  const std::int64_t begin = unit_of(layer, slot).shard_begin + slot.offset;
  for (std::size_t g = 0; g < store_->layout().groups.size(); ++g) {
    const FlatRange gr = store_->layout().groups[g];
    if (begin < gr.begin || begin >= gr.end) continue;
    if (begin + slot.numel > gr.end) return {};
    const std::span<const Tensor> v = store_->acquire(g);
    store_->release(g, false);
    return Tensor(static_cast<float*>(v[0].data) + (begin - gr.begin), DType::fp32, specs_[layer][slot.spec].shape, v[0].device);
  }
  return {};
}

// A layer's whole fp32 values for gather_masters / set_masters. `host` is what the caller's
// function reads or writes (host staging comes from cpu_allocator(), outside the rank's
// allocator: it is not part of what training holds); `dev` is where the collectives and the
// conversions work: the same memory on a CPU rank, a device buffer (purpose buffers) otherwise.
struct ModelStates::Staging {
  Buffer host_buf, dev_buf;
  Tensor host, dev;
  Tensor host_slot(const ParamSpec& ps, const FlatSlot& sl) const {
    return host_buf.tensor(DType::fp32, ps.shape, static_cast<std::size_t>(sl.offset) * sizeof(float));
  }
};

ModelStates::Staging ModelStates::staging(std::int64_t numel) const {
  Staging st;
  const std::size_t bytes = static_cast<std::size_t>(numel) * sizeof(float);
  st.host_buf = Buffer(cpu_allocator(), bytes, MemoryPurpose::buffers);
  st.host = st.host_buf.tensor(DType::fp32, Shape{numel});
  if (alloc_.device().is_cpu()) {
    st.dev = st.host;
  } else {
    st.dev_buf = Buffer(alloc_, bytes, MemoryPurpose::buffers);
    st.dev = st.dev_buf.tensor(DType::fp32, Shape{numel});
  }
  return st;
}

void ModelStates::gather_masters(const std::function<void(std::size_t, const FlatSlot&, const Tensor&)>& fn) {
  drain();
  for (const auto& unit : units_) {
    const Unit& ly = *unit;
    const std::size_t i = ly.layer;
    const FlatLayout& lo = ly.layout;
    if (lo.numel == 0) continue;
    if (s_.stage == 0 && alloc_.device().is_cpu()) {
      bool in_place = true;
      for (const FlatSlot& sl : lo.slots) in_place = in_place && !full_master(i, sl).empty();
      if (in_place) {
        for (const FlatSlot& sl : lo.slots) fn(i, sl, full_master(i, sl));
        continue;
      }
    }
    const Staging st = staging(lo.numel);
    zero_tensor(st.dev);
    // This rank's pieces of every chunk (stage 0: the one rank's pieces are the whole buffer), then
    // with several ranks an all-gather of each chunk in place over the unit's group.
    const int r = ly.piece_rank(s_.stage);
    for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
      const FlatRange pc = lo.piece(k, r);
      const Tensor dst = st.dev.slice_rows(pc.begin, pc.begin + pc.size());
      const std::int64_t at_shard = ly.shard_begin + lo.shard_offset(k);
      if (masters_apart_) {
        read_shard(0, at_shard, dst);
      } else if (ly.partitioned) {
        // fp32 params that are the masters: no offload_param (masters_apart_ otherwise), so in place.
        copy_tensor(dst, param_store_->in_place(ly.store_unit).slice_rows(lo.shard_offset(k), lo.shard_offset(k) + pc.size()));
      } else {
        copy_tensor(dst, region(params_full_, DType::fp32, ly.full_begin + pc.begin, pc.size()));
      }
      if (s_.stage >= 1 && ly.world > 1) {
        const FlatRange c = lo.chunk_range(k);
        const Tensor whole = st.dev.slice_rows(c.begin, c.begin + c.size());
        queue_->submit([comm = ly.comm, whole, r, w = ly.world] { comm->all_gather(shard_of(whole, r, w), whole); });
      }
    }
    drain();                       // every chunk gathered; the copy below waits on the host, bounded by the comm timeout first
    copy_tensor(st.host, st.dev);  // a no-op on a CPU rank (the same memory)
    for (const FlatSlot& sl : lo.slots) fn(i, sl, st.host_slot(specs_[i][sl.spec], sl));
  }
}

void ModelStates::set_masters(const std::function<void(std::size_t, const FlatSlot&, const Tensor&)>& fill) {
  drain();
  for (const auto& unit : units_) {
    const Unit& ly = *unit;
    const std::size_t i = ly.layer;
    const FlatLayout& lo = ly.layout;
    if (lo.numel == 0) continue;
    const int r = ly.piece_rank(s_.stage);
    const Staging st = staging(lo.numel);
    zero_tensor(st.host);
    for (const FlatSlot& sl : lo.slots) fill(i, sl, st.host_slot(specs_[i][sl.spec], sl));
    copy_tensor(st.dev, st.host);  // a no-op on a CPU rank
    // Units kept whole: every rank rounds the whole unit (no collective needed: every rank
    // computed the same values).
    if (!ly.partitioned) convert_tensor(region(params_full_, s_.storage, ly.full_begin, lo.numel), st.dev);
    for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
      const FlatRange pc = lo.piece(k, r);
      const Tensor src = st.dev.slice_rows(pc.begin, pc.begin + pc.size());
      const std::int64_t at_shard = ly.shard_begin + lo.shard_offset(k);
      if (masters_apart_) write_shard(0, at_shard, src);
      if (ly.partitioned) write_unit(ly.store_unit, lo.shard_offset(k), src);
    }
  }
}

std::int64_t ModelStates::peak_gathered_elements() const { return coordinator_ ? coordinator_->peak_live() : 0; }

}  // namespace dstrain
