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
#include "models/model.h"
#include "ops/allocator.h"
#include "ops/memory_stats.h"
#include "ops/tensor.h"
#include "models/layer.h"
#include "zero/communicator.h"

namespace dstrain {

struct EngineOptions {
  std::uint64_t seed = 0;            // parameter init (param_init.h) and dropout streams
  // The data-parallel group this rank trains in (zero/communicator.h): the local backend's ranks
  // (threads of one process) or NCCL's. nullptr: one rank. Its world size must be the config's
  // data_parallel_world_size; every rank calls the same Engine methods in the same order (the
  // collective ones are marked so below).
  Communicator* comm = nullptr;
  std::int64_t sequence_length = 0;  // T of every micro-batch; 0: the model's n_positions
  bool init_params = true;           // false: parameters start at zero (e.g. load_weights follows)
  // Where the engine trains: every parameter, gradient, optimizer state and activation lives in
  // `allocator`'s memory (its device decides: cpu, or cuda:N with the CUDA backend). nullptr: an
  // allocator of the engine's own for `device` (its statistics are this rank's alone).
  Allocator* allocator = nullptr;
  Device device = Device::cpu();     // used only when allocator is nullptr
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
};

// An embedding program's own LR rule: the LR of optimizer step `step` (0-based: the first step is 0).
// Called once per step index, before that step's update. (Not named LrSchedule: that is the class
// of DeepSpeed's schedulers, engine/lr_schedule.h, which the engine builds from the config.)
using LrHook = std::function<double(std::int64_t step)>;

// What Engine::load_checkpoint restores besides the weights, as DeepSpeed's arguments of the same
// names: the optimizer states (and the fp16 loss scaler, which DeepSpeed keeps with them), the LR
// schedule, or only the weights (no counters, optimizer or schedule).
struct LoadCheckpointOptions {
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;
};

// What a load found: the checkpoint's folder (empty when there was nothing to load), its tag and
// the client state the saver passed.
// A checkpoint manifest's scalars (counters, schedule, seed, loss scaler, 1-bit phase), read and
// type-checked in load_checkpoint's first phase and applied in its second (engine_checkpoint.cpp).
struct CheckpointScalars;

struct LoadedCheckpoint {
  std::filesystem::path path;
  std::string tag;
  config::Json client_state;
  bool loaded() const { return !path.empty(); }
};

// Error when this build's Engine would refuse `config` for what it asks of the engine alone (offload,
// Apex AMP, fp16 with bf16, Lamb's combinations, managed_gradient_accumulation, the optimizer's type
// and params) — the message the Engine's constructor gives. `dstrain check-config` calls it, so a
// config it calls valid is one `dstrain train` trains.
void check_engine_trains(const config::DsConfig& config);

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
  // Call after every backward (an Error otherwise, and for a second backward() before it). At the gradient-accumulation boundary (every GAS-th call): global
  // grad norm, clipping to gradient_clipping (docs/precision.md §7), optimizer update at lr() (and
  // betas()), the LR schedule stepped, grads zeroed, global_steps += 1, global_samples +=
  // train_batch_size. Under fp16 / bf16 the overflow check comes first: a skipped step changes no
  // parameter, optimizer state or LR schedule, but still counts in global_steps and
  // skipped_steps. Otherwise only counts the micro-step.
  void step();
  // True when the next step() call will update the parameters ((micro_steps + 1) % GAS == 0).
  bool is_gradient_accumulation_boundary() const;

  // The mean loss of `batch` with dropout off, for validation; touches no gradient or counter.
  // (Overwrites the saved activations: call it between step() and the next forward().)
  float evaluate(const Batch& batch);

  // ---- hooks ----
  // Overrides the config's schedule: from the next optimizer step on, step s uses hook(s) as its
  // LR and the optimizer's own betas. The config's schedule keeps stepping underneath, so nullptr
  // restores it where it would have been.
  void set_lr_schedule(LrHook hook);
  // The schedule built from the config's "scheduler" block (a constant optimizer lr without one).
  const LrSchedule& lr_schedule() const;

  // ---- state ----
  std::int64_t global_steps() const { return global_steps_; }    // optimizer steps taken
  std::int64_t global_samples() const { return global_samples_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  // The LR the next optimizer step will use (DeepSpeed's get_lr() after a step), and the one the
  // last step used (0 before the first step).
  double lr() const { return lr_; }
  double last_step_lr() const { return last_step_lr_; }
  // The Adam betas the next optimizer step will use: OneCycle's (cycled beta1, 0.99) when it
  // cycles momentum, else the optimizer's.
  std::pair<double, double> betas() const;
  // The loss scale the next backward multiplies by (fp16; 1 for bf16 / fp32), and the optimizer
  // steps skipped for an inf/NaN gradient (they count in global_steps too, as in DeepSpeed).
  double loss_scale() const;
  std::int64_t skipped_steps() const { return skipped_steps_; }
  float last_loss() const { return last_loss_; }    // the last forward's micro-batch loss
  // Mean of the micro-batch losses of the last completed optimizer step (what a progress line shows).
  float last_step_loss() const { return last_step_loss_; }
  // Global L2 norm of the last step's grads before clipping (un-scaled under fp16); -1 when they
  // held an inf/NaN (fp16 / bf16), as DeepSpeed reports it.
  double grad_norm() const { return grad_norm_; }
  float clip_coefficient() const { return clip_coef_; }  // 1, or c / (norm + 1e-6) when that is < 1 (1 for a skipped step)

  int rank() const;
  int world_size() const;
  Device device() const;  // where the engine's tensors live
  // Blocks until the device has finished every step queued so far (a no-op on the CPU): the host
  // returns from forward/backward/step before a GPU has run all their kernels, so a caller timing
  // steps synchronises before reading the clock.
  void synchronize() const;
  int zero_stage() const;
  ZeroReport zero_report() const;

  std::int64_t micro_batch_size() const { return dims_.B; }
  std::int64_t sequence_length() const { return dims_.T; }
  std::int64_t gradient_accumulation_steps() const { return gas_; }
  std::int64_t train_batch_size() const { return train_batch_size_; }
  const config::DsConfig& config() const;
  const Model& model() const { return model_; }

  // Parameters as GPT-2 counts them would depend on the model; this is every owned element (tied
  // ones once, padding rows included).
  std::int64_t parameter_count() const { return parameter_count_; }
  // The parameter / gradient with this name (Hugging Face names for GPT-2; a tied name such as
  // "lm_head.weight" resolves to its owner). Error naming the parameter if unknown.
  // Under fp16 / bf16 these are the 16-bit tensors the layers read and write. They live on the
  // engine's device (device()): copy_tensor (ops/kernels/tensor_ops.h) brings them to the host.
  // Under ZeRO a partitioned tensor has no whole copy on a rank: param() is an Error at stage 3
  // (stage 3's persistent layers excepted), master_param() at stages 1-3, grad() at stages 2-3;
  // gather_master_params() gives the whole fp32 values instead.
  Tensor param(std::string_view name) const;
  // The fp32 master copy the optimizer updates (= param(name) in fp32 training).
  Tensor master_param(std::string_view name) const;
  Tensor grad(std::string_view name) const;
  // Collective (every rank calls it): fn(name, value) for every owned parameter, in layer order,
  // with its whole fp32 master value in host memory (a temporary, except at stage 0 on the CPU).
  void gather_master_params(const std::function<void(const std::string& name, const Tensor& fp32)>& fn);
  // Collective: sums host `values` over the ranks in place (e.g. a validation loss sum and count),
  // in order with the engine's own collectives; through the engine's device when its communicator
  // needs device memory (NCCL). One rank: unchanged. At most 64 values.
  void all_reduce_sum(std::span<float> values);
  // Owned parameter names, in layer order.
  std::vector<std::string> param_names() const;

  MemoryStats memory_stats() const;
  // Host memory held apart from the device (EngineOptions::host_allocator): cpu_checkpointing's kept
  // inputs (purpose activations) and the offloaded optimizer partition (purpose optimizer).
  MemoryStats host_memory_stats() const;
  // The checkpointing state (segments, transfers, profile); nullptr when checkpointing is off.
  const ActivationCheckpointing* activation_checkpointing() const;

  // Layer i's parameter views in model().layers[i]->params() order, tied entries as their owner's.
  std::span<const Tensor> layer_params(std::size_t layer) const;
  // The engine's layers and parameter views for a Generator (samples at the val interval): the
  // weights are read in place, never copied. The views stay valid while the engine lives (moving
  // the engine keeps them) and, at ZeRO stage 3, until the next forward / evaluate: there it is
  // collective, gathering every layer's parameters.
  GenerationModel generation_model();

  // Hugging Face GPT-2 safetensors (models/gpt2/gpt2_weights.h), fp32, from / into the fp32
  // master params under fp16 / bf16 (loading rounds them into the 16-bit params). Error for a model that is
  // not GPT-2, or a file that does not fit the model (naming the tensor and the shapes).
  // With several ranks both are collective: every rank reads the file; rank 0 alone writes it
  // (stage 3 only with zero_optimization.stage3_gather_16bit_weights_on_model_save, as DeepSpeed).
  void save_weights(const std::filesystem::path& path);
  void load_weights(const std::filesystem::path& path);

  // ---- training checkpoints (docs/checkpoints.md) ----
  // Collective. Saves everything a continuation needs under save_dir/<tag> — fp32 masters, the
  // 16-bit params, every optimizer state the optimizer declares, the counters, the loss scaler, the
  // LR schedule, the seed, the resolved config, the layout (world, stage, dtype) and
  // `client_state` — each rank writing the pieces of parameter space it owns, then rewrites
  // save_dir/latest. Atomic: a crash leaves the previous checkpoint loadable. Default tag
  // "global_step<N>"; checkpoint.tag_validation compares the tag across ranks (Warn / Fail).
  // Call at a gradient-accumulation boundary (after the step() that completes one): the
  // accumulated gradients of a half-done step are not saved. Returns the tag. Error naming the
  // file and the cause (disk full, permissions); the run's state is untouched by a failed save.
  std::string save_checkpoint(const std::filesystem::path& save_dir, std::string tag = "", const config::Json& client_state = config::Json::object());
  // Collective. Loads load_dir/<tag> (tag "": the one load_dir/latest names; nothing is loaded, with
  // a warning, when there is no latest) saved at any world size, ZeRO stage and dtype: each rank
  // reads the saved pieces that intersect what it owns. Verifies every checksum and shape first;
  // an Error (naming the file and tensor) leaves the engine as it was. Call before the first
  // forward or at a gradient-accumulation boundary.
  LoadedCheckpoint load_checkpoint(const std::filesystem::path& load_dir, std::string tag = "", const LoadCheckpointOptions& options = {});
  // Collective. With checkpoint.writer.decoupled, save_checkpoint returns once every rank has a
  // snapshot in host memory and writes the files in the background; this waits for them and
  // commits the checkpoint (manifest, rename, `latest`). The next save, a load and the Trainer's
  // end of run call it; a no-op when nothing is pending. (An Engine destroyed with a save pending
  // waits for its files but does not commit them: the partial folder is removed by the next run's
  // pre-flight.)
  void wait_for_checkpoint();
  // The bytes of this rank's part of a checkpoint, its file's tensors (0 when it writes none: stage
  // 0, rank > 0): what a save writes and a decoupled save's snapshot holds.
  std::size_t checkpoint_rank_bytes() const;
  // Collective: true when any rank passes true (the training loop's stop request). Like the
  // checkpoint calls, it is left out of the next step's figures (ZeroReport::step_comm).
  bool any_rank(bool flag);

 private:
  struct Impl;
  void forward_layers(const Batch& batch, bool train, float* loss);
  void forward_layer(std::size_t i, bool train, float* loss, bool recompute);
  // Returns whether the step counts (false: skipped for overflow; the LR schedule did not step).
  // The optimizer's update of this rank's partition (the 1-bit family through OneBitOptimizer).
  void apply_optimizer(double lr, float grad_scale, std::int64_t t, std::optional<std::pair<double, double>> betas);
  bool optimizer_step();
  std::uint32_t global_micro_batch() const;
  // Checkpoints: every rank learns whether any rank failed (`error` non-empty) and throws if so.
  void agree_on_errors(const std::string& error);
  // Between steps: the collectives (and NVMe transfers) issued since the last step stay out of the next one's figures.
  void exclude_from_step_comm();
  struct SaveJob;  // a checkpoint save between its phases (engine.cpp)
  void finish_save_phase(const SaveJob& job, const std::string& error);
  void commit_save(SaveJob& job);
  config::Json checkpoint_manifest(const std::string& tag, const config::Json& client_state) const;
  // checkpoint.writer.decoupled: allocates `bytes` of snapshot memory (replacing any before) and
  // starts faulting it in.
  void prepare_checkpoint_snapshot(std::size_t bytes);
  void restore_scalars(const CheckpointScalars& saved, const LoadCheckpointOptions& options);
  // Puts back the training state initialize made (the seed's parameters, zero optimizer states),
  // after a load streamed into it failed.
  void restore_initial_state();
  float micro_batch_dloss() const;

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
