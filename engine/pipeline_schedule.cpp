// Pipeline schedules: the compute orders of engine/pipeline_schedule.h, their actions, and the
// simulator that runs every rank's actions against the others'.
#include "engine/pipeline_schedule.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain {
namespace {

void check_sizes(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages) {
  if (stages < 1) fail("pipeline schedule: {} pipeline stages; a pipeline has at least 1 stage", stages);
  if (micro_batches < 1) fail("pipeline schedule: {} micro-batches per step; a step runs at least 1 (gradient_accumulation_steps)", micro_batches);
  if (stage < 0 || stage >= stages) fail("pipeline schedule: stage {} is outside [0, {}) for {} pipeline stages", stage, stages, stages);
  if (virtual_stages < 1) fail("pipeline schedule: {} model chunks per rank; a rank holds at least 1", virtual_stages);
  if (kind != PipelineScheduleKind::interleaved) {
    if (virtual_stages > 1) {
      fail("pipeline schedule: {} model chunks per rank need the interleaved schedule; {} runs 1 chunk per rank (use 'interleaved' or 1 chunk)",
           virtual_stages, describe_schedule(kind, 1));
    }
    return;
  }
  if (virtual_stages < 2)
    fail("pipeline schedule: interleaved 1F1B needs at least 2 model chunks per rank, got {} (use '1f1b' for 1)", virtual_stages);
  // Megatron refuses it too: with one rank every "transfer" would be a rank sending to itself.
  if (stages < 2) fail("pipeline schedule: interleaved 1F1B needs at least 2 pipeline stages, got {} (use '1f1b')", stages);
  // Megatron's micro-batch groups of P: the k-th forward's micro-batch (k / PV)·P + k % P only covers
  // every micro-batch when P divides M.
  if (micro_batches % stages != 0) {
    fail("pipeline schedule: interleaved 1F1B needs the micro-batches per step ({}) to be a multiple of the pipeline stages ({})", micro_batches,
         stages);
  }
}

// The virtual stage of chunk c on rank s (Megatron's layout).
int virtual_stage(int stages, int rank, int chunk) { return chunk * stages + rank; }

// 1F1B-shaped order: `warmup` forwards, then forward/backward pairs, then the remaining backwards.
std::vector<PipeStep> one_f_one_b_shape(const std::vector<PipeStep>& forwards, const std::vector<PipeStep>& backwards, int warmup) {
  std::vector<PipeStep> order;
  order.reserve(forwards.size() + backwards.size());
  const int total = static_cast<int>(forwards.size());
  for (int k = 0; k < warmup; ++k) order.push_back(forwards[k]);
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(forwards[warmup + k]);
    order.push_back(backwards[k]);
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(backwards[k]);
  return order;
}

std::string op_name(PipeCompute op) { return op == PipeCompute::forward ? "forward" : "backward"; }

std::string describe_step(const PipeStep& step) {
  return fmt::format("{} of micro-batch {} chunk {}", op_name(step.op), step.micro_batch, step.chunk);
}

std::string describe_transfer(const PipeTransfer& t) {
  return fmt::format("{} {} of micro-batch {} (chunk {}) {} rank {}", t.is_send ? "send" : "recv", t.activation ? "activation" : "gradient",
                     t.micro_batch, t.chunk, t.is_send ? "to" : "from", t.peer);
}

// The send that carries a compute's output to its neighbouring virtual stage, if it has one.
std::optional<PipeTransfer> output_send(const PipeStep& step, int stages, int rank, int virtual_stages) {
  const int v = virtual_stage(stages, rank, step.chunk);
  if (step.op == PipeCompute::forward) {
    if (v + 1 >= stages * virtual_stages) return std::nullopt;  // the loss stage: its output stays
    return PipeTransfer{true, true, (v + 1) % stages, step.micro_batch, step.chunk};
  }
  if (v == 0) return std::nullopt;  // the token stage: no gradient goes further back
  return PipeTransfer{true, false, (v - 1) % stages, step.micro_batch, step.chunk};
}

// The recv a compute needs before it runs, if any.
std::optional<PipeTransfer> input_recv(const PipeStep& step, int stages, int rank, int virtual_stages) {
  const int v = virtual_stage(stages, rank, step.chunk);
  if (step.op == PipeCompute::forward) {
    if (v == 0) return std::nullopt;  // reads the tokens
    return PipeTransfer{false, true, (v - 1) % stages, step.micro_batch, step.chunk};
  }
  if (v + 1 >= stages * virtual_stages) return std::nullopt;  // starts from its own loss
  return PipeTransfer{false, false, (v + 1) % stages, step.micro_batch, step.chunk};
}

}  // namespace

std::vector<PipeStep> pipeline_compute_order(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages) {
  check_sizes(kind, stages, stage, micro_batches, virtual_stages);
  const int P = stages, M = micro_batches, V = virtual_stages;
  std::vector<PipeStep> forwards, backwards;
  if (kind != PipelineScheduleKind::interleaved) {
    for (int m = 0; m < M; ++m) forwards.push_back({PipeCompute::forward, m, 0});
    for (int m = 0; m < M; ++m) backwards.push_back({PipeCompute::backward, m, 0});
    // GPipe is the 1F1B shape whose warm-up is every forward.
    const int warmup = kind == PipelineScheduleKind::gpipe ? M : std::min(P - 1 - stage, M);
    return one_f_one_b_shape(forwards, backwards, warmup);
  }
  // Megatron's interleaving: groups of P micro-batches go through chunk 0, then the same group through
  // chunk 1, ...; the backwards walk the chunks in reverse. k-th virtual micro-batch of M·V.
  const int total = M * V;
  for (int k = 0; k < total; ++k) {
    const int micro = (k / (P * V)) * P + k % P;
    const int chunk = (k % (P * V)) / P;
    forwards.push_back({PipeCompute::forward, micro, chunk});
    backwards.push_back({PipeCompute::backward, micro, V - 1 - chunk});
  }
  // Every rank first runs (V-1)·P forwards (the first group through all but the last chunk), and the
  // earlier ranks two more per stage behind them, so that the gradients they wait for have arrived.
  const int warmup = std::min((P - stage - 1) * 2 + (V - 1) * P, total);
  return one_f_one_b_shape(forwards, backwards, warmup);
}

std::vector<PipeAction> pipeline_actions(PipelineScheduleKind kind, int stages, int stage, int micro_batches, int virtual_stages) {
  const std::vector<PipeStep> order = pipeline_compute_order(kind, stages, stage, micro_batches, virtual_stages);
  std::vector<PipeAction> actions;
  actions.reserve(order.size() + 1);
  // Units: every compute on its own, except the interleaved schedule's steady-state forward/backward
  // pairs, which are one unit (Megatron-LM's one batch of four transfers per pair): a rank's gradient
  // send then sits in the same batch as the recv of the gradient its next backward needs, so the ring of
  // gradient sends (rank 0 chunk c+1 -> rank P-1 chunk c) meets its recvs in one round instead of P
  // blocking sends waiting on each other. 1F1B keeps one compute per unit: its activation goes out
  // before the backward, and its forward does not wait for the gradient of the backward after it
  // (paired, each forward would wait for the next stage's backward: P = 2, M = 8 would take 48, not 27,
  // with f = 1, b = 2).
  std::vector<std::pair<std::size_t, std::size_t>> units;  // [begin, end) of order
  // Without a steady state (every forward before every backward: the warm-up took all of them) the last
  // forward and the first backward are no pair.
  const std::size_t leading_forwards = static_cast<std::size_t>(
      std::find_if(order.begin(), order.end(), [](const PipeStep& step) { return step.op == PipeCompute::backward; }) - order.begin());
  const bool pairs = kind == PipelineScheduleKind::interleaved && leading_forwards < order.size() / 2;
  for (std::size_t i = 0; i < order.size();) {
    const bool pair = pairs && i + 1 < order.size() && order[i].op == PipeCompute::forward && order[i + 1].op == PipeCompute::backward;
    units.emplace_back(i, i + (pair ? 2 : 1));
    i += pair ? 2 : 1;
  }
  std::vector<PipeTransfer> pending_sends;  // the previous unit's outputs
  for (const auto& [begin, end] : units) {
    PipeAction action;
    action.transfers = pending_sends;
    pending_sends.clear();
    for (std::size_t i = begin; i < end; ++i) {
      if (auto recv = input_recv(order[i], stages, stage, virtual_stages)) action.transfers.push_back(*recv);
    }
    for (std::size_t i = begin; i < end; ++i) {
      action.compute = order[i];
      actions.push_back(std::move(action));
      action = PipeAction{};
      if (auto send = output_send(order[i], stages, stage, virtual_stages)) pending_sends.push_back(*send);
    }
  }
  if (!pending_sends.empty()) actions.push_back(PipeAction{pending_sends, std::nullopt});
  return actions;
}

int max_in_flight(const std::vector<PipeStep>& order, int chunk) {
  int live = 0, peak = 0;
  for (const PipeStep& step : order) {
    if (step.chunk != chunk) continue;
    live += step.op == PipeCompute::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

int max_in_flight(const std::vector<PipeStep>& order) {
  int live = 0, peak = 0;
  for (const PipeStep& step : order) {
    live += step.op == PipeCompute::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

PipelineSimulation simulate_actions(const std::vector<std::vector<PipeAction>>& actions, int micro_batches, int virtual_stages, double fwd_time,
                                    double bwd_time) {
  const int P = static_cast<int>(actions.size());
  const int M = micro_batches, V = virtual_stages;
  if (P < 1 || M < 1 || V < 1) fail("simulate_actions: {} ranks, {} micro-batches, {} chunks per rank; each must be at least 1", P, M, V);
  const int PV = P * V;

  // What each rank has done, per (micro-batch, chunk).
  struct RankState {
    std::size_t next = 0;                           // the action it runs (or waits in)
    bool posted = false;                            // the action's transfers are posted
    double clock = 0;                               // when the action was posted: the end of the previous compute
    std::vector<double> matched_at;                 // per transfer of the posted action: when it met its peer (< 0: not yet)
    std::vector<char> fwd, bwd, got_act, got_grad;  // index m·V + c
    double busy = 0;
    std::vector<PipeStep> order;
  };
  std::vector<RankState> ranks(P);
  for (auto& r : ranks) r.fwd = r.bwd = r.got_act = r.got_grad = std::vector<char>(static_cast<std::size_t>(M) * V, 0);
  auto at = [&](int m, int c) { return static_cast<std::size_t>(m) * V + c; };

  // Per ordered pair (from, to): the posted sends and recvs, in program order; the k-th of each meet.
  struct Posted {
    int rank;
    std::size_t action, transfer;
    double time;
  };
  std::vector<std::vector<Posted>> sends(static_cast<std::size_t>(P) * P), recvs(static_cast<std::size_t>(P) * P);
  std::vector<std::size_t> met(static_cast<std::size_t>(P) * P, 0);
  auto transfer_of = [&](const Posted& p) -> const PipeTransfer& { return actions[p.rank][p.action].transfers[p.transfer]; };
  auto where = [&](const Posted& p) { return fmt::format("rank {} action {}: {}", p.rank, p.action, describe_transfer(transfer_of(p))); };

  auto check_range = [&](int rank, std::size_t a, int m, int c) {
    if (m < 0 || m >= M || c < 0 || c >= V) {
      fail("simulate_actions: rank {} action {} names micro-batch {} chunk {}, outside {} micro-batches x {} chunks", rank, a, m, c, M, V);
    }
  };

  auto post = [&](int r) {
    RankState& st = ranks[r];
    const PipeAction& action = actions[r][st.next];
    st.posted = true;
    st.matched_at.assign(action.transfers.size(), -1.0);
    for (std::size_t i = 0; i < action.transfers.size(); ++i) {
      const PipeTransfer& t = action.transfers[i];
      check_range(r, st.next, t.micro_batch, t.chunk);
      if (t.peer < 0 || t.peer >= P)
        fail("simulate_actions: rank {} action {}: {} names a rank outside [0, {})", r, st.next, describe_transfer(t), P);
      if (t.is_send) {
        // Only what was computed can be sent.
        const auto& done = t.activation ? st.fwd : st.bwd;
        if (!done[at(t.micro_batch, t.chunk)]) {
          fail("simulate_actions: rank {} action {}: {} before its {} ran", r, st.next, describe_transfer(t), t.activation ? "forward" : "backward");
        }
        sends[static_cast<std::size_t>(r) * P + t.peer].push_back({r, st.next, i, st.clock});
      } else {
        recvs[static_cast<std::size_t>(t.peer) * P + r].push_back({r, st.next, i, st.clock});
      }
    }
  };

  // Meets the k-th send and the k-th recv of each pair; both transfers complete when the later one was posted.
  auto match = [&]() {
    bool any = false;
    for (int from = 0; from < P; ++from) {
      for (int to = 0; to < P; ++to) {
        const std::size_t pair = static_cast<std::size_t>(from) * P + to;
        while (met[pair] < sends[pair].size() && met[pair] < recvs[pair].size()) {
          const Posted& s = sends[pair][met[pair]];
          const Posted& q = recvs[pair][met[pair]];
          const PipeTransfer& ts = transfer_of(s);
          const PipeTransfer& tq = transfer_of(q);
          // The data must be what the receiver expects: the same kind and micro-batch, from the
          // virtual stage next to the receiver's in the data's direction.
          const int vs = virtual_stage(P, from, ts.chunk), vq = virtual_stage(P, to, tq.chunk);
          const bool agree = ts.activation == tq.activation && ts.micro_batch == tq.micro_batch && vq == vs + (ts.activation ? 1 : -1);
          if (!agree) {
            fail(
                "pipeline transfer mismatch: send #{} from rank {} to rank {} ({}, virtual stage {}) meets {} (virtual stage {}); "
                "the two ranks' actions disagree on the order of their transfers",
                met[pair] + 1, from, to, where(s), vs, where(q), vq);
          }
          const double t = std::max(s.time, q.time);
          ranks[from].matched_at[s.transfer] = t;
          ranks[to].matched_at[q.transfer] = t;
          ++met[pair];
          any = true;
        }
      }
    }
    return any;
  };

  // Completes rank r's posted action if every transfer met its peer, and runs the compute.
  auto complete = [&](int r) {
    RankState& st = ranks[r];
    const PipeAction& action = actions[r][st.next];
    double start = st.clock;
    for (double t : st.matched_at) {
      if (t < 0) return false;
      start = std::max(start, t);
    }
    for (const PipeTransfer& t : action.transfers) {
      if (!t.is_send) (t.activation ? st.got_act : st.got_grad)[at(t.micro_batch, t.chunk)] = 1;
    }
    if (action.compute) {
      const PipeStep& step = *action.compute;
      check_range(r, st.next, step.micro_batch, step.chunk);
      const std::size_t i = at(step.micro_batch, step.chunk);
      const int v = virtual_stage(P, r, step.chunk);
      if (step.op == PipeCompute::forward) {
        if (st.fwd[i]) fail("simulate_actions: rank {} action {}: {} runs twice", r, st.next, describe_step(step));
        if (v > 0 && !st.got_act[i])
          fail("simulate_actions: rank {} action {}: {} without the activation of virtual stage {}", r, st.next, describe_step(step), v - 1);
        st.fwd[i] = 1;
      } else {
        if (st.bwd[i]) fail("simulate_actions: rank {} action {}: {} runs twice", r, st.next, describe_step(step));
        if (!st.fwd[i]) fail("simulate_actions: rank {} action {}: {} before its forward", r, st.next, describe_step(step));
        if (v + 1 < PV && !st.got_grad[i]) {
          fail("simulate_actions: rank {} action {}: {} without the gradient of virtual stage {}", r, st.next, describe_step(step), v + 1);
        }
        st.bwd[i] = 1;
      }
      const double cost = step.op == PipeCompute::forward ? fwd_time : bwd_time;
      start += cost;
      st.busy += cost;
      st.order.push_back(step);
    }
    st.clock = start;
    st.posted = false;
    ++st.next;
    return true;
  };

  // The k-th send always meets the k-th recv, whatever the timing, so one pass order gives the times of
  // every order: post what can be posted, meet, complete, until nothing moves.
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      if (!ranks[r].posted && ranks[r].next < actions[r].size()) {
        post(r);
        moved = true;
      }
    }
    moved = match() || moved;
    for (int r = 0; r < P; ++r) {
      if (ranks[r].posted && complete(r)) moved = true;
    }
  }

  std::string stuck;
  for (int r = 0; r < P; ++r) {
    const RankState& st = ranks[r];
    if (st.next >= actions[r].size()) continue;
    const PipeAction& action = actions[r][st.next];
    std::string waits;
    for (std::size_t i = 0; i < action.transfers.size(); ++i) {
      if (st.matched_at[i] < 0) waits += fmt::format("{}{}", waits.empty() ? "" : ", ", describe_transfer(action.transfers[i]));
    }
    stuck += fmt::format("; rank {} waits in action {} of {} on {} (then {})", r, st.next, actions[r].size(), waits,
                         action.compute ? describe_step(*action.compute) : std::string("no compute"));
  }
  if (!stuck.empty()) fail("pipeline deadlock: no rank can move{}", stuck);

  PipelineSimulation sim;
  for (int r = 0; r < P; ++r) {
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < V; ++c) {
        if (!ranks[r].fwd[at(m, c)] || !ranks[r].bwd[at(m, c)]) {
          fail("simulate_actions: rank {} never ran the {} of micro-batch {} chunk {}", r, ranks[r].fwd[at(m, c)] ? "backward" : "forward", m, c);
        }
      }
    }
    sim.makespan = std::max(sim.makespan, ranks[r].clock);
  }
  for (int r = 0; r < P; ++r) {
    sim.busy.push_back(ranks[r].busy);
    sim.idle_fraction.push_back(sim.makespan > 0 ? 1.0 - ranks[r].busy / sim.makespan : 0.0);
    sim.peak_in_flight.push_back(max_in_flight(ranks[r].order));
  }
  return sim;
}

PipelineSimulation simulate_pipeline(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages, double fwd_time, double bwd_time) {
  check_sizes(kind, stages, 0, micro_batches, virtual_stages);
  std::vector<std::vector<PipeAction>> actions;
  for (int s = 0; s < stages; ++s) actions.push_back(pipeline_actions(kind, stages, s, micro_batches, virtual_stages));
  return simulate_actions(actions, micro_batches, virtual_stages, fwd_time, bwd_time);
}

double ideal_bubble_fraction(PipelineScheduleKind kind, int stages, int micro_batches, int virtual_stages) {
  check_sizes(kind, stages, 0, micro_batches, virtual_stages);
  const double P = stages, M = micro_batches, V = virtual_stages;
  return (P - 1) / (V * M + P - 1);  // V = 1 for 1F1B and GPipe
}

std::string describe_schedule(PipelineScheduleKind kind, int virtual_stages) {
  switch (kind) {
    case PipelineScheduleKind::one_f_one_b:
      return "1F1B";
    case PipelineScheduleKind::interleaved:
      return fmt::format("interleaved 1F1B (V={})", virtual_stages);
    case PipelineScheduleKind::gpipe:
      return "GPipe";
  }
  return "unknown pipeline schedule";
}

PipelineScheduleKind parse_schedule_kind(std::string_view name) {
  if (name == "1f1b") return PipelineScheduleKind::one_f_one_b;
  if (name == "interleaved") return PipelineScheduleKind::interleaved;
  if (name == "gpipe") return PipelineScheduleKind::gpipe;
  fail("pipeline schedule '{}' is not one of 1f1b, interleaved, gpipe", name);
}

}  // namespace dstrain
