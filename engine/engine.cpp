#include "engine/engine.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/ranges.h>

#include "engine/config_checks.h"
#include "engine/engine_impl.h"
#include "engine/grad_norm.h"
#include "models/param_split.h"
#include "engine/loss_scaler.h"
#include "engine/optim/onebit_optimizer.h"
#include "engine/optim/optimizer.h"
#include "engine/zero_settings.h"
#include "zero/model_states.h"
#include "zero/state_store.h"
#include "offload/host_memory.h"
#include "ops/buffer.h"
#include "ops/crc32c.h"
#include "ops/error.h"
#include "ops/log.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/grad_norm_overflow.h"
#include "models/activation_layout.h"
#include "models/param_init.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

constexpr std::size_t kAlignBytes = kActivationAlignBytes;
constexpr auto pack = pack_activation_specs;

// DeepSpeed wraps the optimizer in its BF16_Optimizer (which never skips a step) instead of the
// ZeRO optimizer for bf16 at ZeRO stage 1 with an fp32 gradient accumulation dtype and no CPU
// optimizer offload (engine._do_optimizer_sanity_check; docs/precision.md).
bool runs_bf16_optimizer(const config::DsConfig& c) {
  const auto& off = c.zero_optimization.offload_optimizer;
  return c.bf16.enabled && c.data_types.grad_accum_dtype == "fp32" && c.zero_optimization.stage == 1 &&
         !(off && off->device == config::OffloadDevice::cpu);
}

}  // namespace

Engine::Impl::Impl(const config::DsConfig& c, const EngineOptions& o)
    : config(c),
      options(o),
      optimizer(c.optimizer),
      schedule(c.scheduler, optimizer.base_lr(), optimizer.has_betas() ? std::optional(optimizer.betas()) : std::nullopt),
      scaler(LossScaler::create(c.fp16, c.bf16, c.zero_optimization.stage, runs_bf16_optimizer(c))) {}

void Engine::Impl::set_initial_masters() {
  // Initialised in fp32 (the master; every rank computes the same values and keeps its part), then
  // rounded: the 16-bit weights are the master's copy.
  states->set_masters([this](std::size_t layer, const FlatSlot& slot, const Tensor& out) {
    if (!init_params) return;
    const ParamSpec& spec = states->spec(layer, slot);
    if (!spec.is_piece()) {
      init_param(out, spec, init_seed);
      return;
    }
    // A tensor-parallel piece starts as its part of the whole parameter one rank would draw, so
    // that any tensor-parallel size trains from the same initial model.
    const ParamSpec whole = whole_spec(spec);
    std::vector<float> full(static_cast<std::size_t>(whole.shape.numel())), part(static_cast<std::size_t>(spec.shape.numel()));
    init_param(Tensor(full.data(), DType::fp32, whole.shape), whole, init_seed);
    copy_whole_to_piece(Tensor(full.data(), DType::fp32, whole.shape), Tensor(part.data(), DType::fp32, spec.shape), spec.split, spec.piece.ranks,
                        spec.piece.rank, spec.name);
    copy_tensor(out, Tensor(part.data(), DType::fp32, out.shape));
  });
}

// The constructor is its build steps, in order: memory, shapes, the ZeRO state, activations, the
// ZeRO-3 traces, the initial values.
Engine::Engine(Model model, const config::DsConfig& config, const EngineOptions& options)
    : model_(std::move(model)),
      impl_((check_config_is_provided(config, (options.comm != nullptr ? options.comm->world_size() : 1) /
                                                  (options.sequence_parallel != nullptr ? options.sequence_parallel->world_size() : 1)),
             std::make_unique<Impl>(config, options))) {
  choose_memory(options);
  check_shapes(config, options);
  build_states(config);
  log_placement();
  if (model_.pipelined()) {
    build_pipeline_activations(config, options);
  } else {
    build_activations(config, options);
  }
  set_traces(config);
  init_state(options);
}

// Where everything lives: the training device's allocator (the caller's or the engine's own) and
// the host allocator for offloaded state and kept activations (pinned next to a GPU unless the
// acting offload sections say pin_memory false), and the ranks.
void Engine::choose_memory(const EngineOptions& options) {
  Impl& im = *impl_;
  if (options.allocator != nullptr) {
    im.allocator = options.allocator;
  } else {
    im.own_allocator = make_device_allocator(options.device);
    im.allocator = im.own_allocator.get();
  }
  im.host_memory_kind = "the caller's";
  if (options.host_allocator != nullptr) {
    im.host_allocator = options.host_allocator;
  } else {
    const config::StatePlacement placement = im.config.placement();
    HostMemoryChoice host = make_host_memory(im.allocator->device(), placement.offloads(), placement.pin_host_memory);
    im.own_host_allocator = std::move(host.allocator);
    im.host_allocator = im.own_host_allocator.get();
    im.host_memory_kind = host.kind;
  }
  im.comm = options.comm;
  im.world = im.comm != nullptr ? im.comm->world_size() : 1;
  if (options.tensor_parallel != nullptr && options.tensor_parallel->world_size() > 1) {
    im.tp = options.tensor_parallel;
    im.tp_group = std::make_unique<CommunicatorTensorGroup>(*im.tp);
    check_tensor_parallel_engine(im.config, im.allocator->device(), im.tp->world_size(), im.tp->backend());
  }
  const int sp_ranks = options.sequence_parallel != nullptr ? options.sequence_parallel->world_size() : 1;
  if (sp_ranks != model_.sequence_parallel_ranks) {
    fail("initialize: the model's layers were built for {} sequence-parallel rank(s) but the engine's sequence-parallel group has {}; build the model "
         "with make_model(architecture, tp, {{rank, {}}})",
         model_.sequence_parallel_ranks, sp_ranks, sp_ranks);
  }
  if (sp_ranks > 1) {
    im.sp = options.sequence_parallel;
    im.sp_group = std::make_unique<CommunicatorSequenceGroup>(*im.sp);
    check_sequence_parallel_engine(im.allocator->device(), sp_ranks, im.sp->backend());
  }
  // (Whether the layers were built for this group is check_shapes' check of their pieces.)
  const int ep_ranks = check_expert_groups(options.expert_parallel, options.expert_data, im.comm);
  if (ep_ranks > 1) {
    im.ep = options.expert_parallel;
    im.ep_group = std::make_unique<CommunicatorExpertGroup>(*im.ep, im.host_value_staging());
    check_expert_parallel_engine(im.config, im.allocator->device(), ep_ranks, im.ep->backend());
  }
  if (options.pipeline != nullptr && options.pipeline->world_size() > 1) {
    im.pp = options.pipeline;
    im.pp_ties = options.pipeline_ties;
  }
  const config::CommsLoggerConfig& cl = im.config.comms_logger;
  if (cl.enabled && options.comm == nullptr) {
    log_warning("comms_logger is enabled, but this run has one rank and no communicator: no collective runs, so there is nothing to log");
  }
  if (cl.enabled && options.comm != nullptr) {
    // DeepSpeed makes every logged collective blocking (an accelerator synchronize) so that its
    // latency is the collective's, not its launch's.
    Communicator* inner = options.comm;
    const Device device = im.allocator->device();
    im.comms_logger = std::make_unique<CommsLogger>(*inner, CommsLoggerOptions{.verbose = cl.verbose,
                                                                               .prof_all = cl.prof_all,
                                                                               .prof_ops = cl.prof_ops,
                                                                               .synchronize = [inner, device] {
                                                                                 synchronize_device(device);
                                                                                 inner->synchronize();
                                                                               }});
    im.comm = im.comms_logger.get();
    if (inner->rank() == 0) {
      if (const std::vector<std::string> unknown = unknown_comms_ops(cl.prof_ops); !unknown.empty()) {
        log_warning(
            "comms_logger.prof_ops names {}, which no collective of dstrain records, so {} never logged; the names are all_reduce, "
            "reduce_scatter_tensor (or reduce_scatter), all_gather_into_tensor (or all_gather), broadcast, barrier, all_to_all_single "
            "(or all_to_all), send, recv",
            fmt::format("\"{}\"", fmt::join(unknown, "\", \"")), unknown.size() == 1 ? "it is" : "they are");
      }
      if (cl.debug) {
        log_warning(
            "comms_logger.debug has no effect: DeepSpeed appends the calling Python function to each op's name, and dstrain's "
            "collectives are logged under their op names alone");
      }
    }
  }
}

// The model, the sequence length, the storage dtype and the batch: refused here, naming the value,
// when they cannot train.
void Engine::check_shapes(const config::DsConfig& config, const EngineOptions& options) {
  Impl& im = *impl_;
  if (model_.layers.empty()) fail("initialize: the model has no layers");
  {
    std::vector<const Layer*> layers;
    for (const auto& l : model_.layers) layers.push_back(l.get());
    check_layers_fit_group(layers, im.tp != nullptr ? im.tp->world_size() : 1);
    check_layers_fit_group(layers, im.ep_size(), PieceGroup::expert_parallel);
  }
  if (model_.n_embd <= 0) fail("initialize: the model's n_embd (width of the residual stream) must be > 0, got {}", model_.n_embd);

  const std::int64_t T = options.sequence_length > 0 ? options.sequence_length : model_.n_positions;
  if (T <= 0 || (model_.n_positions > 0 && T > model_.n_positions)) {
    fail("sequence length T = {} must be between 1 and the model's n_positions = {}", T, model_.n_positions);
  }
  const DType storage = config.fp16.enabled ? DType::fp16 : config.bf16.enabled ? DType::bf16 : DType::fp32;
  im.mixed = storage != DType::fp32;
  if (!options.inject_overflow_steps.empty() && !im.mixed) {
    fail(
        "inject_overflow_steps (--inject-overflow) needs fp16 or bf16 training: fp32 has no overflow check, so an inf gradient would "
        "turn the parameters into NaN; enable \"fp16\" or \"bf16\" in the config");
  }
  if (options.bf16_stochastic_rounding) {
    if (storage != DType::bf16) {
      fail(
          "bf16_stochastic_rounding (--bf16-stochastic-rounding) rounds the bf16 parameter copies; the config trains in {} — enable \"bf16\" "
          "or drop the option",
          dtype_name(storage));
    }
    if (config.optimizer.kind != config::OptimizerKind::adam && config.optimizer.kind != config::OptimizerKind::adamw) {
      fail(
          "bf16_stochastic_rounding (--bf16-stochastic-rounding) is built into the fused Adam/AdamW step; optimizer.type \"{}\" rounds to "
          "nearest — use Adam or AdamW, or drop the option",
          config.optimizer.type);
    }
    im.rounding = StochasticRoundingOptions{true, options.seed};
  }
  dims_ = LayerDims{config.train_micro_batch_size_per_gpu, T, storage};
  gas_ = config.gradient_accumulation_steps;
  train_batch_size_ = config.train_batch_size;
  if (dims_.B <= 0 || gas_ <= 0)
    fail("initialize: the config's batch is not resolved (train_micro_batch_size_per_gpu = {}, gradient_accumulation_steps = {})", dims_.B, gas_);
  lr_ = im.schedule.lr();

  const std::size_t L = model_.layers.size();
  if (L > 65536) fail("initialize: {} layers; dropout keys address at most 65536", L);
  if (gas_ * im.world > 65536) {
    fail("gradient_accumulation_steps {} x world size {} = {} micro-batches per step; dropout keys address at most 65536", gas_, im.world,
         gas_ * im.world);
  }
  im.layers.resize(L);
  if (model_.pipelined()) {
    if (config.zero_optimization.stage >= 3) {
      fail(
          "zero_optimization.stage 3 with pipeline stages: each stage's parameters would be gathered for every micro-batch's forward and again "
          "for its backward (2 x gradient_accumulation_steps all-gathers of the stage per step instead of none), which is why DeepSpeed "
          "forbids ZeRO-2/3 with pipelines; dstrain pipelines run ZeRO stages 0-2. Fix: zero_optimization.stage 0, 1 or 2");
    }
    if (config.optimizer.kind == config::OptimizerKind::onebit_lamb && !model_.shared_params.empty()) {
      fail(
          "optimizer.type \"{}\" with pipeline stages that share '{}' (a tied weight held by two stages): 1-bit LAMB compresses each stage's "
          "whole momentum as one buffer, with one scale per stage, so the two copies would take different steps and drift apart. Fix: "
          "OneBitAdam or ZeroOneAdam (they compress tensor by tensor), a model without tied embeddings, or no pipeline",
          config.optimizer.type, model_.shared_params.front().name);
    }
    if (im.pp == nullptr && model_.chunks.size() > 1)
      fail("initialize: the model has {} pipeline chunks but EngineOptions::pipeline has no second stage", model_.chunks.size());
    if (!model_.shared_params.empty() && im.pp != nullptr && im.pp_ties == nullptr)
      fail("initialize: this stage holds shared parameters ('{}', ...) but EngineOptions::pipeline_ties is null", model_.shared_params.front().name);
  } else if (options.pipeline != nullptr && options.pipeline->world_size() > 1) {
    fail("initialize: EngineOptions::pipeline has {} stages but the model is not a pipeline stage; build it with make_pipeline_stage_model",
         options.pipeline->world_size());
  }
}

// The parameters, gradients and optimizer states, held as the ZeRO stage and the placement say
// (zero/model_states.h), the owned parameters by name, and the optimizer told about them.
void Engine::build_states(const config::DsConfig& config) {
  Impl& im = *impl_;
  const std::size_t L = model_.layers.size();
  const DType storage = dims_.dtype;
  // Per layer, owned params packed decayed first, each view 64-byte aligned.
  std::vector<std::vector<ParamSpec>> specs(L);
  std::vector<std::string> names(L);
  for (std::size_t i = 0; i < L; ++i) {
    specs[i] = model_.layers[i]->params();
    names[i] = model_.layers[i]->name();
  }
  if (config.placement().uses_nvme()) im.io = std::make_unique<IoEngine>(IoOptions::from_config(config.aio));
  im.states = std::make_unique<ModelStates>(specs, names,
                                            zero_settings(config, storage, im.optimizer, *im.allocator, *im.host_allocator, im.io.get(),
                                                          im.comm != nullptr ? im.comm->rank() : 0),
                                            im.comm, *im.allocator, im.ep != nullptr ? im.options.expert_data : nullptr);
  im.optimizer.set_partitioned(config.zero_optimization.stage >= 1 && im.world > 1);
  if (config.optimizer.is_onebit()) im.onebit = std::make_unique<OneBitOptimizer>(config.optimizer, im.comm, *im.allocator);
  for (std::size_t i = 0; i < L; ++i) {
    for (const FlatSlot* sl : im.states->slots(i)) {
      const ParamSpec& ps = specs[i][sl->spec];
      im.by_name.emplace(ps.name, im.owned.size());
      im.owned.push_back({ps, i, sl});
      parameter_count_ += ps.shape.numel();
    }
  }
  if (!im.options.inject_overflow_param.empty() && im.by_name.count(im.options.inject_overflow_param) == 0) {
    fail("inject_overflow_param \"{}\" is not a parameter this rank's model owns (e.g. \"{}\"); name one of its owned parameters",
         im.options.inject_overflow_param, im.owned.empty() ? "-" : im.owned.front().spec.name);
  }
  // A pipeline stage's copies of parameters another stage owns (the norm counts the owner's).
  im.pipeline_copy.assign(im.owned.size(), false);
  for (const SharedParam& sp : model_.shared_params)
    if (sp.copy) im.pipeline_copy[im.by_name.at(sp.name)] = true;
  {
    // Muon's use_muon flags and Adafactor's factored shapes come from the owned parameters' names and
    // shapes (engine/optim/muon.h, engine/optim/adafactor.h).
    std::vector<ParamSpec> owned_specs;
    for (const auto& o : im.owned) owned_specs.push_back(o.spec);
    im.optimizer.set_parameters(owned_specs);
  }
  if (config.optimizer.kind == config::OptimizerKind::muon) {
    const config::SchedulerKind sk = config.scheduler.kind;
    im.optimizer.set_schedule_sets_every_group(sk == config::SchedulerKind::warmup_lr || sk == config::SchedulerKind::warmup_decay_lr ||
                                               sk == config::SchedulerKind::one_cycle || sk == config::SchedulerKind::lr_range_test);
  }
  if (const auto& gad = config.data_types.grad_accum_dtype; gad && *gad != dtype_name(storage) && im.mixed) {
    log_warning(
        "data_types.grad_accum_dtype \"{}\": gradients accumulate in the model dtype ({}) here, each micro-step's sum computed in "
        "fp32 and rounded once; a separate {} accumulation buffer is not kept",
        *gad, dtype_name(storage), *gad);
  }
}

// One line each for what ZeRO partitions and what offload keeps off the device.
void Engine::log_placement() {
  Impl& im = *impl_;
  const config::DsConfig& config = im.config;
  if (config.zero_optimization.stage >= 1) {
    log_info("ZeRO stage {} on {} rank(s): {} padded parameter elements, this rank updates {} of them", config.zero_optimization.stage, im.world,
             im.states->padded_numel(), [&] {
               std::int64_t n = 0;
               for (const PartitionSegment& sg : im.states->partitions()) n += sg.numel;
               return n;
             }());
  }
  if (const ParamStore* ps = im.states->param_store(); ps != nullptr && ps->home() != StateHome::device) {
    const StateStoreBytes b = ps->bytes();
    log_info(
        "offload_param: this rank's parameter partition ({} units, {}) lives in {} ({} bytes in host memory, {} in swap files); "
        "each layer's shard is fetched ahead of its all-gather",
        ps->layout().numel.size(), dtype_name(ps->layout().dtype), ps->home() == StateHome::nvme ? "swap files on NVMe" : "host memory", b.host,
        b.nvme);
  }
  if (im.states->store().home() != StateHome::device) {
    const StateStoreBytes b = im.states->store().bytes();
    if (im.states->store().home() == StateHome::nvme)
      log_info(
          "offload_optimizer: this rank's optimizer partition (fp32 masters and {} optimizer state(s), {} bytes) lives in swap "
          "files on NVMe, {} bytes of it in host buffers ({}) at a time; the optimizer steps there",
          im.states->store().layout().buffer_count() - 1, b.nvme, b.host, im.host_memory_kind);
    else
      log_info(
          "offload_optimizer: this rank's optimizer partition (fp32 masters and {} optimizer state(s), {} bytes) lives in {} memory "
          "({}); the optimizer steps there",
          im.states->store().layout().buffer_count() - 1, b.host + b.nvme, state_home_name(im.states->store().home()), im.host_memory_kind);
  }
}

// Every layer's output and saved activations (or, with checkpointing, what ActivationCheckpointing
// keeps), the residual stream's gradient, and one scratch arena all layers share.
void Engine::build_activations(const config::DsConfig& config, const EngineOptions& options) {
  Impl& im = *impl_;
  const std::size_t L = model_.layers.size();
  const DType storage = dims_.dtype;
  for (const CheckpointingNote& n : activation_checkpointing_notes(config.activation_checkpointing, options.checkpoint_activations)) {
    if (n.warning) {
      log_warning("{}", n.text);
    } else {
      log_info("{}", n.text);
    }
  }
  if (options.checkpoint_activations) {
    im.ckpt = std::make_unique<ActivationCheckpointing>(config.activation_checkpointing, model_.layers, dims_, model_.residual_shape(dims_), *im.allocator,
                                                        im.host_allocator);
    log_info("{}", im.ckpt->describe());
  }
  std::vector<std::vector<ActivationSpec>> act_specs(L), scratch_specs(L);
  std::vector<std::vector<std::size_t>> act_offsets(L);
  std::size_t abytes = 0, sbytes = 0;
  for (std::size_t i = 0; i < L; ++i) {
    if (!im.ckpt) {
      act_specs[i].push_back(model_.layers[i]->output(dims_));
      for (auto& s : model_.layers[i]->saved_activations(dims_)) act_specs[i].push_back(std::move(s));
      abytes = pack(act_specs[i], abytes, act_offsets[i]);
    }
    scratch_specs[i] = model_.layers[i]->scratch(dims_);
    std::vector<std::size_t> unused;
    sbytes = std::max(sbytes, pack(scratch_specs[i], 0, unused));
  }
  abytes = align_up(abytes, kAlignBytes);
  const std::size_t dres_offset = abytes;
  const Shape dres_shape = model_.residual_shape(dims_);
  abytes += static_cast<std::size_t>(dres_shape.numel()) * dtype_size(storage);
  im.act_buf = Buffer(*im.allocator, abytes, MemoryPurpose::activations);
  im.scratch_buf = Buffer(*im.allocator, std::max(sbytes, kAlignBytes), MemoryPurpose::buffers);
  for (std::size_t i = 0; i < L; ++i) {
    Impl::LayerState& ls = im.layers[i];
    if (im.ckpt) {
      ls.input = im.ckpt->input(i);
      ls.output = im.ckpt->output(i);
      ls.recompute_output = im.ckpt->recompute_output(i);
      const auto saved = im.ckpt->saved(i);
      ls.saved.assign(saved.begin(), saved.end());
    } else {
      const auto& a = act_specs[i];
      ls.output = ls.recompute_output = im.act_buf.tensor(a[0].dtype, a[0].shape, act_offsets[i][0]);
      for (std::size_t k = 1; k < a.size(); ++k) ls.saved.push_back(im.act_buf.tensor(a[k].dtype, a[k].shape, act_offsets[i][k]));
      if (i > 0) ls.input = im.layers[i - 1].output;
    }
    std::vector<std::size_t> so;
    pack(scratch_specs[i], 0, so);
    for (std::size_t k = 0; k < scratch_specs[i].size(); ++k) {
      ls.scratch.push_back(im.scratch_buf.tensor(scratch_specs[i][k].dtype, scratch_specs[i][k].shape, so[k]));
    }
  }
  im.dresidual = im.act_buf.tensor(storage, dres_shape, dres_offset);
  if (!im.allocator->device().is_cpu()) {
    im.batch_buf = Buffer(*im.allocator, 2 * static_cast<std::size_t>(dims_.B * dims_.T) * sizeof(std::int32_t), MemoryPurpose::buffers);
  }
}

// The order ZeRO-3 gathers layers in (zero/param_coordinator.h), and the views that never move.
void Engine::set_traces(const config::DsConfig& config) {
  Impl& im = *impl_;
  const std::size_t L = model_.layers.size();
  // ZeRO-3's schedule: a training micro-step calls the layers forward, then backward from the last
  // with each checkpointed segment recomputed right before its last layer's backward.
  std::vector<std::size_t> train_trace, eval_trace;
  for (std::size_t i = 0; i < L; ++i) eval_trace.push_back(i);
  train_trace = eval_trace;
  for (std::size_t k = 0; k < L; ++k) {
    const std::size_t i = L - 1 - k;
    if (im.ckpt) {
      if (const std::int64_t sg = im.ckpt->segment_ending_at(i); sg >= 0) {
        const CheckpointSegment& seg = im.ckpt->segments()[static_cast<std::size_t>(sg)];
        for (std::size_t j = seg.first; j <= seg.last; ++j) train_trace.push_back(j);
      }
    }
    train_trace.push_back(i);
  }
  im.states->set_traces(std::move(train_trace), std::move(eval_trace));
  // Views that never move (below stage 3), so param() works before the first forward.
  if (config.zero_optimization.stage < 3)
    for (std::size_t i = 0; i < L; ++i) im.states->views(i, im.layers[i].params, nullptr);
}

// The initial values: the seed's parameters (or zeros), and the step's counters starting here.
void Engine::init_state(const EngineOptions& options) {
  Impl& im = *impl_;
  im.init_params = options.init_params;
  im.init_seed = options.seed;
  if (options.init_params) im.set_initial_masters();  // else the zeros ModelStates starts from
  im.comm_at_step_start = im.comm != nullptr ? im.zero_comm_stats() : CommStats{};
  if (im.io) im.io_at_step_start = im.io->totals();  // set_masters wrote the NVMe store: not a step's
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

const config::DsConfig& Engine::config() const { return impl_->config; }

// The micro-batch the layers read: checked, its targets counted (over the sequence-parallel group
// too), and a host batch uploaded into `upload` ((2·B·T) int32 on the device; empty on the CPU).
void Engine::set_batch(const Batch& batch, Tensor upload) {
  const Shape bt{dims_.B, dims_.T};
  for (const auto& [what, t] : {std::pair<const char*, const Tensor&>{"tokens", batch.tokens}, {"targets", batch.targets}}) {
    if (t.dtype != DType::int32 || !(t.shape == bt) || t.empty()) {
      fail("Engine::forward: batch {} is {} but int32{} is expected (train_micro_batch_size_per_gpu x sequence length)", what, t.str(), bt.str());
    }
  }
  Impl& im = *impl_;
  im.batch = batch;
  if (batch.targets.device.is_cpu()) im.batch.target_count = count_targets(batch);  // on the host, before any upload
  if (im.sp != nullptr) {
    // Sequence parallelism: the loss is the mean over the whole sequences' targets, so the layers
    // normalise by the group's count (each rank's head: its share of the sum, over that count).
    im.sp_local_targets = count_targets(batch);
    double n = static_cast<double>(im.sp_local_targets);
    all_reduce_host(*im.sp, Tensor(&n, DType::fp64, Shape{1}), ReduceOp::sum, im.host_value_staging());
    im.batch.target_count = static_cast<std::int64_t>(n);
  }
  if (!upload.empty() && batch.tokens.device != im.allocator->device()) {
    // The layers see the uploaded copy, and the device encoder checks ids only against its
    // table's padded rows: check the real vocabulary here, as the CPU embedding does.
    if (model_.vocab_size > 0) check_token_ids(batch.tokens, model_.vocab_size, "Engine::forward");
    im.batch.tokens = Tensor(upload.data, DType::int32, bt, upload.device);
    im.batch.targets = Tensor(static_cast<char*>(upload.data) + static_cast<std::size_t>(bt.numel()) * sizeof(std::int32_t), DType::int32, bt, upload.device);
    copy_tensor(im.batch.tokens, batch.tokens);
    copy_tensor(im.batch.targets, batch.targets);
  }
}

void Engine::forward_layers(const Batch& batch, bool train, float* loss) {
  if (model_.pipelined()) {
    fail("Engine::{}: this engine is a pipeline stage: its micro-batches run through PipelineEngine (engine/pipeline_engine.h), which calls "
         "forward_chunk / backward_chunk / pipeline_step",
         train ? "forward" : "evaluate");
  }
  Impl& im = *impl_;
  const Shape bt{dims_.B, dims_.T};
  set_batch(batch, !im.batch_buf.empty() ? im.batch_buf.tensor(DType::int32, Shape{2 * bt.numel()}) : Tensor{});
  im.states->begin_pass(train);
  im.moe.begin(train);
  for (std::size_t i = 0; i < model_.layers.size(); ++i) {
    if (im.ckpt) im.ckpt->before_forward(i, train);  // keep_input at a segment's start
    forward_layer(i, train, loss, false);
    if (im.ckpt) im.ckpt->after_forward(i, train);
  }
  if (!train) im.states->end_eval();
  if (loss != nullptr) *loss = whole_sequence_loss(*loss) + moe_aux_term();
}

// Layer i's forward on the current batch; `recompute`: the checkpointed re-run before its backward
// (same RngKey, so the same dropout masks; the output goes to its slot in the segment area).
void Engine::forward_layer(std::size_t i, bool train, float* loss, bool recompute) {
  Impl& im = *impl_;
  Impl::LayerState& ls = im.layers[i];
  im.states->acquire(i);  // ZeRO-3: gathered (or prefetched earlier)
  im.states->views(i, ls.params, nullptr);
  ForwardArgs a;
  a.dims = dims_;
  a.batch = im.batch;
  a.input = ls.input;
  a.output = recompute ? ls.recompute_output : ls.output;
  a.params = ls.params;
  a.saved = ls.saved;
  a.scratch = ls.scratch;
  a.rng = RngKey{im.options.seed, static_cast<std::uint32_t>(global_steps_), static_cast<std::uint32_t>(model_.layer_id(i)), global_micro_batch(), 0};
  a.train = train;
  a.loss = loss;
  // Training: the loss layer computes its gradient in the same pass (the scale backward would use
  // is already known: it changes only at the optimizer step).
  a.fuse_loss_grad = train && !recompute && model_.layers[i]->fuses_loss_grad();
  a.dloss = micro_batch_dloss();
  a.tensor_parallel = im.tp_group.get();
  a.sequence_parallel = im.sp_group.get();
  a.expert_parallel = im.ep_group.get();
  a.moe = &im.moe;
  im.moe.recording = !recompute;  // a checkpointed recompute routes the same tokens again: counted once
  model_.layers[i]->forward(a);
  im.moe.recording = true;
  im.states->release(i);
}

float Engine::forward(const Batch& batch) {
  float loss = 0.0f;
  forward_layers(batch, true, &loss);
  have_forward_ = true;
  last_loss_ = loss;
  return loss;
}

float Engine::evaluate(const Batch& batch) {
  float loss = 0.0f;
  have_forward_ = false;  // the saved activations are now the evaluation's
  forward_layers(batch, false, &loss);
  return loss;
}

void Engine::backward() {
  if (model_.pipelined()) fail("Engine::backward: this engine is a pipeline stage: PipelineEngine (engine/pipeline_engine.h) runs its micro-batches");
  if (!have_forward_) fail("Engine::backward: call forward(batch) first (backward reads the activations the forward saved)");
  if (have_backward_) {
    fail(
        "Engine::backward: step() was not called after the previous backward(); every backward() is followed by step(), which counts "
        "the micro-step (and at the gradient-accumulation boundary reduces and applies the gradients), as DeepSpeed's engine pairs them");
  }
  have_forward_ = false;  // the head turns its logits into their gradient in place
  Impl& im = *impl_;
  const std::size_t last = model_.layers.size() - 1;
  const bool boundary = is_gradient_accumulation_boundary();
  const float dloss = micro_batch_dloss();
  // DeepSpeed's bwd_inner / bwd_allreduce: the host time in the gradient reduction (after_backward's
  // bucket reductions as layers finish, end_backward's flush and wait) is bwd_allreduce, the rest
  // of this call bwd_inner.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point backward_start = Clock::now();
  Clock::duration reduction{0};
  for (std::size_t k = 0; k <= last; ++k) {
    const std::size_t i = last - k;
    if (im.ckpt) {
      // Checkpointing: before the backward of a segment's last block, run the segment forward
      // again from its kept input, regenerating every saved activation bit for bit.
      if (const std::int64_t s = im.ckpt->segment_ending_at(i); s >= 0) {
        const CheckpointSegment& sg = im.ckpt->segments()[static_cast<std::size_t>(s)];
        im.ckpt->begin_recompute(static_cast<std::size_t>(s));
        for (std::size_t j = sg.first; j <= sg.last; ++j) forward_layer(j, true, nullptr, true);
        im.ckpt->end_recompute(static_cast<std::size_t>(s));
      }
    }
    reduction += backward_layer(i, boundary, dloss);
    if (im.ckpt) im.ckpt->after_backward(i);
  }
  end_backward_timed(boundary, backward_start, reduction);
  step_loss_sum_ += static_cast<double>(last_loss_);
  have_backward_ = true;
  boundary_reduced_ = boundary;
}

// Layer i's backward from the residual gradient (or, for the layer ending in the loss, from
// `dloss`), its gradients reduced as the ZeRO stage says; returns the host time of the reduction
// (DeepSpeed's bwd_allreduce). The layer's dropout key is its index in the whole model and the
// micro-batch's global slot, as its forward's.
std::chrono::steady_clock::duration Engine::backward_layer(std::size_t i, bool boundary, float dloss) {
  Impl& im = *impl_;
  const std::size_t id = model_.layer_id(i);
  Impl::LayerState& ls = im.layers[i];
  im.states->acquire(i);
  im.states->before_backward(i);
  im.states->views(i, ls.params, &ls.grads);
  BackwardArgs a;
  a.dims = dims_;
  a.batch = im.batch;
  a.input = ls.input;
  a.output = ls.recompute_output;
  a.dout = id == model_.whole_layer_count() - 1 ? Tensor{} : im.dresidual;
  a.dinput = id == 0 ? Tensor{} : im.dresidual;
  a.params = ls.params;
  a.grads = ls.grads;
  a.saved = ls.saved;
  a.scratch = ls.scratch;
  a.rng = RngKey{im.options.seed, static_cast<std::uint32_t>(global_steps_), static_cast<std::uint32_t>(id), global_micro_batch(), 0};
  a.train = true;
  a.dloss = dloss;
  a.loss_grad_done = model_.layers[i]->fuses_loss_grad();  // every training forward fused it (forward_layer)
  a.tensor_parallel = im.tp_group.get();
  a.sequence_parallel = im.sp_group.get();
  a.expert_parallel = im.ep_group.get();
  a.moe = &im.moe;
  model_.layers[i]->backward(a);
  // Layer i's own gradients are complete (tied users come later in the model, so earlier in
  // backward): reduce them now, overlapped with the layers below when overlap_comm.
  const auto reduce_start = std::chrono::steady_clock::now();
  im.states->after_backward(i, boundary);
  const auto reduction = std::chrono::steady_clock::now() - reduce_start;
  im.states->release(i);
  return reduction;
}

// The end of a backward pass: the gradient reduction flushed (`boundary`) and waited for, and the
// pass's host time split as DeepSpeed's bwd_inner / bwd_allreduce (EngineState).
void Engine::end_backward_timed(bool boundary, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::duration reduction) {
  Impl& im = *impl_;
  const auto end_start = std::chrono::steady_clock::now();
  im.states->end_backward(boundary);
  const auto end = std::chrono::steady_clock::now();
  reduction += end - end_start;
  const auto ms = [](std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  im.backward_allreduce_ms = ms(reduction);
  im.backward_inner_ms = ms(end - start - reduction);
}

// The dropout stream of this micro-batch: its global slot in the step (the data loader gives rank
// r at micro-step m slot m·W + r), so masks are the same for any world size and GAS split.
std::uint32_t Engine::global_micro_batch() const {
  // A pipeline names the micro-batch it runs (micro-batches interleave there).
  const std::int64_t m = impl_->pipeline_micro >= 0 ? impl_->pipeline_micro : micro_steps_ % gas_;
  return static_cast<std::uint32_t>(m * impl_->world + impl_->states->rank());
}

bool Engine::is_gradient_accumulation_boundary() const { return (micro_steps_ + 1) % gas_ == 0; }

void Engine::set_lr_schedule(LrHook hook) {
  impl_->hook = std::move(hook);
  lr_ = impl_->hook ? impl_->hook(global_steps_ - skipped_steps_) : impl_->schedule.lr();
}

EngineState Engine::state() const {
  EngineState st;
  st.global_steps = global_steps_;
  st.global_samples = global_samples_;
  st.micro_steps = micro_steps_;
  st.skipped_steps = skipped_steps_;
  st.lr = lr_;
  st.last_step_lr = last_step_lr_;
  st.betas = impl_->optimizer.betas();
  if (!impl_->hook)
    if (const auto b = impl_->schedule.betas()) st.betas = *b;
  st.loss_scale = impl_->scaler.scale();
  st.last_loss = last_loss_;
  st.last_step_loss = last_step_loss_;
  st.grad_norm = grad_norm_;
  st.clip_coefficient = clip_coef_;
  st.last_backward_inner_ms = impl_->backward_inner_ms;
  st.last_backward_allreduce_ms = impl_->backward_allreduce_ms;
  st.last_aux_loss = impl_->last_aux_loss;
  return st;
}


// The owned parameter a (possibly tied) name refers to; Error naming it when unknown.
std::size_t owned_param_index(const Model& model, const std::unordered_map<std::string, std::size_t>& by_name, std::size_t count,
                        const std::string& first_name, std::string_view name) {
  std::string key(name);
  // A tied name (GPT-2's "lm_head.weight") resolves to its owner.
  for (const auto& layer : model.layers)
    for (const ParamSpec& ps : layer->params())
      if (ps.tied() && ps.name == name) key = ps.tied_to;
  const auto it = by_name.find(key);
  if (it == by_name.end()) {
    fail("Engine: no parameter named '{}'; the model's parameters are {} names such as '{}' (param_names() lists them)", name, count, first_name);
  }
  return it->second;
}


Tensor Engine::param(std::string_view name) const {
  const Impl& im = *impl_;
  const Impl::Owned& o = im.owned[owned_param_index(model_, im.by_name, im.owned.size(), im.owned.empty() ? "-" : im.owned.front().spec.name, name)];
  const Tensor t = im.states->full_param(o.layer, *o.slot);
  if (t.empty()) {
    fail(
        "Engine::param('{}'): ZeRO stage 3 partitions this parameter across the {} ranks, so no rank holds it whole; use "
        "gather_master_params() (collective) for its value",
        name, im.world);
  }
  return t;
}

Tensor Engine::master_param(std::string_view name) const {
  const Impl& im = *impl_;
  const Impl::Owned& o = im.owned[owned_param_index(model_, im.by_name, im.owned.size(), im.owned.empty() ? "-" : im.owned.front().spec.name, name)];
  const Tensor t = im.states->full_master(o.layer, *o.slot);
  if (t.empty()) {
    fail("Engine::master_param('{}'): ZeRO stage {} partitions the fp32 masters across the {} ranks; use gather_master_params() (collective)", name,
         im.config.zero_optimization.stage, im.world);
  }
  return t;
}

Tensor Engine::grad(std::string_view name) const {
  const Impl& im = *impl_;
  const Impl::Owned& o = im.owned[owned_param_index(model_, im.by_name, im.owned.size(), im.owned.empty() ? "-" : im.owned.front().spec.name, name)];
  if (boundary_reduced_ && im.world > 1 && im.config.zero_optimization.stage == 1) {
    fail(
        "Engine::grad('{}'): at ZeRO stage 1 the boundary backward reduce-scatters the gradients in place, so until step() each rank "
        "holds averaged values only in its own partition beside local sums elsewhere; read grads before the boundary backward, or "
        "after step() (they are zero then)",
        name);
  }
  const Tensor t = im.states->full_grad(o.layer, *o.slot);
  if (t.empty()) {
    fail("Engine::grad('{}'): ZeRO stage {} keeps only each rank's partition of the averaged gradients", name, im.config.zero_optimization.stage);
  }
  return t;
}

void Engine::gather_master_params(const std::function<void(const std::string& name, const Tensor& fp32)>& fn) {
  Impl& im = *impl_;
  im.states->gather_masters([&](std::size_t layer, const FlatSlot& slot, const Tensor& t) {
    const ParamSpec& spec = im.states->spec(layer, slot);
    Communicator* group = im.piece_group(spec);
    if (group == nullptr) {
      fn(spec.name, t);
      return;
    }
    // Tensor or expert parallelism: the whole parameter from the group's pieces.
    std::vector<float> host_piece(static_cast<std::size_t>(t.numel()));
    copy_tensor(Tensor(host_piece.data(), DType::fp32, t.shape), t);
    std::vector<float> whole(static_cast<std::size_t>(spec.whole_shape().numel()));
    gather_whole(*group, spec, Tensor(host_piece.data(), DType::fp32, spec.shape), Tensor(whole.data(), DType::fp32, spec.whole_shape()),
                 im.host_value_staging());
    fn(spec.name, Tensor(whole.data(), DType::fp32, spec.whole_shape()));
  });
}

int Engine::rank() const { return impl_->states->rank(); }
int Engine::world_size() const { return impl_->world; }
Device Engine::device() const { return impl_->allocator->device(); }
void Engine::synchronize() const { synchronize_device(device()); }

EngineReport Engine::report() const {
  const Impl& im = *impl_;
  EngineReport out;
  out.memory = im.allocator->stats();
  out.host_memory = im.host_allocator->stats();
  out.parameter_count = parameter_count_;
  out.checkpointing = im.ckpt.get();
  if (im.comms_logger) out.comms = &im.comms_logger->log();
  const MemoryStats& m = out.memory;
  ZeroReport& r = out.zero;
  r.stage = im.config.zero_optimization.stage;
  r.rank = rank();
  r.world_size = im.world;
  r.param_bytes = m[MemoryPurpose::params].current;
  r.grad_bytes = m[MemoryPurpose::grads].current;
  r.optimizer_bytes = m[MemoryPurpose::optimizer].current;
  r.host_optimizer_bytes = out.host_memory[MemoryPurpose::optimizer].current;
  const MemoryStats& host = out.host_memory;
  for (MemoryPurpose p : kAllMemoryPurposes) {
    r.device_bytes[static_cast<std::size_t>(p)] = m[p].current;
    r.host_bytes[static_cast<std::size_t>(p)] = host[p].current;
  }
  const StateStore& store = im.states->store();
  r.optimizer_home = store.home();
  r.nvme_bytes[static_cast<std::size_t>(MemoryPurpose::optimizer)] = store.bytes().nvme;
  // offload_param "nvme" keeps the parameter partition in its own swap file (docs/offload.md §6, §9).
  if (const ParamStore* params = im.states->param_store()) r.nvme_bytes[static_cast<std::size_t>(MemoryPurpose::params)] = params->bytes().nvme;
  const auto io = [](const IoEngine::Totals& t) { return OffloadIo{t.bytes_read, t.bytes_written, t.wait_seconds}; };
  r.step_io = io(im.step_io);
  r.train_io = io(im.train_io);
  r.peak_bytes = m.total.peak;
  r.padded_param_elements = im.states->padded_numel();
  r.peak_gathered_param_elements = im.states->peak_gathered_elements();
  r.secondary_param_bytes = im.states->secondary_param_bytes();
  r.step_comm = im.step_comm;
  return out;
}

void Engine::all_reduce_sum(std::span<float> values) {
  if (values.empty()) return;
  impl_->states->all_reduce_sum(Tensor(values.data(), DType::fp32, Shape{static_cast<std::int64_t>(values.size())}));
}

std::vector<std::string> Engine::param_names() const {
  std::vector<std::string> names;
  for (const Impl::Owned& o : impl_->owned) names.push_back(o.spec.name);
  return names;
}

GenerationModel Engine::generation_model() {
  Impl& im = *impl_;
  // ZeRO-3: gather every layer (collective) and keep it until the next pass.
  im.states->acquire_all();
  for (std::size_t i = 0; i < im.layers.size(); ++i) im.states->views(i, im.layers[i].params, nullptr);
  GenerationModel g;
  for (const auto& layer : model_.layers) g.layers.push_back(layer.get());
  // Impl is heap-allocated: its address survives a move of the Engine, `this` would not.
  const Impl* imp = impl_.get();
  g.params = [imp](std::size_t i) { return std::span<const Tensor>(imp->layers[i].params); };
  g.vocab_size = model_.vocab_size;
  g.n_positions = model_.n_positions;
  g.dtype = dims_.dtype;
  return g;
}


// ---- collectives of the training loop and the checkpoint manager ----

void Engine::exclude_from_step_comm() {
  Impl& im = *impl_;
  // Between optimizer steps only: then no collective of the next step has been counted yet.
  if (micro_steps_ % gas_ != 0 || have_backward_) return;
  if (im.comm != nullptr) im.comm_at_step_start = im.zero_comm_stats();
  if (im.io) im.io_at_step_start = im.io->totals();  // a checkpoint reads the NVMe store too
}

void Engine::all_reduce_host_sum(Communicator& world, std::span<double> values) {
  if (values.empty() || world.world_size() == 1) return;
  Impl& im = *impl_;
  // When the engine's group is the whole world (no tensor or pipeline groups beside it), through
  // the engine's communicator, so that comms_logger counts it with the step's collectives.
  const bool engine_group_is_world = im.comm != nullptr && im.world == world.world_size() && im.tp == nullptr && im.pp == nullptr;
  all_reduce_host(engine_group_is_world ? *im.comm : world, Tensor(values.data(), DType::fp64, Shape{static_cast<std::int64_t>(values.size())}),
                  ReduceOp::sum, im.host_value_staging());
  exclude_from_step_comm();
}

void Engine::agree_on_errors(const std::string& error) {
  Impl& im = *impl_;
  // The whole mesh agrees: the data-parallel group, then (tensor parallelism) the tensor-parallel
  // group, so that every rank of every group throws the same cause (the checkpoints' phases).
  const int tp_size = im.tp_size();
  const int pp_size = im.pp != nullptr ? im.pp->world_size() : 1;
  const int mesh = im.world * tp_size * pp_size;
  if (mesh == 1) {
    if (!error.empty()) throw Error(error);
    return;
  }
  // One all-reduce per group of every rank's failure flag and the first characters of its message
  // (one byte per fp64, mesh rank m's in slot m: m = data-parallel rank x TP + tensor-parallel rank),
  // so that every rank throws the cause of the first failing rank.
  constexpr std::size_t kChars = 480;
  const std::size_t slot = kChars + 1;
  const int me_rank = ((im.pp != nullptr ? im.pp->rank() : 0) * im.world + rank()) * tp_size + im.tp_rank();
  std::vector<double> v(slot * static_cast<std::size_t>(mesh), 0.0);
  const std::size_t me = slot * static_cast<std::size_t>(me_rank);
  if (!error.empty()) {
    v[me] = 1.0;
    for (std::size_t i = 0; i < std::min(kChars, error.size()); ++i) v[me + 1 + i] = static_cast<unsigned char>(error[i]);
  }
  const Tensor all(v.data(), DType::fp64, Shape{static_cast<std::int64_t>(v.size())});
  if (im.world > 1) im.states->all_reduce_sum(all);
  if (im.tp != nullptr) im.tp->all_reduce(all, ReduceOp::sum);
  if (im.pp != nullptr) im.pp->all_reduce(all, ReduceOp::sum);
  for (int k = 0; k < mesh; ++k) {
    const std::size_t at = slot * static_cast<std::size_t>(k);
    if (v[at] == 0.0) continue;
    if (k == me_rank) throw Error(error);
    std::string text;
    for (std::size_t i = 0; i < kChars && v[at + 1 + i] != 0.0; ++i) text.push_back(static_cast<char>(static_cast<unsigned char>(v[at + 1 + i])));
    if (error.empty()) throw Error(text);
    throw Error(error);
  }
}

Engine initialize(Model model, const config::DsConfig& config, const EngineOptions& options) { return Engine(std::move(model), config, options); }

}  // namespace dstrain
