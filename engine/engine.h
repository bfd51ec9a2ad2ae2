// Engine: the training step loop over layers (docs/design.md "The step, as data flows"), in the shape of
// DeepSpeed's engine:
//
//   dstrain::Engine engine = dstrain::initialize(dstrain::make_gpt2_model("gpt2:d12"), ds_config,
//                                                {.seed = 42, .sequence_length = 1024});
//   for (...) {                        // every micro-batch
//     float loss = engine.forward(batch);   // batch: (B, T) int32 tokens and targets
//     engine.backward();                     // grads += d(loss / GAS)/d(params)
//     engine.step();                         // optimizer step at every GAS-th call
//   }
//
// What it does: CPU or one CUDA GPU per rank (the allocator's device), fp32 / fp16 / bf16, ZeRO stages 0-3 on the ranks of `options.comm` (one rank
// without it; zero/model_states.h holds the params, grads and optimizer states as each stage
// says). Every rank runs the same calls on its own micro-batch; gradients are averaged over the
// ranks, so W ranks with micro-batch B train like one rank with W·B. At stage 0 on one rank:
//   params      one flat fp32 buffer per layer (its owned parameters, each view 64-byte aligned;
//               a tied parameter is a view of its owner in an earlier layer)
//   grads       one flat buffer per layer, the same layout
//   optimizer   the optimizer's states (Adam/AdamW/Lamb m and v; SGD its momentum buffer, or none),
//               one flat buffer each per layer, the same layout (docs/optimizers.md §2)
//   activations every layer's output and saved activations for one micro-batch (B, T), plus the
//               residual-stream gradient (B, T, C) that backward runs through in place; with
//               checkpoint_activations, only the kept inputs and one segment's activations
//               (engine/activation_checkpointing.h) plus that gradient
//   buffers     one scratch arena, as large as the largest layer's scratch
//
// Mixed precision (fp16.enabled or bf16.enabled, docs/precision.md): the layers run in that storage
// dtype; params and grads above are 16-bit, and each layer adds an fp32 master copy (purpose
// optimizer) that the optimizer updates, writing the 16-bit copy in the same pass. fp16 backward
// multiplies dloss by the loss scale; at the boundary one overflow + norm pass per layer feeds
// the LossScaler (engine/loss_scaler.h), which either skips the step (grads zeroed, no optimizer
// or LR-schedule step, skipped_steps += 1, global_steps += 1) or un-scales and clips with the
// updated scale inside the optimizer's pass.
//
// The learning rate (and OneCycle's betas) come from the config's "scheduler" block: a
// dstrain::LrSchedule built at construction from the optimizer's lr and betas, read before every
// optimizer step and stepped after it (docs/lr_schedules.md §1: optimizer step k uses the value for it = k - 2,
// the constructor's for k = 1). Without a scheduler block the lr is optimizer.params.lr, constant.
// An embedding program may override it with set_lr_schedule(hook).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config_schema/ds_config.h"
#include "engine/activation_checkpointing.h"
#include "engine/generate.h"
#include "engine/lr_schedule.h"
#include "engine/zero_report.h"
#include "models/moe_stats.h"
#include "models/model.h"
#include "ops/allocator.h"
#include "ops/memory_stats.h"
#include "ops/tensor.h"
#include "models/layer.h"
#include "zero/comms_logger.h"
#include "zero/communicator.h"

namespace dstrain {

struct EngineOptions {
  std::uint64_t seed = 0;  // parameter init (param_init.h) and dropout streams
  // The data-parallel group this rank trains in (zero/communicator.h): the local backend's ranks
  // (threads of one process) or NCCL's. nullptr: one rank. Its world size must be the config's
  // data_parallel_world_size; every rank calls the same Engine methods in the same order (the
  // collective ones are marked so below).
  Communicator* comm = nullptr;
  // Tensor parallelism (docs/parallelism.md): the mesh's tensor-parallel group this rank's layers
  // split their weights across, the model built with make_model(architecture, {tp rank, tp size})
  // (an Error otherwise). `comm` is then the data-parallel group of this rank's tensor-parallel
  // index: ZeRO shards and reduces the pieces along it. nullptr: no tensor parallelism.
  Communicator* tensor_parallel = nullptr;
  // Sequence parallelism (DeepSpeed-Ulysses, docs/parallelism.md): the mesh's sequence-parallel
  // group, the model built with make_model(architecture, tp, {sp rank, sp size}). Every batch is
  // this rank's share of the sequences (sequence_length = T / SP tokens); `comm` is then the data
  // group (DP x SP ranks of this rank's tensor-parallel index), over which ZeRO partitions and
  // reduces. The loss is the mean over the whole sequences' targets. nullptr: none.
  Communicator* sequence_parallel = nullptr;
  // Pipeline parallelism (docs/parallelism.md §7): the mesh's pipeline group (its rank the stage),
  // the model this rank's stage of it (make_pipeline_stage_model, models/pipeline_stage.h), and
  // `comm` the data group of the stage. The step then runs through the pipeline calls below
  // (forward_chunk, backward_chunk, pipeline_step; engine/pipeline_engine.h schedules them), not
  // forward/backward/step. nullptr: no pipeline.
  Communicator* pipeline = nullptr;
  // The ranks holding the model's shared parameters (Model::shared_params: GPT-2's tied embedding
  // on the first and last stages), over which their gradients are summed every step: every rank of
  // those stages with this rank's tensor-parallel index. nullptr when this rank holds none.
  Communicator* pipeline_ties = nullptr;
  // Expert parallelism (expert_parallel.autoep_size, docs/parallelism.md §8): the mesh's
  // expert-parallel group — the EP ranks of `comm` whose experts differ, the model built with
  // make_model(architecture, tp, sp, {ep rank, ep size}) — over which the MoE layers send their
  // tokens to the experts' ranks and back, and the expert-data-parallel group (the ranks of `comm`
  // holding the same experts) over which ZeRO shards, reduces and gathers the experts' parameters;
  // the others stay sharded over `comm`. Both or neither; nullptr: no expert parallelism.
  Communicator* expert_parallel = nullptr;
  Communicator* expert_data = nullptr;
  // Per chunk of the model (Model::chunks), the most micro-batches whose activations it holds at
  // once (the schedule's max_in_flight): the activation sets the engine allocates. Empty: 1 each.
  std::vector<int> pipeline_in_flight{};
  // Recompute the blocks of each chunk in segments of this many (pipeline.activation_checkpoint_interval;
  // checkpoint_activations without it: 1). 0: keep every activation.
  std::int64_t pipeline_checkpoint_interval = 0;
  std::int64_t sequence_length = 0;  // T of every micro-batch; 0: the model's n_positions
  bool init_params = true;           // false: parameters start at zero (e.g. load_weights follows)
  // Where the engine trains: every parameter, gradient, optimizer state and activation lives in
  // `allocator`'s memory (its device decides: cpu, or cuda:N with the CUDA backend). nullptr: an
  // allocator of the engine's own for `device` (its statistics are this rank's alone).
  Allocator* allocator = nullptr;
  Device device = Device::cpu();  // used only when allocator is nullptr
  // Activation checkpointing on (engine/activation_checkpointing.h); the config's
  // "activation_checkpointing" section configures it. `dstrain train --checkpoint-activations`.
  bool checkpoint_activations = false;
  // Host memory: cpu_checkpointing's kept activations and, with zero_optimization.offload_optimizer
  // (device "cpu"), the optimizer partition — the fp32 masters and the optimizer states
  // (docs/training_state.md §3). nullptr: one of the engine's own (pinned on a GPU). On the CPU
  // device it is still an allocator apart from `allocator`, so the statistics say where each byte
  // lives: with optimizer offload `allocator` counts no optimizer bytes.
  Allocator* host_allocator = nullptr;
  // bf16 training: round the bf16 parameter copies stochastically from the fp32 masters after
  // each Adam/AdamW step (llm.c's choice; unbiased, deterministic for the seed, the same on CPU
  // and GPU and for any ZeRO split) instead of to nearest (DeepSpeed's). `--bf16-stochastic-rounding`.
  bool bf16_stochastic_rounding = false;
  // Test hook for loss scaling (`dstrain train --inject-overflow`): at these optimizer steps
  // (1-based) one gradient element is set to +inf before the overflow check, as a real fp16
  // overflow would. Only with fp16 or bf16 (fp32 has no overflow check: the update would be NaN).
  std::vector<std::int64_t> inject_overflow_steps{};
  // ... into this parameter (its name, e.g. "model.layers.1.mlp.experts.down_proj.weight"): the
  // first of its gradient elements this rank holds, where an overflow in that tensor would put it;
  // a rank that holds none of it injects nothing. Empty: the first gradient element the rank holds.
  std::string inject_overflow_param{};
};

// An embedding program's own LR rule: the LR of optimizer step `step` (0-based: the first step is 0).
// Called once per step index, before that step's update. (Not named LrSchedule: that is the class
// of DeepSpeed's schedulers, engine/lr_schedule.h, which the engine builds from the config.)
using LrHook = std::function<double(std::int64_t step)>;

// The counters and scalars of the training so far (Engine::state()), as DeepSpeed's engine exposes
// them (global_steps, global_samples, get_lr(), the loss scaler's cur_scale, ...).
struct EngineState {
  std::int64_t global_steps = 0;    // optimizer steps taken (skipped ones included, as in DeepSpeed)
  std::int64_t global_samples = 0;  // global_steps x train_batch_size
  std::int64_t micro_steps = 0;     // step() calls
  std::int64_t skipped_steps = 0;   // optimizer steps skipped for an inf/NaN gradient (fp16 / bf16)
  // The LR the next optimizer step will use (DeepSpeed's get_lr() after a step), and the one the
  // last step used (0 before the first step).
  double lr = 0.0;
  double last_step_lr = 0.0;
  // The Adam betas the next optimizer step will use: OneCycle's (cycled beta1, 0.99) when it
  // cycles momentum, else the optimizer's.
  std::pair<double, double> betas{0.0, 0.0};
  double loss_scale = 1.0;      // what the next backward multiplies by (fp16; 1 for bf16 / fp32)
  float last_loss = 0.0f;       // the last forward's micro-batch loss
  float last_step_loss = 0.0f;  // mean of the micro-batch losses of the last optimizer step
  // Global L2 norm of the last step's grads before clipping (un-scaled under fp16); -1 when they
  // held an inf/NaN (fp16 / bf16), as DeepSpeed reports it.
  double grad_norm = 0.0;
  float clip_coefficient = 1.0f;  // 1, or c / (norm + 1e-6) when that is < 1 (1 for a skipped step)
  // The last backward()'s host time split as DeepSpeed's wall_clock_breakdown names it:
  // bwd_inner, the layers' backward (recomputes and ZeRO-3 gathers included); bwd_allreduce, the
  // gradient reduction (the buckets reduced as layers finish, the last one flushed and waited for).
  double last_backward_inner_ms = 0.0;
  double last_backward_allreduce_ms = 0.0;
  // Mixture of experts: the last forward's load-balancing loss, unweighted (Hugging Face's
  // load_balancing_loss_func; models/moe_stats.h); the loss above includes it × its coefficient
  // when the model's config asks for it (output_router_logits). 0 without sparse layers. Under a
  // pipeline every stage has the whole model's, of the last micro-batch whose backward it ran (the
  // last stage also an evaluation's).
  double last_aux_loss = 0.0;
};

// What the engine holds, where, and what it sent (Engine::report()).
struct EngineReport {
  ZeroReport zero;     // ZeRO's bytes by purpose and location, the last step's collectives and NVMe traffic
  MemoryStats memory;  // the training allocator's statistics by purpose (current and peak)
  // Host memory held apart from the device (EngineOptions::host_allocator): cpu_checkpointing's
  // kept inputs (purpose activations) and the offloaded optimizer partition (purpose optimizer).
  MemoryStats host_memory;
  // Every owned parameter element (tied ones once, padding rows included).
  std::int64_t parameter_count = 0;
  // The checkpointing state (segments, transfers, profile); nullptr when checkpointing is off.
  const ActivationCheckpointing* checkpointing = nullptr;
  // The comms_logger's records of this rank's collectives (zero/comms_logger.h); nullptr when the
  // config's comms_logger is not enabled or the engine has no communicator.
  const CommsLog* comms = nullptr;
};

// Error when this build's Engine would refuse `config` for what it asks of the engine alone (offload,
// Apex AMP, fp16 with bf16, Lamb's combinations, managed_gradient_accumulation, the optimizer's type
// and params) — the message the Engine's constructor gives. `dstrain check-config` calls it, so a
// config it calls valid is one `dstrain train` trains. What depends on the machine is left to
// machine_findings: configs are checked on a login node for the compute nodes.
void check_engine_trains(const config::DsConfig& config);

// What `config` asks of this machine that this machine does not give: the swap folders named by
// nvme_path (missing, not a folder, not writable, on tmpfs), one message each naming the key and
// the fix, in the order the engine checks them at initialize; empty when there is none. The space
// they need depends on the model, and is checked by the engine only. `dstrain check-config` prints
// these as findings about this machine (exit 0); the engine refuses each before step 1.
std::vector<std::string> machine_findings(const config::DsConfig& config);

class Engine {
 public:
  // Use dstrain::initialize(). Validates that the config asks only for what this engine provides
  // (Error naming the key and value otherwise) and allocates everything.
  Engine(Model model, const config::DsConfig& config, const EngineOptions& options);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- the step ----
  // Runs the layers forward on `batch` ((B, T) int32 tokens and targets, B = the config's
  // train_micro_batch_size_per_gpu, T = sequence_length()), dropout on. Returns the micro-batch's
  // mean loss. The batch may be in host memory or on the engine's device (host batches are
  // uploaded into a buffer of the engine's); its memory must stay valid until backward() returns.
  float forward(const Batch& batch);
  // Runs the layers backward from the last forward: grads += d(loss / GAS)/d(params) (docs/batch.md §5:
  // every backward divides the loss by gradient_accumulation_steps).
  void backward();
  // Call after every backward (an Error otherwise, and for a second backward() before it). At the gradient-accumulation boundary (every GAS-th call):
  // global grad norm, clipping to gradient_clipping (docs/precision.md §7), optimizer update at state().lr (and state().betas), the LR schedule
  // stepped, grads zeroed, global_steps += 1, global_samples += train_batch_size. Under fp16 / bf16 the overflow check comes first: a skipped step
  // changes no parameter, optimizer state or LR schedule, but still counts in global_steps and skipped_steps. Otherwise only counts the micro-step.
  void step();
  // True when the next step() call will update the parameters ((micro_steps + 1) % GAS == 0).
  bool is_gradient_accumulation_boundary() const;

  // The mean loss of `batch` with dropout off, for validation; touches no gradient or counter.
  // (Overwrites the saved activations: call it between step() and the next forward().)
  float evaluate(const Batch& batch);

  // ---- pipeline stages (EngineOptions::pipeline; engine/pipeline_engine.h runs a schedule of them) ----
  // One optimizer step is gradient_accumulation_steps micro-batches m = 0 .. GAS-1, each run forward
  // and backward once through every chunk c of this rank (Model::chunks), in the schedule's order;
  // then pipeline_step(). Activations of (c, m) live in its slot m % pipeline_in_flight[c] until
  // its backward.
  // The forward of chunk c on micro-batch m: the chunk holding the model's first layer reads the
  // tokens, every other one pipeline_input(c, m) (received before the call); `batch` must stay
  // valid until backward_chunk(c, m) returns. Returns the micro-batch's loss on the chunk holding
  // the loss (0 elsewhere; a mixture of experts' load-balancing term included); its output to send
  // is pipeline_output(c, m). With sparse layers the router statistics go alike: the running ones in
  // pipeline_input_stats(c, m), this chunk's added in pipeline_output_stats(c, m).
  float forward_chunk(int chunk, int micro, const Batch& batch);
  // The backward of chunk c on micro-batch m, from d(loss)/d(output) in pipeline_grad_in(k % 2)
  // (received before the call) unless the chunk holds the loss, k being the number of
  // backward_chunk calls of this step before this one; the gradient at its input is then in
  // pipeline_grad_out(k % 2), until backward k + 2. Two buffers each, so that a gradient can be in
  // flight (sent or received) while the next backward runs. With sparse layers the whole model's
  // router statistics of m come with the gradient (pipeline_grad_in_stats(k % 2); the chunk holding
  // the loss kept its own) and go on with it (pipeline_grad_out_stats(k % 2)).
  void backward_chunk(int chunk, int micro);
  // Validation through the pipeline: chunk c's forward with dropout off (in micro-batch 0's slot:
  // call it between steps), its input pipeline_input(c, 0) and pipeline_input_stats(c, 0), its
  // output pipeline_output(c, 0) and pipeline_output_stats(c, 0). Returns the loss on the chunk
  // holding it (with the load-balancing term, as evaluate()).
  float evaluate_chunk(int chunk, const Batch& batch);
  Tensor pipeline_input(int chunk, int micro) const;
  Tensor pipeline_output(int chunk, int micro) const;
  // buffer 0 or 1; -1: the buffer the next backward_chunk reads (grad_in), the last one wrote (grad_out).
  Tensor pipeline_grad_in(int buffer = -1) const;
  Tensor pipeline_grad_out(int buffer = -1) const;
  // A mixture of experts' router statistics (MoeStats::pack: 2·E + 2 fp64 values), which travel as a
  // second message next to each of the four above: the running statistics of (c, m) received with
  // its input and sent with its output, the whole model's received with a gradient and sent with
  // the one backward wrote. Empty tensors for a model without sparse layers (nothing travels).
  Tensor pipeline_input_stats(int chunk, int micro) const;
  Tensor pipeline_output_stats(int chunk, int micro) const;
  Tensor pipeline_grad_in_stats(int buffer) const;
  Tensor pipeline_grad_out_stats(int buffer) const;
  // The optimizer step after the step's micro-batches (every rank of the pipeline calls it):
  // shared parameters' gradients summed over their stages, the overflow check, norm and loss over
  // every stage, then as step() at the boundary.
  void pipeline_step();
  // Collective over the pipeline group (every stage): sums host `values` in place (at most 64), as
  // all_reduce_sum does over the data group. Without a pipeline: unchanged.
  void pipeline_all_reduce_sum(std::span<float> values);

  // ---- hooks ----
  // Overrides the config's schedule: from the next optimizer step on, step s uses hook(s) as its
  // LR and the optimizer's own betas. The config's schedule keeps stepping underneath, so nullptr
  // restores it where it would have been.
  void set_lr_schedule(LrHook hook);

  // ---- state ----
  EngineState state() const;
  // Mixture of experts: the tokens each (sparse layer, expert) kept since the last call, summed over
  // this rank's training micro-batches (min / max / mean / imbalance), and the drops; then starts
  // again. Empty (layers 0) for a dense model. Under a pipeline it is collective over the pipeline
  // group (every stage calls it): the stages' counts are summed, so that each reports the whole
  // model's layers, and last_aux is the whole model's on every stage.
  MoeStats::Report take_moe_report();
  // Collective over the data group (every rank of it calls it, at the same step): the same report
  // with the counts summed over the group's ranks — every token of those micro-batches, however the
  // ranks split them (data, sequence and expert parallelism) — and the aux loss their mean; one
  // small all-reduce (3 values and E per sparse layer). What the progress line prints.
  MoeStats::Report take_data_group_moe_report();
  // Not collective: reads this rank's counters and allocator statistics.
  EngineReport report() const;

  const config::DsConfig& config() const;  // resolved: batch triple, placement, optimizer, ...
  const Model& model() const { return model_; }
  std::int64_t sequence_length() const { return dims_.T; }
  int rank() const;
  int world_size() const;
  Device device() const;  // where the engine's tensors live
  // Blocks until the device has finished every step queued so far (a no-op on the CPU): the host
  // returns from forward/backward/step before a GPU has run all their kernels, so a caller timing
  // steps synchronises before reading the clock.
  void synchronize() const;

  // ---- parameters ----
  // The parameter / gradient with this name (the model's ParamSpec names; a tied name such as
  // GPT-2's "lm_head.weight" resolves to its owner). Error naming the parameter if unknown.
  // Under fp16 / bf16 these are the 16-bit tensors the layers read and write. They live on the
  // engine's device (device()): copy_tensor (ops/kernels/tensor_ops.h) brings them to the host.
  // Under ZeRO a partitioned tensor has no whole copy on a rank: param() is an Error at stage 3
  // (stage 3's persistent layers excepted), master_param() at stages 1-3, grad() at stages 2-3;
  // gather_master_params() gives the whole fp32 values instead.
  Tensor param(std::string_view name) const;
  // The fp32 master copy the optimizer updates (= param(name) in fp32 training).
  Tensor master_param(std::string_view name) const;
  Tensor grad(std::string_view name) const;
  // Owned parameter names, in layer order.
  std::vector<std::string> param_names() const;
  // Collective (every rank calls it): fn(name, value) for every owned parameter, in layer order,
  // with its whole fp32 master value in host memory (a temporary, except at stage 0 on the CPU).
  void gather_master_params(const std::function<void(const std::string& name, const Tensor& fp32)>& fn);

  // ---- weights in the model family's Hugging Face layout (models/model_family.h) ----
  // fp32, from / into the fp32 master params under fp16 / bf16 (loading rounds them into the
  // 16-bit params). Error for a model without an architecture, or a file that does not fit the
  // model (naming the tensor and the shapes). With several ranks both are collective: every rank
  // reads the file; rank 0 alone writes it (stage 3 only with
  // zero_optimization.stage3_gather_16bit_weights_on_model_save, as DeepSpeed). Training
  // checkpoints (optimizer states, counters, resharding) are engine/checkpoint/checkpoint_manager.h's.
  void save_weights(const std::filesystem::path& path);
  void load_weights(const std::filesystem::path& path);

  // ---- for the training loop ----
  // Collective: sums host `values` over the ranks in place (e.g. a validation loss sum and count),
  // in order with the engine's own collectives; through the engine's device when its communicator
  // needs device memory (NCCL). One rank: unchanged. At most 64 values.
  void all_reduce_sum(std::span<float> values);
  // Collective over `world` (a communicator the caller holds whose every rank calls it: the
  // trainer's world, which spans the engine's data, tensor and pipeline groups): sums host fp64
  // `values` in place, staged through the engine's device where the communicator needs device
  // memory (NCCL). Like the checkpoint calls, left out of the next step's figures
  // (ZeroReport::step_comm): the training loop's per-step agreement (step times, stop flag, save
  // decision). Between optimizer steps only.
  void all_reduce_host_sum(Communicator& world, std::span<double> values);
  // Between steps: the collectives (and NVMe transfers) issued since the last step stay out of the
  // next one's figures (the training loop's evaluation between steps, the checkpoints).
  void exclude_from_step_comm();
  // The engine's layers and parameter views for a Generator (samples at the val interval): the
  // weights are read in place, never copied. The views stay valid while the engine lives (moving
  // the engine keeps them) and, at ZeRO stage 3, until the next forward / evaluate: there it is
  // collective, gathering every layer's parameters.
  GenerationModel generation_model();

 private:
  struct Impl;
  // Under a pipeline (collective over its group): every stage's per-expert counts summed, so each
  // stage's report holds the whole model's layers. Nothing without one.
  void sum_moe_report_over_pipeline();
  void forward_layers(const Batch& batch, bool train, float* loss);
  void forward_layer(std::size_t i, bool train, float* loss, bool recompute);
  // Returns whether the step counts (false: skipped for overflow; the LR schedule did not step).
  // The optimizer's update of this rank's partition (the 1-bit family through OneBitOptimizer).
  void apply_optimizer(double lr, float grad_scale, std::int64_t t, std::optional<std::pair<double, double>> betas);
  bool optimizer_step();
  // step()'s work at the gradient-accumulation boundary: the optimizer step and the counters.
  void boundary_step();
  // The pipeline: the activation sets and views (engine_pipeline.cpp), the views of (chunk, slot),
  // the batch checks and upload shared with forward(), the shared parameters' gradient sum.
  void build_pipeline_activations(const config::DsConfig& config, const EngineOptions& options);
  void select_slot(int chunk, int slot);
  // A mixture of experts' router statistics around a chunk's forward (engine_pipeline.cpp): started
  // from the received running ones, then sent on.
  void begin_chunk_stats(std::size_t chunk, std::size_t slot, bool train);
  void end_chunk_stats(std::size_t chunk, std::size_t slot, bool has_loss);
  // The backward pass's parts shared by backward() and backward_chunk() (engine.cpp).
  std::chrono::steady_clock::duration backward_layer(std::size_t i, bool boundary, float dloss);
  void end_backward_timed(bool boundary, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::duration reduction);
  float whole_sequence_loss(float loss);
  float moe_aux_term();
  void set_batch(const Batch& batch, Tensor upload);
  void reduce_shared_params();
  // save_weights on a pipeline: every stage's parameters brought to mesh rank 0, which writes.
  void save_pipeline_weights(const std::filesystem::path& path);
  std::uint32_t global_micro_batch() const;
  // Every rank of the mesh (the data-parallel group and, with tensor parallelism, the
  // tensor-parallel group) learns whether any rank failed (`error` non-empty) and throws if so
  // (checkpoints).
  void agree_on_errors(const std::string& error);
  float micro_batch_dloss() const;
  // The build steps of the constructor, in order (engine.cpp).
  void choose_memory(const EngineOptions& options);
  void check_shapes(const config::DsConfig& config, const EngineOptions& options);
  void build_states(const config::DsConfig& config);
  void log_placement();
  void build_activations(const config::DsConfig& config, const EngineOptions& options);
  void set_traces(const config::DsConfig& config);
  void init_state(const EngineOptions& options);

  // The training checkpoints (engine/checkpoint/checkpoint_manager.h) save and restore the state
  // below and in Impl: the counters, the optimizer partition, the scaler and the schedule.
  friend class CheckpointManager;

  Model model_;
  std::unique_ptr<Impl> impl_;
  LayerDims dims_;
  std::int64_t gas_ = 1;
  std::int64_t train_batch_size_ = 0;
  std::int64_t parameter_count_ = 0;
  std::int64_t global_steps_ = 0;
  std::int64_t global_samples_ = 0;
  std::int64_t micro_steps_ = 0;
  std::int64_t skipped_steps_ = 0;
  double lr_ = 0.0;
  double last_step_lr_ = 0.0;
  float last_loss_ = 0.0f;
  double step_loss_sum_ = 0.0;
  float last_step_loss_ = 0.0f;
  double grad_norm_ = 0.0;
  float clip_coef_ = 1.0f;
  bool have_forward_ = false;
  bool have_backward_ = false;     // a backward() ran since the last step()
  bool boundary_reduced_ = false;  // ... and it was the boundary's (the grads are reduced)
};

// The entry point, as deepspeed.initialize: the model, the parsed ds_config (resolved for the
// world size of options.comm) and the run's options. Throws Error for a config this engine cannot train (naming the key and value).
Engine initialize(Model model, const config::DsConfig& config, const EngineOptions& options = {});

}  // namespace dstrain
