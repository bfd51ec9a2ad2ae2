// PipelineEngine: one optimizer step of a pipeline stage, as DeepSpeed's PipelineEngine.train_batch
// runs it — gradient_accumulation_steps micro-batches through every stage in a schedule's order
// (engine/pipeline_schedule.h: 1F1B, Megatron's interleaved 1F1B, GPipe), the activations sent
// forward and the gradients back between neighbouring stages, then the optimizer step on every
// stage (docs/parallelism.md §7).
//
//   Engine engine = initialize(make_pipeline_stage_model(make_model(arch), parts, P, stage), config,
//                              {.comm = data_group, .pipeline = pp_group, .pipeline_ties = ties,
//                               .pipeline_in_flight = PipelineEngine::in_flight(kind, P, stage, GAS, V)});
//   PipelineEngine pipe(engine, *pp_group, kind, V);
//   float loss = pipe.train_batch(micro_batches);   // every stage calls it with the same batches
//
// Each action of the schedule posts its transfers together (the previous compute's output with the
// next compute's input), so two neighbours that send to each other never wait on each other. They
// are started, not waited for (Communicator::start_send_recv): a compute waits only for the
// transfers whose buffers it reads or writes — its own inputs, a send from a slot or gradient
// buffer it is about to overwrite — so the other transfers overlap it; the next action's recvs are
// posted a compute ahead when their buffers are free (Megatron's overlap_p2p_comm); every transfer
// is complete when train_batch returns. The activations sent are the slots' own buffers (no copy),
// the gradients travel through the engine's two residual-gradient and two received-gradient
// buffers (double-buffered: Engine::backward_chunk) — docs/parallelism.md §7.4. A mixture of
// experts' router statistics (the load-balancing loss's, 2·E + 2 doubles per micro-batch) go as a
// second message of the same transfer, in the same batch, from and into the engine's buffers next
// to those (Engine::pipeline_input_stats ...), waited for with them.
#pragma once

#include <chrono>
#include <map>
#include <utility>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/pipeline_schedule.h"
#include "zero/communicator.h"
#include "zero/device_mesh.h"

namespace dstrain {

// One event of a stage's step, in the order it happened (PipelineEngine::trace).
struct PipelineEvent {
  enum class Kind { forward, backward, send, recv };
  Kind kind = Kind::forward;
  int micro_batch = 0;
  int chunk = 0;
  bool activation = true;  // send / recv: an activation (forward direction) or a gradient
  int peer = -1;           // send / recv: the other stage
  // forward / backward: this stage's transfers started and not yet waited for when the compute
  // began — the transfers it overlapped (always 0 with blocking batches).
  int pending_transfers = 0;
};

class PipelineEngine {
 public:
  // `engine`: this rank's stage, built with EngineOptions::pipeline = &pipeline and
  // pipeline_in_flight = in_flight(...) for the same schedule. Error when the schedule does not
  // fit the engine (its chunks, the stage count, the micro-batches per step).
  PipelineEngine(Engine& engine, Communicator& pipeline, PipelineScheduleKind kind, int virtual_stages);

  // The activation sets chunk c of `stage` needs under the schedule: the most micro-batches in
  // flight on it (EngineOptions::pipeline_in_flight).
  static std::vector<int> in_flight(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages);

  // One optimizer step: batches[m], m = 0 .. gradient_accumulation_steps - 1 (every stage passes
  // the same micro-batches: the first stage reads their tokens, the last their targets; they stay
  // valid until the call returns). Returns the step's mean loss, the same on every stage.
  float train_batch(std::span<const Batch> batches);
  // The mean loss of `batch` with dropout off, through every stage (between steps). Every stage
  // returns it.
  float evaluate(const Batch& batch);

  // Off: every action waits for all of its transfers before its compute, and no recv is posted
  // early — the blocking batches (Communicator::send_recv) the engine ran before transfers
  // overlapped compute, kept as the reference for benchmarks (bench_pipeline_cpu --blocking) and
  // tests. The same results either way. On by default.
  void set_overlap(bool on) { overlap_ = on; }
  // Record the events of the next steps (off by default).
  void set_trace(bool on) { tracing_ = on; }
  const std::vector<PipelineEvent>& trace() const { return trace_; }
  void clear_trace() { trace_.clear(); }
  // The last train_batch's wall time and the part of it this stage spent computing (forward and
  // backward chunks): the idle rest is the bubble and the transfers.
  double last_step_seconds() const { return step_s_; }
  double last_compute_seconds() const { return compute_s_; }
  const std::vector<PipeAction>& actions() const { return actions_; }

 private:
  // One started transfer: its request and the buffers it reads (a send) or writes (a recv).
  struct InFlight {
    PointToPointRequest request;
    std::vector<Tensor> buffers;
    bool is_send = true;
  };
  // The memory a compute reads and writes of what transfers touch (activation slots, gradient buffers).
  struct Touched {
    std::vector<Tensor> reads, writes;
  };
  // The buffers of a transfer: the activation or gradient, then the router statistics when the
  // model has sparse layers.
  std::vector<Tensor> buffers_of(const PipeTransfer& t) const;
  Touched touched_by(const PipeStep& s) const;
  void post(const PipeTransfer& t, std::vector<InFlight>& in_flight);
  void wait_for(const Touched& t, std::vector<InFlight>& in_flight);

  Engine& engine_;
  Communicator& pipeline_;
  PipelineScheduleKind kind_;
  int virtual_stages_ = 1;
  std::vector<PipeAction> actions_;
  std::map<std::pair<int, int>, int> backward_index_;  // (chunk, micro-batch) -> its backward's place in the step (gradient buffer k % 2)
  bool overlap_ = true;
  bool tracing_ = false;
  std::vector<PipelineEvent> trace_;
  double step_s_ = 0.0, compute_s_ = 0.0;
};

// Collective over `world` (every rank of the mesh calls it): the group over which the shared
// parameters' gradients are summed (EngineOptions::pipeline_ties) — the ranks whose stage model
// holds shared parameters (Model::shared_params; GPT-2's first and last stages when the head's
// weight is tied), with the same tensor-parallel index. Null for a rank that holds none.
std::unique_ptr<Communicator> make_pipeline_ties_group(Communicator& world, const MeshGroups& mesh, const Model& stage_model);

}  // namespace dstrain
