// Pipeline schedules as data: each rank's compute order, its point-to-point actions, and a simulator
// that runs all ranks' actions against each other (docs/parallelism.md "Pipeline schedules", drafted
// in docs/pipeline_schedules_draft.md).
//
// P stages (pipeline ranks), M micro-batches per optimizer step, V model chunks per rank. Chunk c of
// rank s is virtual stage v = c·P + s (Megatron-LM's layout: rank s holds pieces s, s+P, s+2P, ... of
// the P·V pieces of the model). Virtual stage 0 takes the tokens, virtual stage P·V-1 computes the loss.
// Forward (m, v) needs the activation of forward (m, v-1); backward (m, v) needs the gradient of
// backward (m, v+1) and the activations of its own forward (m, v).
//
// The pipeline engine executes pipeline_actions(); nothing here touches a tensor or a communicator,
// so every schedule can be checked on a machine of one core (tests/unit/engine/test_pipeline_schedule.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain {

// one_f_one_b: DeepSpeed's TrainSchedule / Megatron's non-interleaved 1F1B (PipeDream-Flush).
// interleaved: Megatron's interleaved 1F1B over V >= 2 chunks per rank.
// gpipe: all forwards, then all backwards (the memory reference: M activation sets per stage).
enum class PipelineScheduleKind { one_f_one_b, interleaved, gpipe };

enum class PipeCompute { forward, backward };

// One compute of a rank: the forward or backward of micro-batch `micro_batch` through this rank's
// model chunk `chunk` (0..V-1).
struct PipeStep {
  PipeCompute op;
  int micro_batch;
  int chunk;
  bool operator==(const PipeStep&) const = default;
};

// A transfer between neighbouring virtual stages: an activation (forward direction) or a gradient
// (backward direction). peer: the other pipeline rank; chunk: THIS rank's chunk the data belongs to
// (a send: the chunk that produced it; a recv: the chunk that consumes it).
struct PipeTransfer {
  bool is_send;
  bool activation;
  int peer;
  int micro_batch;
  int chunk;
  bool operator==(const PipeTransfer&) const = default;
};

// One action of a rank: first every transfer, posted together as ONE batch that completes when all
// of its transfers completed (torch's batch_isend_irecv; the engine uses Communicator::send_recv),
// then the compute, if any.
struct PipeAction {
  std::vector<PipeTransfer> transfers;
  std::optional<PipeStep> compute;
};

// Rank `stage`'s compute order.
//   one_f_one_b  warm-up min(P-1-s, M) forwards, then one forward one backward, then the remaining
//                backwards (DeepSpeed's TrainSchedule and Megatron's non-interleaved 1F1B agree).
//   interleaved  Megatron's interleaved 1F1B: the k-th forward is micro-batch (k / PV)·P + k % P on
//                chunk (k % PV) / P, the k-th backward the same micro-batch on chunk V-1-(k % PV)/P;
//                warm-up min((P-s-1)·2 + (V-1)·P, M·V) forwards, then forward/backward pairs, then
//                the remaining backwards. Needs V >= 2, P >= 2 and M % P == 0.
//   gpipe        M forwards, then M backwards (both in micro-batch order).
// Error for P < 1, M < 1, a stage outside [0, P), V < 1, V > 1 with a non-interleaved kind.
std::vector<PipeStep> pipeline_compute_order(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages);

// The actions of rank `stage`. The compute order is cut into units: each compute is a unit of its own,
// except the interleaved schedule's steady state, where a forward and the backward after it are one
// unit. The first action of a unit holds ONE batch with
//   (a) the sends of the previous unit's outputs, in compute order: after a forward its activation to
//       the next virtual stage, after a backward its gradient to the previous one, when that exists;
//   (b) the recvs of this unit's inputs, in compute order: a forward on v > 0 the activation from v-1,
//       a backward on v < PV-1 the gradient from v+1;
// and the unit's first compute; the pair's backward follows in an action with no transfers. A final
// action with no compute sends the last unit's output (omitted when it has no receiver).
// 1F1B and GPipe: one send and one recv per batch, Megatron's send_forward_recv_backward /
// send_backward_recv_forward. Interleaved: Megatron's send_forward_backward_recv_forward_backward, the
// four transfers of a steady-state pair in one batch; without it the gradients, which go round the ring
// of ranks (rank 0's chunk 1 sends to rank P-1's chunk 0), deadlock as P blocking sends.
// Why the rule is deadlock-free: docs/parallelism.md "Pipeline schedules" (docs/pipeline_schedules_draft.md).
std::vector<PipeAction> pipeline_actions(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages);

// The most micro-batches whose forward ran and whose backward did not yet, on chunk `chunk` at any
// point of `order` (the activation sets the engine holds for that chunk), and over all chunks together.
int max_in_flight(const std::vector<PipeStep>& order, int chunk);
int max_in_flight(const std::vector<PipeStep>& order);

// What a run of all ranks' actions gave. Times in the unit of fwd_time / bwd_time.
struct PipelineSimulation {
  double makespan = 0;                // time when the last rank finished
  std::vector<double> busy;           // per rank: compute time
  std::vector<double> idle_fraction;  // per rank: 1 - busy / makespan
  std::vector<int> peak_in_flight;    // per rank: max_in_flight over all chunks
};

// Runs the P ranks' action lists against each other. A batch posts all its transfers at once and
// completes when each send has met its peer's matching recv and each recv its peer's send; the k-th
// send from rank a to rank b meets the k-th recv on b from a (FIFO per ordered pair), and the two
// must agree on activation / gradient, micro-batch and virtual stage (an Error naming both if not).
// Transfers take no time; a compute takes fwd_time or bwd_time (the time of ONE chunk: to compare
// V chunks of 1/V of a stage with V = 1, pass the stage's times divided by V). Checks every
// dependency as it runs (a forward without its activation, a backward without its forward or its
// gradient, a send of an output not computed yet, a step computed twice or never: an Error), and
// names the ranks and their pending actions on a deadlock.
PipelineSimulation simulate_actions(const std::vector<std::vector<PipeAction>>& actions, int micro_batches, int virtual_stages, double fwd_time,
                                    double bwd_time);
// simulate_actions over pipeline_actions() of every rank.
PipelineSimulation simulate_pipeline(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages, double fwd_time, double bwd_time);

// The textbook bubble: (P-1)/(M+P-1) for 1F1B and GPipe; (P-1)/(V·M+P-1) for interleaved (Megatron:
// the bubble time divided by V at the same work).
double ideal_bubble_fraction(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages);

// "1F1B", "interleaved 1F1B (V=2)", "GPipe".
std::string describe_schedule(PipelineScheduleKind kind, int virtual_stages);
// "1f1b" | "interleaved" | "gpipe"; an Error naming the value and the choices otherwise.
PipelineScheduleKind parse_schedule_kind(std::string_view name);

}  // namespace dstrain
