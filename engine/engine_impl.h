// Engine's private state (the pimpl behind engine/engine.h), shared by engine.cpp (the step loop)
// and the CheckpointManager (engine/checkpoint/checkpoint_manager.cpp), which saves and restores
// it. Not installed.
#pragma once

#include <array>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/activation_checkpointing.h"
#include "engine/expert_parallel.h"
#include "engine/engine.h"
#include "engine/tensor_parallel.h"
#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/optim/onebit_optimizer.h"
#include "engine/optim/optimizer.h"
#include "offload/io_uring_engine.h"
#include "ops/buffer.h"
#include "zero/comms_logger.h"
#include "zero/communicator.h"
#include "zero/model_states.h"

namespace dstrain {

struct Engine::Impl {
  // One layer's views, in params() / saved_activations() / scratch() order. params and grads are
  // refreshed by ModelStates::views before every call (ZeRO-3 gathers land anywhere).
  struct LayerState {
    std::vector<Tensor> params, grads;  // tied entries are views of the owner's
    std::vector<Tensor> saved, scratch;
    Tensor input;             // the previous layer's output (empty for the first layer)
    Tensor output;            // where forward writes
    Tensor recompute_output;  // where a checkpointed recompute writes (= output otherwise)
  };
  struct Owned {
    ParamSpec spec;
    std::size_t layer = 0;
    const FlatSlot* slot = nullptr;
  };

  // The schedule gets the optimizer's lr and betas, as DeepSpeed's schedulers read them from the
  // optimizer's param groups.
  Impl(const config::DsConfig& c, const EngineOptions& o);  // engine.cpp

  config::DsConfig config;
  EngineOptions options;
  Optimizer optimizer;
  std::unique_ptr<Allocator> own_allocator;  // when options.allocator is null
  Allocator* allocator = nullptr;
  std::unique_ptr<Allocator> own_host_allocator;  // when options.host_allocator is null
  Allocator* host_allocator = nullptr;            // cpu_checkpointing's kept inputs, the offloaded optimizer partition
  const char* host_memory_kind = "";              // what the host allocator is, for the offload log lines
  // NVMe optimizer offload (offload_optimizer.device "nvme" at stage 3): the io_uring engine the
  // store's swap files go through (docs/offload.md §5). Declared before `states`: it outlives the store.
  std::unique_ptr<IoEngine> io;
  // comms_logger.enabled: the decorator every collective of the engine goes through (`comm` points
  // at it). Declared before everything that holds `comm`, so that it outlives them.
  std::unique_ptr<CommsLogger> comms_logger;
  std::unique_ptr<ModelStates> states;  // params, grads, optimizer states as the ZeRO stage holds them
  // OneBitAdam / ZeroOneAdam / OneBitLamb: their step, which communicates (docs/optimizers_onebit.md).
  // Declared after the allocator: its buffers are freed first.
  std::unique_ptr<OneBitOptimizer> onebit;
  std::vector<LayerState> layers;
  // Tensor parallelism (engine/tensor_parallel.h): the group the layers call, over options.tensor_parallel.
  std::unique_ptr<TensorParallelGroup> tp_group;
  Communicator* tp = nullptr;  // null: one tensor-parallel rank
  // Expert parallelism (engine/expert_parallel.h): the MoE layers' group over options.expert_parallel.
  std::unique_ptr<ExpertParallelGroup> ep_group;
  Communicator* ep = nullptr;  // null: one expert-parallel rank
  int ep_size() const { return ep != nullptr ? ep->world_size() : 1; }
  // The group a parameter's pieces are cut across: the expert-parallel one for an expert stack, the
  // tensor-parallel one for a cut parameter; null for a whole parameter.
  Communicator* piece_group(const ParamSpec& spec) const { return !spec.is_piece() ? nullptr : spec.split.kind == SplitKind::experts ? ep : tp; }
  std::unique_ptr<SequenceParallelGroup> sp_group;
  Communicator* sp = nullptr;  // null: one sequence-parallel rank
  std::int64_t sp_local_targets = 0;  // this rank's counted targets of the current batch (sequence parallelism)
  int tp_size() const { return tp != nullptr ? tp->world_size() : 1; }
  int tp_rank() const { return tp != nullptr ? tp->rank() : 0; }
  // Host values the engine reduces or gathers over the tensor- or sequence-parallel group (the
  // step's norm, whole parameters, the group's target count and loss) travel through the training device's memory on a GPU — what NCCL needs, and
  // the local backend on a GPU takes alike (ModelStates::all_reduce_sum's rule); null on the CPU.
  Allocator* host_value_staging() const { return allocator != nullptr && !allocator->device().is_cpu() ? allocator : nullptr; }
  // Pipeline parallelism (engine/engine_pipeline.cpp). Every layer has pipeline_slots[its chunk]
  // activation sets (slot_views[layer][slot]; the checkpointed blocks' inner ones shared by the
  // slots, which the recompute refills), select_slot copies one slot's into `layers`.
  struct SlotViews {
    Tensor input, output, recompute_output;
    std::vector<Tensor> saved;
  };
  Communicator* pp = nullptr;       // the pipeline group (EngineOptions::pipeline); null: none
  Communicator* pp_ties = nullptr;  // the shared parameters' group
  std::vector<std::vector<SlotViews>> slot_views;
  std::vector<int> chunk_of_layer;
  std::vector<int> pipeline_slots;             // per chunk
  std::vector<std::vector<Tensor>> chunk_inputs;  // [chunk][slot]: the received activation (empty for the model's first chunk)
  std::vector<std::vector<Batch>> slot_batches;   // [chunk][slot]: the micro-batch as the layers read it
  std::vector<std::vector<Tensor>> slot_uploads;  // [chunk][slot]: a device engine's copy of a host batch (tokens then targets)
  std::vector<std::int64_t> segment_first;     // [layer]: the first layer of the checkpoint segment it ends, or -1
  Buffer pipeline_buf;                         // the slots' activations, the chunk inputs and the received gradient
  // The pipeline's gradient buffers, two of each (double-buffered): the k-th backward_chunk of a
  // step reads grad_in[k % 2] (d(loss)/d(chunk output), received) and leaves its input gradient in
  // pipeline_dresidual[k % 2] (dresidual points there during it), so the next backward can run and
  // the next gradient arrive while the last one is still being sent or received.
  std::array<Tensor, 2> grad_in;
  std::array<Tensor, 2> pipeline_dresidual;
  // Mixture of experts: what the sparse layers record during a micro-batch (models/moe_stats.h).
  MoeStats moe;
  double last_aux_loss = 0.0;  // the last forward's load-balancing loss (unweighted)
  // ... under a pipeline, whose model has sparse layers (engine_pipeline.cpp): a micro-batch's router
  // statistics (MoeStats::pack, 2·E + 2 doubles) travel with its activations and gradients, as a
  // second message of each transfer. moe_pack: their count (0: nothing travels); moe_experts and
  // moe_layers: E and the whole model's blocks (the report's sizes); moe_aux_weight: the aux loss's.
  // stats_in / stats_out [chunk][slot]: the running statistics received (not on the model's first
  // chunk) and to send (not on the chunk holding the loss); stats_grad_in / stats_grad_out [k]: the
  // whole model's, received with grad_in[k] and sent with pipeline_dresidual[k]; stats_whole
  // [chunk][slot]: the whole model's the chunk holding the loss keeps for the backward (host).
  std::int64_t moe_pack = 0, moe_experts = 0, moe_layers = 0;
  double moe_aux_weight = 0.0;
  std::vector<std::vector<Tensor>> stats_in, stats_out;
  std::array<Tensor, 2> stats_grad_in, stats_grad_out;
  std::vector<std::vector<std::vector<double>>> stats_whole;
  int pipeline_micro = -1;                     // the micro-batch being run (its dropout key)
  int pipeline_backwards = 0;                  // backward_chunk calls this step
  std::vector<Owned> owned;
  std::vector<bool> pipeline_copy;  // [owned index]: a copy of a parameter another pipeline stage owns (Model::shared_params)
  std::unordered_map<std::string, std::size_t> by_name;  // owned name -> index
  Buffer act_buf, scratch_buf;
  Tensor dresidual;                               // (B, T, C): the residual stream's gradient, in place through the layers
  Batch batch;                                    // the current micro-batch, on the device
  Buffer batch_buf;                               // a device engine's copy of a host batch: tokens (B, T) then targets (B, T), int32
  LrSchedule schedule;                            // from config.scheduler; stepped after every applied optimizer step
  LrHook hook;                                    // an embedding program's override of schedule's lr
  std::unique_ptr<ActivationCheckpointing> ckpt;  // null: every activation is kept
  LossScaler scaler;                              // fp16: DeepSpeed's loss scale; bf16 / fp32: scale 1 and its overflow policy
  StochasticRoundingOptions rounding;             // the bf16 copies' rounding (EngineOptions::bf16_stochastic_rounding)
  bool mixed = false;                             // fp16 or bf16: 16-bit layers, fp32 masters
  Communicator* comm = nullptr;
  int world = 1;
  // The data-parallel group's collectives and those of the groups ZeRO++ / MiCS split off it.
  CommStats zero_comm_stats() const {
    CommStats s = comm != nullptr ? comm->stats() : CommStats{};
    if (states) s += states->group_stats();
    return s;
  }
  CommStats comm_at_step_start;    // counters when the current optimizer step's first micro-step began
  CommStats step_comm;             // the last optimizer step's collectives
  double backward_inner_ms = 0.0;  // the last backward's split (EngineState::last_backward_*)
  double backward_allreduce_ms = 0.0;
  // The same for the NVMe transfers of `io` (when there is one): counters when the current step
  // began, the last step's traffic, and every step's together.
  IoEngine::Totals io_at_step_start, step_io, train_io;
  // The training state (masters, optimizer states, parameters) is still what initialize made: no
  // step, load_weights or checkpoint load has changed it. A checkpoint at this engine's layout is
  // then streamed straight into the state, and a failed load puts the initial state back
  // (CheckpointManager::restore_initial_state; docs/checkpoints.md "Loading").
  bool initial_state = true;
  bool init_params = true;  // EngineOptions::init_params: the seed's parameters, else zeros
  std::uint64_t init_seed = 0;
  // The masters (and the params rounded from them) as initialize sets them: init_param with
  // init_seed, or zeros without init_params. engine.cpp; also what a failed streamed load restores.
  void set_initial_masters();
};

// The index in Impl::owned of the parameter `name` (a tied name such as GPT-2's "lm_head.weight"
// resolves to its owner); Error naming it and `first_name` (an example) when there is none.
std::size_t owned_param_index(const Model& model, const std::unordered_map<std::string, std::size_t>& by_name, std::size_t count,
                              const std::string& first_name, std::string_view name);

}  // namespace dstrain
