#include "engine/pipeline_engine.h"

#include <algorithm>

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
  int backwards = 0;
  for (const PipeAction& a : actions_)
    if (a.compute && a.compute->op == PipeCompute::backward) backward_index_[{a.compute->chunk, a.compute->micro_batch}] = backwards++;
}

std::vector<int> PipelineEngine::in_flight(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages) {
  const std::vector<PipeStep> order = pipeline_compute_order(kind, stages, stage, micro_batches, virtual_stages);
  std::vector<int> n;
  for (int c = 0; c < virtual_stages; ++c) n.push_back(max_in_flight(order, c));
  return n;
}

namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool overlaps_any(const Tensor& t, const std::vector<Tensor>& set) {
  return std::any_of(set.begin(), set.end(), [&](const Tensor& u) { return overlaps(t, u); });
}

}  // namespace

std::vector<Tensor> PipelineEngine::buffers_of(const PipeTransfer& t) const {
  std::vector<Tensor> b;
  if (t.activation) {
    b.push_back(t.is_send ? engine_.pipeline_output(t.chunk, t.micro_batch) : engine_.pipeline_input(t.chunk, t.micro_batch));
    b.push_back(t.is_send ? engine_.pipeline_output_stats(t.chunk, t.micro_batch) : engine_.pipeline_input_stats(t.chunk, t.micro_batch));
  } else {
    // A gradient belongs to a backward: the one that produced it (a send) or will read it (a recv).
    const int k = backward_index_.at({t.chunk, t.micro_batch});
    b.push_back(t.is_send ? engine_.pipeline_grad_out(k % 2) : engine_.pipeline_grad_in(k % 2));
    b.push_back(t.is_send ? engine_.pipeline_grad_out_stats(k % 2) : engine_.pipeline_grad_in_stats(k % 2));
  }
  if (b.back().empty()) b.pop_back();  // no router statistics travel
  return b;
}

PipelineEngine::Touched PipelineEngine::touched_by(const PipeStep& s) const {
  Touched t;
  const bool has_input = engine_.model().chunks[static_cast<std::size_t>(s.chunk)].virtual_stage != 0;  // else it reads the tokens
  const auto add = [](std::vector<Tensor>& to, const Tensor& x) {
    if (!x.empty()) to.push_back(x);
  };
  if (s.op == PipeCompute::forward) {
    if (has_input) add(t.reads, engine_.pipeline_input(s.chunk, s.micro_batch));
    if (has_input) add(t.reads, engine_.pipeline_input_stats(s.chunk, s.micro_batch));
    add(t.writes, engine_.pipeline_output(s.chunk, s.micro_batch));
    add(t.writes, engine_.pipeline_output_stats(s.chunk, s.micro_batch));
  } else {
    const int k = backward_index_.at({s.chunk, s.micro_batch});
    add(t.reads, engine_.pipeline_grad_in(k % 2));
    add(t.reads, engine_.pipeline_grad_in_stats(k % 2));
    if (has_input) add(t.reads, engine_.pipeline_input(s.chunk, s.micro_batch));
    add(t.writes, engine_.pipeline_grad_out(k % 2));
    add(t.writes, engine_.pipeline_grad_out_stats(k % 2));
    add(t.writes, engine_.pipeline_output(s.chunk, s.micro_batch));  // a recomputed segment may rewrite it
  }
  return t;
}

// One request for the transfer's messages (its activation or gradient, then the router
// statistics): the peer posts the same two in the same order, and they match in it.
void PipelineEngine::post(const PipeTransfer& t, std::vector<InFlight>& in_flight) {
  std::vector<Tensor> bufs = buffers_of(t);
  std::vector<PointToPointOp> ops;
  for (const Tensor& b : bufs) ops.push_back(PointToPointOp{t.is_send, b, t.peer});
  in_flight.push_back(InFlight{pipeline_.start_send_recv(ops), std::move(bufs), t.is_send});
  if (tracing_) trace_.push_back({t.is_send ? PipelineEvent::Kind::send : PipelineEvent::Kind::recv, t.micro_batch, t.chunk, t.activation, t.peer});
}

// Before a compute: the transfers it depends on — a recv into memory it reads or writes, a send
// from memory it writes — and nothing else. Each was complete before the same compute in the
// blocking order (a recv of this action's batch, a send of an earlier one), so waiting for fewer
// adds no wait a blocking run did not have.
void PipelineEngine::wait_for(const Touched& t, std::vector<InFlight>& in_flight) {
  for (InFlight& f : in_flight) {
    if (!f.request.pending()) continue;
    const bool conflict = std::any_of(f.buffers.begin(), f.buffers.end(), [&](const Tensor& b) {
      return f.is_send ? overlaps_any(b, t.writes) : (overlaps_any(b, t.writes) || overlaps_any(b, t.reads));
    });
    if (conflict) f.request.wait();
  }
  std::erase_if(in_flight, [](const InFlight& f) { return !f.request.pending(); });
}

float PipelineEngine::train_batch(std::span<const Batch> batches) {
  const std::int64_t gas = engine_.config().gradient_accumulation_steps;
  if (static_cast<std::int64_t>(batches.size()) != gas)
    fail("PipelineEngine::train_batch: {} micro-batches given, but a step is gradient_accumulation_steps = {} of them", batches.size(), gas);
  const Clock::time_point start = Clock::now();
  Clock::duration compute{0};
  // The transfers started and not yet waited for, in start order. Destroyed by an exception, they
  // are abandoned (PointToPointRequest): the local backend then fails the peers at once.
  std::vector<InFlight> in_flight;
  std::vector<char> posted_early(actions_.size(), 0);  // action k's recvs were posted before compute k-1
  for (std::size_t k = 0; k < actions_.size(); ++k) {
    const PipeAction& a = actions_[k];
    // The batch, as the blocking version posted it (each op its own request, so that a compute
    // waits only for the ones it depends on): the previous compute's outputs, then this one's
    // inputs unless they went out a compute ahead.
    for (const PipeTransfer& t : a.transfers)
      if (t.is_send || !posted_early[k]) post(t, in_flight);
    if (!a.compute) continue;
    const PipeStep& s = *a.compute;
    const Touched touched = touched_by(s);
    // Megatron's overlap_p2p_comm: the next action's recvs go out now, a compute ahead, when their
    // buffers are not this compute's. A post never waits, and a pair's recvs keep their order.
    if (overlap_ && k + 1 < actions_.size()) {
      const auto& next = actions_[k + 1].transfers;
      const bool free = std::none_of(next.begin(), next.end(), [&](const PipeTransfer& t) {
        if (t.is_send) return false;
        const std::vector<Tensor> bufs = buffers_of(t);
        return std::any_of(bufs.begin(), bufs.end(),
                           [&](const Tensor& b) { return overlaps_any(b, touched.reads) || overlaps_any(b, touched.writes); });
      });
      if (free && std::any_of(next.begin(), next.end(), [](const PipeTransfer& t) { return !t.is_send; })) {
        for (const PipeTransfer& t : next)
          if (!t.is_send) post(t, in_flight);
        posted_early[k + 1] = 1;
      }
    }
    if (overlap_) {
      wait_for(touched, in_flight);
    } else {
      for (InFlight& f : in_flight) f.request.wait();  // the whole batch, as send_recv
      in_flight.clear();
    }
    // NCCL: wait() ordered the compute stream after the batches waited for; the host backends
    // have moved their data.
    const auto pending = static_cast<int>(in_flight.size());
    const Clock::time_point t0 = Clock::now();
    if (s.op == PipeCompute::forward) {
      engine_.forward_chunk(s.chunk, s.micro_batch, batches[static_cast<std::size_t>(s.micro_batch)]);
    } else {
      engine_.backward_chunk(s.chunk, s.micro_batch);
    }
    compute += Clock::now() - t0;
    if (tracing_) {
      PipelineEvent e{s.op == PipeCompute::forward ? PipelineEvent::Kind::forward : PipelineEvent::Kind::backward, s.micro_batch, s.chunk, true, -1};
      e.pending_transfers = pending;
      trace_.push_back(e);
    }
  }
  for (InFlight& f : in_flight) f.request.wait();  // every transfer of the step is complete
  in_flight.clear();
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
  // A mixture of experts' router statistics follow the activation (the evaluation's loss has the
  // load-balancing term, as Engine::evaluate's).
  for (int c = 0; c < virtual_stages_; ++c) {
    const int v = c * stages + stage;
    if (v > 0) {
      pipeline_.recv(engine_.pipeline_input(c, 0), (v - 1) % stages);
      if (const Tensor st = engine_.pipeline_input_stats(c, 0); !st.empty()) pipeline_.recv(st, (v - 1) % stages);
      pipeline_.order_compute_after_collectives();
    }
    const float l = engine_.evaluate_chunk(c, batch);
    if (v == last) loss = l;
    if (v < last) {
      pipeline_.send(engine_.pipeline_output(c, 0), (v + 1) % stages);
      if (const Tensor st = engine_.pipeline_output_stats(c, 0); !st.empty()) pipeline_.send(st, (v + 1) % stages);
    }
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
