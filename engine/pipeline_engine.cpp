#include "engine/pipeline_engine.h"

#include "ops/error.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

PipelineEngine::PipelineEngine(Engine& engine, Communicator& pipeline, PipelineScheduleKind kind, int virtual_stages)
    : engine_(engine), pipeline_(pipeline), kind_(kind), virtual_stages_(virtual_stages) {
  const Model& m = engine.model();
  if (!m.pipelined()) fail("PipelineEngine: the engine is not a pipeline stage (build its model with make_pipeline_stage_model)");
  if (static_cast<int>(m.chunks.size()) != virtual_stages)
    fail("PipelineEngine: the schedule runs {} chunk(s) per stage but the stage's model has {}", virtual_stages, m.chunks.size());
  const int stages = pipeline.world_size();
  for (std::size_t c = 0; c < m.chunks.size(); ++c) {
    const int want = static_cast<int>(c) * stages + pipeline.rank();
    if (m.chunks[c].virtual_stage != want)
      fail("PipelineEngine: chunk {} of stage {} is virtual stage {}, but the schedule's layout puts virtual stage {} there (make the model with "
           "the pipeline group's stage count {})",
           c, pipeline.rank(), m.chunks[c].virtual_stage, want, stages);
  }
  actions_ = pipeline_actions(kind, stages, pipeline.rank(), static_cast<int>(engine.config().gradient_accumulation_steps), virtual_stages);
}

std::vector<int> PipelineEngine::in_flight(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages) {
  const std::vector<PipeStep> order = pipeline_compute_order(kind, stages, stage, micro_batches, virtual_stages);
  std::vector<int> n;
  for (int c = 0; c < virtual_stages; ++c) n.push_back(max_in_flight(order, c));
  return n;
}

void PipelineEngine::exchange(const std::vector<PipeTransfer>& transfers) {
  if (transfers.empty()) return;
  std::vector<PointToPointOp> ops;
  for (const PipeTransfer& t : transfers) {
    Tensor buf;
    if (t.activation) {
      buf = t.is_send ? engine_.pipeline_output(t.chunk, t.micro_batch) : engine_.pipeline_input(t.chunk, t.micro_batch);
    } else {
      buf = t.is_send ? engine_.pipeline_grad_out() : engine_.pipeline_grad_in();
    }
    ops.push_back(PointToPointOp{t.is_send, buf, t.peer});
    if (tracing_) trace_.push_back({t.is_send ? PipelineEvent::Kind::send : PipelineEvent::Kind::recv, t.micro_batch, t.chunk, t.activation, t.peer});
  }
  pipeline_.send_recv(ops);
  // NCCL queues the batch on its own stream: the next compute (which reads what arrived, and may
  // overwrite the residual gradient just sent) waits for it. A no-op on the host backends.
  pipeline_.order_compute_after_collectives();
}

float PipelineEngine::train_batch(std::span<const Batch> batches) {
  const std::int64_t gas = engine_.config().gradient_accumulation_steps;
  if (static_cast<std::int64_t>(batches.size()) != gas)
    fail("PipelineEngine::train_batch: {} micro-batches given, but a step is gradient_accumulation_steps = {} of them", batches.size(), gas);
  const Clock::time_point start = Clock::now();
  Clock::duration compute{0};
  for (const PipeAction& a : actions_) {
    exchange(a.transfers);
    if (!a.compute) continue;
    const PipeStep& s = *a.compute;
    const Clock::time_point t0 = Clock::now();
    if (s.op == PipeCompute::forward) {
      engine_.forward_chunk(s.chunk, s.micro_batch, batches[static_cast<std::size_t>(s.micro_batch)]);
    } else {
      engine_.backward_chunk(s.chunk, s.micro_batch);
    }
    compute += Clock::now() - t0;
    if (tracing_)
      trace_.push_back({s.op == PipeCompute::forward ? PipelineEvent::Kind::forward : PipelineEvent::Kind::backward, s.micro_batch, s.chunk, true, -1});
  }
  engine_.synchronize();  // a GPU's queued kernels belong to this step's time
  step_s_ = seconds(Clock::now() - start);
  compute_s_ = seconds(compute);
  engine_.pipeline_step();
  return engine_.state().last_step_loss;
}

float PipelineEngine::evaluate(const Batch& batch) {
  // Every chunk in the order of the virtual stages: receive the input, run, pass the output on.
  // The chain has no cycle (virtual stage v waits only on v - 1), so plain send / recv suffice.
  const int stages = pipeline_.world_size();
  const int stage = pipeline_.rank();
  const int last = stages * virtual_stages_ - 1;
  float loss = 0.0f;
  for (int c = 0; c < virtual_stages_; ++c) {
    const int v = c * stages + stage;
    if (v > 0) {
      pipeline_.recv(engine_.pipeline_input(c, 0), (v - 1) % stages);
      pipeline_.order_compute_after_collectives();
    }
    const float l = engine_.evaluate_chunk(c, batch);
    if (v == last) loss = l;
    if (v < last) pipeline_.send(engine_.pipeline_output(c, 0), (v + 1) % stages);
  }
  // Every stage returns the loss: the last stage's, summed over the group (0 elsewhere).
  float all[1] = {loss};
  engine_.pipeline_all_reduce_sum(std::span<float>(all, 1));
  return all[0];
}

std::unique_ptr<Communicator> make_pipeline_ties_group(Communicator& world, const MeshGroups& mesh, const Model& stage_model) {
  const bool holder = !stage_model.shared_params.empty();
  // Every rank gets a group (split refuses "no group"): the holders one per tensor-parallel index,
  // every other rank one of its own.
  const int color = holder ? mesh.coord.tp : mesh.shape.tp + world.rank();
  std::unique_ptr<Communicator> group = world.split(color, world.rank());
  if (!holder) return nullptr;
  return group;
}

}  // namespace dstrain
