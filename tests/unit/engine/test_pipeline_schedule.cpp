// Pipeline schedules (engine/pipeline_schedule.h): the compute orders against the definitions written
// out again here (DeepSpeed's TrainSchedule / Megatron's 1F1B, Megatron's interleaved helpers
// get_model_chunk_id / get_microbatch_id_in_model_chunk, GPipe), the orders' dependencies run by a
// dataflow of the test's own, the actions run against each other by simulate_actions (deadlock-free,
// the bubble against the formulas), and broken action lists refused.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "engine/pipeline_schedule.h"
#include "ops/error.h"

namespace dstrain {
namespace {

using K = PipelineScheduleKind;
constexpr PipeCompute F = PipeCompute::forward;
constexpr PipeCompute B = PipeCompute::backward;

const std::vector<int> kStages = {1, 2, 3, 4, 8};
const std::vector<int> kMicro = {1, 2, 3, 4, 7, 8, 16};

// ---- the definitions, written out again -------------------------------------------------------------

// 1F1B: warm-up min(P-1-s, M) forwards, then forward/backward, then the remaining backwards.
std::vector<PipeStep> ref_one_f_one_b(int P, int s, int M) {
  const int W = std::min(P - 1 - s, M);
  std::vector<PipeStep> order;
  for (int m = 0; m < W; ++m) order.push_back({F, m, 0});
  for (int i = 0; i < M - W; ++i) {
    order.push_back({F, W + i, 0});
    order.push_back({B, i, 0});
  }
  for (int m = M - W; m < M; ++m) order.push_back({B, m, 0});
  return order;
}

int megatron_warmup(int P, int s, int M, int V) { return std::min((P - s - 1) * 2 + (V - 1) * P, M * V); }

// Megatron's forward_backward_pipelining_with_interleaving, its helpers as the Python writes them.
std::vector<PipeStep> ref_interleaved(int P, int s, int M, int V) {
  auto chunk_id = [&](int k, bool forward) {
    const int c = (k % (P * V)) / P;
    return forward ? c : V - c - 1;
  };
  auto micro_id = [&](int k) { return (k / (P * V)) * P + k % P; };
  const int total = M * V, W = megatron_warmup(P, s, M, V);
  std::vector<PipeStep> order;
  for (int k = 0; k < W; ++k) order.push_back({F, micro_id(k), chunk_id(k, true)});
  for (int k = 0; k < total - W; ++k) {
    order.push_back({F, micro_id(k + W), chunk_id(k + W, true)});
    order.push_back({B, micro_id(k), chunk_id(k, false)});
  }
  for (int k = total - W; k < total; ++k) order.push_back({B, micro_id(k), chunk_id(k, false)});
  return order;
}

int leading_forwards(const std::vector<PipeStep>& order) {
  int n = 0;
  while (n < static_cast<int>(order.size()) && order[n].op == F) ++n;
  return n;
}

// Activation sets held at most, counted naively.
int naive_peak(const std::vector<PipeStep>& order, std::optional<int> chunk) {
  int live = 0, peak = 0;
  for (const auto& st : order) {
    if (chunk && st.chunk != *chunk) continue;
    live += st.op == F ? 1 : -1;
    EXPECT_GE(live, 0);
    peak = std::max(peak, live);
  }
  return peak;
}

// The test's own dataflow over every rank's compute order: a step runs when its rank is free and its
// inputs exist (transfers free and never blocking). Returns the makespan, or nullopt if no rank can move
// (an order whose dependencies cannot be met). Checks each (m, chunk) runs forward and backward once.
std::optional<double> dataflow(const std::vector<std::vector<PipeStep>>& orders, int M, int V, double f, double b) {
  const int P = static_cast<int>(orders.size());
  std::map<std::tuple<int, int, int>, double> end;  // (op, micro-batch, virtual stage) -> finish time
  std::vector<std::size_t> next(P, 0);
  std::vector<double> clock(P, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s) {
      while (next[s] < orders[s].size()) {
        const PipeStep st = orders[s][next[s]];
        const int v = st.chunk * P + s;
        double ready = clock[s];
        auto need = [&](int op, int vv) {
          auto it = end.find({op, st.micro_batch, vv});
          if (it == end.end()) return false;
          ready = std::max(ready, it->second);
          return true;
        };
        if (st.op == F && v > 0 && !need(0, v - 1)) break;
        if (st.op == B && (!need(0, v) || (v < P * V - 1 && !need(1, v + 1)))) break;
        const auto key = std::make_tuple(st.op == F ? 0 : 1, st.micro_batch, v);
        EXPECT_EQ(end.count(key), 0u) << "rank " << s << " runs a step twice";
        clock[s] = ready + (st.op == F ? f : b);
        end[key] = clock[s];
        ++next[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < P; ++s) {
    if (next[s] < orders[s].size()) return std::nullopt;
  }
  EXPECT_EQ(end.size(), static_cast<std::size_t>(2 * M * V * P));
  double makespan = 0;
  for (double c : clock) makespan = std::max(makespan, c);
  return makespan;
}

std::vector<std::vector<PipeStep>> all_orders(K kind, int P, int M, int V) {
  std::vector<std::vector<PipeStep>> orders;
  for (int s = 0; s < P; ++s) orders.push_back(pipeline_compute_order(kind, P, s, M, V));
  return orders;
}

std::vector<std::vector<PipeAction>> all_actions(K kind, int P, int M, int V) {
  std::vector<std::vector<PipeAction>> actions;
  for (int s = 0; s < P; ++s) actions.push_back(pipeline_actions(kind, P, s, M, V));
  return actions;
}

// What an Error says.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PipeTransfer send_act(int peer, int m, int c) { return {true, true, peer, m, c}; }
PipeTransfer send_grad(int peer, int m, int c) { return {true, false, peer, m, c}; }
PipeTransfer recv_act(int peer, int m, int c) { return {false, true, peer, m, c}; }
PipeTransfer recv_grad(int peer, int m, int c) { return {false, false, peer, m, c}; }

void expect_actions(const std::vector<PipeAction>& got, const std::vector<PipeAction>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].transfers, want[i].transfers) << what << " action " << i;
    EXPECT_EQ(got[i].compute, want[i].compute) << what << " action " << i;
  }
}

// ---- 1F1B and GPipe orders ---------------------------------------------------------------------------

TEST(PipelineSchedule, OneFOneBOrderIsTheDefinition) {
  for (int P : kStages) {
    for (int M : kMicro) {
      for (int s = 0; s < P; ++s) {
        const std::string at = "P=" + std::to_string(P) + " M=" + std::to_string(M) + " s=" + std::to_string(s);
        const auto order = pipeline_compute_order(K::one_f_one_b, P, s, M, 1);
        EXPECT_EQ(order, ref_one_f_one_b(P, s, M)) << at;
        ASSERT_EQ(order.size(), static_cast<std::size_t>(2 * M)) << at;
        // Every micro-batch's forward once, before its backward once.
        std::vector<int> fwd_at(M, -1), bwd_at(M, -1);
        for (int i = 0; i < 2 * M; ++i) {
          EXPECT_EQ(order[i].chunk, 0) << at;
          int& slot = order[i].op == F ? fwd_at[order[i].micro_batch] : bwd_at[order[i].micro_batch];
          EXPECT_EQ(slot, -1) << at << ": step " << i << " runs twice";
          slot = i;
        }
        for (int m = 0; m < M; ++m) EXPECT_LT(fwd_at[m], bwd_at[m]) << at << " micro-batch " << m;
        // Warm-up: min(P-1-s, M) forwards, then (while forwards remain) strictly F, B, F, B, ...
        const int W = std::min(P - 1 - s, M);
        const int lead = leading_forwards(order);
        EXPECT_EQ(lead, W < M ? W + 1 : M) << at;
        for (int i = W; i < W + 2 * (M - W); ++i) EXPECT_EQ(order[i].op, (i - W) % 2 == 0 ? F : B) << at << " steady step " << i;
        for (int i = W + 2 * (M - W); i < 2 * M; ++i) EXPECT_EQ(order[i].op, B) << at << " cool-down step " << i;
        // The 1F1B memory bound, reached.
        EXPECT_EQ(max_in_flight(order), std::min(P - s, M)) << at;
        EXPECT_EQ(max_in_flight(order, 0), std::min(P - s, M)) << at;
        EXPECT_EQ(naive_peak(order, std::nullopt), std::min(P - s, M)) << at;
      }
    }
  }
}

TEST(PipelineSchedule, GPipeRunsAllForwardsThenAllBackwards) {
  for (int P : kStages) {
    for (int M : kMicro) {
      for (int s = 0; s < P; ++s) {
        const auto order = pipeline_compute_order(K::gpipe, P, s, M, 1);
        ASSERT_EQ(order.size(), static_cast<std::size_t>(2 * M));
        for (int m = 0; m < M; ++m) {
          EXPECT_EQ(order[m], (PipeStep{F, m, 0}));
          EXPECT_EQ(order[M + m], (PipeStep{B, m, 0}));
        }
        EXPECT_EQ(max_in_flight(order), M) << "P=" << P << " M=" << M << " s=" << s;
      }
    }
  }
}

TEST(PipelineSchedule, MaxInFlightCountsPerChunk) {
  const std::vector<PipeStep> order = {{F, 0, 0}, {F, 0, 1}, {F, 1, 0}, {B, 0, 1}, {F, 1, 1}, {F, 2, 0}, {B, 1, 1}, {B, 0, 0}};
  EXPECT_EQ(max_in_flight(order, 0), 3);
  EXPECT_EQ(max_in_flight(order, 1), 1);
  EXPECT_EQ(max_in_flight(order), 4);  // after F(2, 0): chunk 0 holds 0, 1, 2 and chunk 1 holds 1
  EXPECT_EQ(max_in_flight({}, 0), 0);
}

// ---- the interleaved order ---------------------------------------------------------------------------

TEST(PipelineSchedule, InterleavedOrderIsMegatrons) {
  for (int P : {2, 4}) {
    for (int V : {2, 3}) {
      for (int M : {P, 2 * P, 4 * P}) {
        for (int s = 0; s < P; ++s) {
          const std::string at = "P=" + std::to_string(P) + " V=" + std::to_string(V) + " M=" + std::to_string(M) + " s=" + std::to_string(s);
          const auto order = pipeline_compute_order(K::interleaved, P, s, M, V);
          EXPECT_EQ(order, ref_interleaved(P, s, M, V)) << at;
          // Every (micro-batch, chunk): forward once, then backward once.
          std::map<std::pair<int, int>, int> fwd_at, bwd_at;
          for (int i = 0; i < static_cast<int>(order.size()); ++i) {
            const auto key = std::make_pair(order[i].micro_batch, order[i].chunk);
            ASSERT_TRUE(key.first >= 0 && key.first < M && key.second >= 0 && key.second < V) << at;
            auto& slots = order[i].op == F ? fwd_at : bwd_at;
            EXPECT_EQ(slots.count(key), 0u) << at << ": step " << i << " runs twice";
            slots[key] = i;
          }
          EXPECT_EQ(fwd_at.size(), static_cast<std::size_t>(M * V)) << at;
          EXPECT_EQ(bwd_at.size(), static_cast<std::size_t>(M * V)) << at;
          for (const auto& [key, i] : fwd_at) EXPECT_LT(i, bwd_at[key]) << at;
          // Megatron's warm-up: (P - s - 1)·2 + (V - 1)·P forwards, capped at M·V; the steady state
          // starts with one more forward.
          const int W = std::min((P - s - 1) * 2 + (V - 1) * P, M * V);
          EXPECT_EQ(leading_forwards(order), W < M * V ? W + 1 : M * V) << at;
          // In flight: the warm-up's forwards plus the steady state's one, never more than all.
          EXPECT_EQ(max_in_flight(order), std::min(W + 1, M * V)) << at;
          EXPECT_EQ(naive_peak(order, std::nullopt), std::min(W + 1, M * V)) << at;
          for (int c = 0; c < V; ++c) {
            EXPECT_LE(max_in_flight(order, c), M) << at;
            EXPECT_EQ(max_in_flight(order, c), naive_peak(order, c)) << at;
          }
        }
        // The dependencies hold across ranks: the test's dataflow runs every step, and (transfers free)
        // reaches the interleaved ideal (V·M + P - 1)·(f + b) with per-chunk costs.
        const auto span = dataflow(all_orders(K::interleaved, P, M, V), M, V, 1.0, 2.0);
        ASSERT_TRUE(span.has_value()) << "P=" << P << " V=" << V << " M=" << M;
        EXPECT_DOUBLE_EQ(*span, (V * M + P - 1) * 3.0) << "P=" << P << " V=" << V << " M=" << M;
      }
    }
  }
}

TEST(PipelineSchedule, OneFOneBAndGPipeOrdersMeetTheirDependencies) {
  for (K kind : {K::one_f_one_b, K::gpipe}) {
    for (int P : kStages) {
      for (int M : kMicro) {
        const auto span = dataflow(all_orders(kind, P, M, 1), M, 1, 1.0, 2.0);
        ASSERT_TRUE(span.has_value()) << "P=" << P << " M=" << M;
        EXPECT_DOUBLE_EQ(*span, (M + P - 1) * 3.0) << "P=" << P << " M=" << M;
      }
    }
  }
}

// ---- actions -----------------------------------------------------------------------------------------

TEST(PipelineSchedule, OneFOneBActionsByHand) {
  // P = 2, M = 2: stage 0 runs F0 F1 B0 B1, stage 1 runs F0 B0 F1 B1.
  expect_actions(pipeline_actions(K::one_f_one_b, 2, 0, 2, 1),
                 {{{}, PipeStep{F, 0, 0}},
                  {{send_act(1, 0, 0)}, PipeStep{F, 1, 0}},
                  {{send_act(1, 1, 0), recv_grad(1, 0, 0)}, PipeStep{B, 0, 0}},
                  {{recv_grad(1, 1, 0)}, PipeStep{B, 1, 0}}},
                 "stage 0");
  expect_actions(pipeline_actions(K::one_f_one_b, 2, 1, 2, 1),
                 {{{recv_act(0, 0, 0)}, PipeStep{F, 0, 0}},
                  {{}, PipeStep{B, 0, 0}},
                  {{send_grad(0, 0, 0), recv_act(0, 1, 0)}, PipeStep{F, 1, 0}},
                  {{}, PipeStep{B, 1, 0}},
                  {{send_grad(0, 1, 0)}, std::nullopt}},
                 "stage 1");
}

TEST(PipelineSchedule, InterleavedActionsByHand) {
  // P = 2, V = 2, M = 2. Rank 1 holds virtual stages 1 (chunk 0) and 3 (chunk 1, the loss); its warm-up
  // is 2 forwards, then the pairs F(0,1) B(0,1) and F(1,1) B(1,1), each pair's four transfers in the
  // batch before its forward, then the backwards of chunk 0.
  expect_actions(pipeline_actions(K::interleaved, 2, 1, 2, 2),
                 {{{recv_act(0, 0, 0)}, PipeStep{F, 0, 0}},
                  {{send_act(0, 0, 0), recv_act(0, 1, 0)}, PipeStep{F, 1, 0}},
                  {{send_act(0, 1, 0), recv_act(0, 0, 1)}, PipeStep{F, 0, 1}},
                  {{}, PipeStep{B, 0, 1}},
                  {{send_grad(0, 0, 1), recv_act(0, 1, 1)}, PipeStep{F, 1, 1}},
                  {{}, PipeStep{B, 1, 1}},
                  {{send_grad(0, 1, 1), recv_grad(0, 0, 0)}, PipeStep{B, 0, 0}},
                  {{send_grad(0, 0, 0), recv_grad(0, 1, 0)}, PipeStep{B, 1, 0}},
                  {{send_grad(0, 1, 0)}, std::nullopt}},
                 "rank 1");
  // Rank 0's warm-up takes all 4 forwards (min(2 + 2, 4)): no steady state, so no pairs.
  expect_actions(pipeline_actions(K::interleaved, 2, 0, 2, 2),
                 {{{}, PipeStep{F, 0, 0}},
                  {{send_act(1, 0, 0)}, PipeStep{F, 1, 0}},
                  {{send_act(1, 1, 0), recv_act(1, 0, 1)}, PipeStep{F, 0, 1}},
                  {{send_act(1, 0, 1), recv_act(1, 1, 1)}, PipeStep{F, 1, 1}},
                  {{send_act(1, 1, 1), recv_grad(1, 0, 1)}, PipeStep{B, 0, 1}},
                  {{send_grad(1, 0, 1), recv_grad(1, 1, 1)}, PipeStep{B, 1, 1}},
                  {{send_grad(1, 1, 1), recv_grad(1, 0, 0)}, PipeStep{B, 0, 0}},
                  {{recv_grad(1, 1, 0)}, PipeStep{B, 1, 0}}},
                 "rank 0");
}

// Each compute of every schedule is preceded by the batch that holds its input, and each output
// leaves in the next batch; batches hold at most one send and one recv (two of each for interleaved pairs).
TEST(PipelineSchedule, ActionsFollowTheRule) {
  struct Case {
    K kind;
    int P, M, V;
  };
  std::vector<Case> cases;
  for (int P : kStages) {
    for (int M : kMicro) {
      cases.push_back({K::one_f_one_b, P, M, 1});
      cases.push_back({K::gpipe, P, M, 1});
    }
  }
  for (int P : {2, 4}) {
    for (int V : {2, 3}) {
      for (int M : {P, 2 * P, 4 * P}) cases.push_back({K::interleaved, P, M, V});
    }
  }
  for (const Case& c : cases) {
    const int PV = c.P * c.V;
    for (int s = 0; s < c.P; ++s) {
      const std::string at = describe_schedule(c.kind, c.V) + " P=" + std::to_string(c.P) + " M=" + std::to_string(c.M) + " s=" + std::to_string(s);
      const auto actions = pipeline_actions(c.kind, c.P, s, c.M, c.V);
      std::vector<PipeStep> computes;
      std::vector<PipeTransfer> sends_seen, recvs_seen;
      for (const auto& a : actions) {
        int sends = 0, recvs = 0;
        for (const auto& t : a.transfers) (t.is_send ? sends : recvs) += 1;
        EXPECT_LE(sends, c.kind == K::interleaved ? 2 : 1) << at;
        EXPECT_LE(recvs, c.kind == K::interleaved ? 2 : 1) << at;
        for (const auto& t : a.transfers) (t.is_send ? sends_seen : recvs_seen).push_back(t);
        if (a.compute) computes.push_back(*a.compute);
      }
      EXPECT_EQ(computes, pipeline_compute_order(c.kind, c.P, s, c.M, c.V)) << at;
      // Exactly the transfers the virtual stages need: one recv per input, one send per output, to the
      // neighbouring rank of the neighbouring virtual stage.
      int want_sends = 0, want_recvs = 0;
      for (const auto& st : computes) {
        const int v = st.chunk * c.P + s;
        const bool has_next = v<PV - 1, has_prev = v> 0;
        want_sends += st.op == F ? has_next : has_prev;
        want_recvs += st.op == F ? has_prev : has_next;
      }
      EXPECT_EQ(static_cast<int>(sends_seen.size()), want_sends) << at;
      EXPECT_EQ(static_cast<int>(recvs_seen.size()), want_recvs) << at;
      for (const auto& t : sends_seen) {
        const int v = t.chunk * c.P + s;
        EXPECT_EQ(t.peer, ((t.activation ? v + 1 : v - 1) % c.P + c.P) % c.P) << at;
      }
    }
  }
}

// ---- the simulator -----------------------------------------------------------------------------------

TEST(PipelineSchedule, OneFOneBAndGPipeBubbleIsTheFormulaExactly) {
  // With fwd f = 1 and bwd b = 2 the last backward of stage 0 ends at (M + P - 1)(f + b): the first
  // micro-batch's forward reaches the last stage after (P - 1)f, every stage then computes M(f + b),
  // and the last backward comes back after (P - 1)b. busy = M(f + b), so idle = (P - 1)/(M + P - 1).
  for (K kind : {K::one_f_one_b, K::gpipe}) {
    for (int P : kStages) {
      for (int M : kMicro) {
        const std::string at = describe_schedule(kind, 1) + " P=" + std::to_string(P) + " M=" + std::to_string(M);
        const PipelineSimulation sim = simulate_pipeline(kind, P, M, 1, 1.0, 2.0);
        EXPECT_DOUBLE_EQ(sim.makespan, (M + P - 1) * 3.0) << at;
        const double bubble = static_cast<double>(P - 1) / (M + P - 1);
        EXPECT_DOUBLE_EQ(ideal_bubble_fraction(kind, P, M, 1), bubble) << at;
        ASSERT_EQ(sim.busy.size(), static_cast<std::size_t>(P)) << at;
        for (int s = 0; s < P; ++s) {
          EXPECT_DOUBLE_EQ(sim.busy[s], 3.0 * M) << at;
          EXPECT_NEAR(sim.idle_fraction[s], bubble, 1e-12) << at << " rank " << s;
          EXPECT_EQ(sim.peak_in_flight[s], kind == K::gpipe ? M : std::min(P - s, M)) << at << " rank " << s;
        }
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedBubbleIsTheFormulaOnTheTestedGrid) {
  // Derivation: the interleaved schedule is 1F1B over V·M virtual micro-batches of one chunk each, so with
  // per-chunk costs f, b its ideal makespan is (V·M + P - 1)(f + b) and its bubble (P - 1)/(V·M + P - 1).
  // The simulator, with Megatron's batches, reaches it exactly for P in {2, 4} (and every even P, and
  // every M > P); for odd P and M = P the rank s = (P - 1)/2 has a steady state of one pair, whose
  // forward waits in the pair's batch for the gradient of the pair's backward: one f + b more.
  for (int P : {2, 4}) {
    for (int V : {2, 3}) {
      for (int M : {P, 2 * P, 4 * P}) {
        const std::string at = "P=" + std::to_string(P) + " V=" + std::to_string(V) + " M=" + std::to_string(M);
        const PipelineSimulation sim = simulate_pipeline(K::interleaved, P, M, V, 1.0, 2.0);
        EXPECT_DOUBLE_EQ(sim.makespan, (V * M + P - 1) * 3.0) << at;
        const double bubble = static_cast<double>(P - 1) / (V * M + P - 1);
        EXPECT_DOUBLE_EQ(ideal_bubble_fraction(K::interleaved, P, M, V), bubble) << at;
        for (int s = 0; s < P; ++s) {
          EXPECT_NEAR(sim.idle_fraction[s], bubble, 1e-12) << at << " rank " << s;
          EXPECT_EQ(sim.peak_in_flight[s], std::min((P - s - 1) * 2 + (V - 1) * P + 1, M * V)) << at << " rank " << s;
        }
        // The engine's chunks are 1/V of a stage: at the same work, the bubble shrinks against 1F1B's.
        const PipelineSimulation chunked = simulate_pipeline(K::interleaved, P, M, V, 1.0 / V, 2.0 / V);
        const PipelineSimulation plain = simulate_pipeline(K::one_f_one_b, P, M, 1, 1.0, 2.0);
        EXPECT_NEAR(chunked.makespan, (V * M + P - 1) * 3.0 / V, 1e-9) << at;
        EXPECT_LT(chunked.makespan, plain.makespan) << at;
        EXPECT_NEAR(plain.makespan - chunked.makespan, (P - 1) * 3.0 * (1.0 - 1.0 / V), 1e-9) << at;
      }
    }
  }
  // The stated tolerance where it is not exact.
  for (int V : {2, 3}) {
    const PipelineSimulation sim = simulate_pipeline(K::interleaved, 3, 3, V, 1.0, 2.0);
    EXPECT_DOUBLE_EQ(sim.makespan, (V * 3 + 2) * 3.0 + 3.0) << "P=3 M=3 V=" << V;
  }
}

TEST(PipelineSchedule, SimulationIsDeadlockFreeOnAWideGrid) {
  for (int P = 1; P <= 9; ++P) {
    for (int M = 1; M <= 20; ++M) {
      for (K kind : {K::one_f_one_b, K::gpipe}) {
        const double span = simulate_pipeline(kind, P, M, 1, 1.0, 3.0).makespan;
        EXPECT_DOUBLE_EQ(span, (M + P - 1) * 4.0) << describe_schedule(kind, 1) << " P=" << P << " M=" << M;
      }
    }
  }
  for (int P = 2; P <= 8; ++P) {
    for (int V = 2; V <= 4; ++V) {
      for (int M = P; M <= 4 * P; M += P) {
        const double span = simulate_pipeline(K::interleaved, P, M, V, 1.0, 3.0).makespan;
        const double ideal = (V * M + P - 1) * 4.0;
        EXPECT_DOUBLE_EQ(span, P % 2 == 1 && M == P ? ideal + 4.0 : ideal) << "P=" << P << " V=" << V << " M=" << M;
      }
    }
  }
}

// Splits every batch into batches of one transfer, recvs first: blocking point-to-point where both
// neighbours receive first.
std::vector<std::vector<PipeAction>> recv_first_single_ops(const std::vector<std::vector<PipeAction>>& actions) {
  std::vector<std::vector<PipeAction>> out(actions.size());
  for (std::size_t r = 0; r < actions.size(); ++r) {
    for (const auto& a : actions[r]) {
      for (bool sends : {false, true}) {
        for (const auto& t : a.transfers) {
          if (t.is_send == sends) out[r].push_back({{t}, std::nullopt});
        }
      }
      if (a.compute) out[r].push_back({{}, a.compute});
    }
  }
  return out;
}

TEST(PipelineSchedule, RecvFirstSingleOpsDeadlock) {
  for (int P : {2, 4}) {
    const auto good = all_actions(K::one_f_one_b, P, 4, 1);
    EXPECT_NO_THROW(simulate_actions(good, 4, 1, 1.0, 2.0));
    const std::string what = error_of([&] { simulate_actions(recv_first_single_ops(good), 4, 1, 1.0, 2.0); });
    EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0 waits"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 waits"), std::string::npos) << what;
    EXPECT_NE(what.find("recv gradient"), std::string::npos) << what;
  }
}

TEST(PipelineSchedule, InterleavedWithoutPairsDeadlocks) {
  // One batch per compute (1F1B's rule) on the interleaved order: every rank's gradient send waits for
  // a recv its neighbour posts only after its own gradient send, round the ring. The pairs prevent it.
  const int P = 4, M = 8, V = 2;
  std::vector<std::vector<PipeAction>> unpaired(P);
  for (int s = 0; s < P; ++s) {
    std::optional<PipeTransfer> out;
    for (const PipeStep& st : pipeline_compute_order(K::interleaved, P, s, M, V)) {
      const int v = st.chunk * P + s;
      PipeAction a;
      if (out) a.transfers.push_back(*out);
      if (st.op == F && v > 0) a.transfers.push_back(recv_act((v - 1) % P, st.micro_batch, st.chunk));
      if (st.op == B && v < P * V - 1) a.transfers.push_back(recv_grad((v + 1) % P, st.micro_batch, st.chunk));
      a.compute = st;
      unpaired[s].push_back(a);
      out.reset();
      if (st.op == F && v < P * V - 1) out = send_act((v + 1) % P, st.micro_batch, st.chunk);
      if (st.op == B && v > 0) out = send_grad((v - 1) % P, st.micro_batch, st.chunk);
    }
    if (out) unpaired[s].push_back({{*out}, std::nullopt});
  }
  const std::string what = error_of([&] { simulate_actions(unpaired, M, V, 1.0, 2.0); });
  EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
  for (int s = 0; s < P; ++s) EXPECT_NE(what.find("rank " + std::to_string(s) + " waits"), std::string::npos) << what;
  EXPECT_NO_THROW(simulate_actions(all_actions(K::interleaved, P, M, V), M, V, 1.0, 2.0));
}

TEST(PipelineSchedule, SimulatorRefusesMismatchedTransfers) {
  // Stage 1 expects micro-batch 1's activation first where stage 0 sends micro-batch 0's (FIFO per pair).
  auto actions = all_actions(K::one_f_one_b, 2, 2, 1);
  ASSERT_EQ(actions[1][0].transfers, std::vector<PipeTransfer>{recv_act(0, 0, 0)});
  actions[1][0].transfers[0].micro_batch = 1;
  const std::string what = error_of([&] { simulate_actions(actions, 2, 1, 1.0, 2.0); });
  EXPECT_NE(what.find("mismatch"), std::string::npos) << what;
  EXPECT_NE(what.find("send #1 from rank 0 to rank 1"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 0 action 1: send activation of micro-batch 0"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 1 action 0: recv activation of micro-batch 1"), std::string::npos) << what;
  // The right micro-batch for the wrong virtual stage: rank 1's chunk 1 (virtual stage 3) takes what
  // rank 0's chunk 0 (virtual stage 0) sends to virtual stage 1.
  actions = all_actions(K::interleaved, 2, 2, 2);
  ASSERT_EQ(actions[1][0].transfers, std::vector<PipeTransfer>{recv_act(0, 0, 0)});
  actions[1][0].transfers[0].chunk = 1;
  const std::string stage = error_of([&] { simulate_actions(actions, 2, 2, 1.0, 2.0); });
  EXPECT_NE(stage.find("virtual stage 0) meets rank 1 action 0: recv activation of micro-batch 0 (chunk 1) from rank 0 (virtual stage 3)"),
            std::string::npos)
      << stage;
  // A gradient where an activation is expected.
  actions = all_actions(K::one_f_one_b, 2, 2, 1);
  actions[0][1].transfers[0].activation = false;
  EXPECT_THROW(simulate_actions(actions, 2, 1, 1.0, 2.0), Error);
}

TEST(PipelineSchedule, SimulatorChecksDependencies) {
  const std::vector<PipeAction> one = pipeline_actions(K::one_f_one_b, 1, 0, 1, 1);  // F0, B0
  ASSERT_EQ(one.size(), 2u);
  EXPECT_NE(error_of([&] { simulate_actions({{one[1], one[0]}}, 1, 1, 1.0, 2.0); }).find("before its forward"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_actions({{one[0], one[0], one[1]}}, 1, 1, 1.0, 2.0); }).find("runs twice"), std::string::npos);
  EXPECT_NE(error_of([&] { simulate_actions({{one[0]}}, 1, 1, 1.0, 2.0); }).find("never ran the backward"), std::string::npos);
  // Stage 1 computing without the activation it never received.
  auto two = all_actions(K::one_f_one_b, 2, 1, 1);
  two[1][0].transfers.clear();
  EXPECT_NE(error_of([&] { simulate_actions(two, 1, 1, 1.0, 2.0); }).find("without the activation"), std::string::npos);
  // A send of an output not computed yet.
  auto early = all_actions(K::one_f_one_b, 2, 1, 1);
  std::swap(early[0][0].transfers, early[0][1].transfers);
  EXPECT_NE(error_of([&] { simulate_actions(early, 1, 1, 1.0, 2.0); }).find("before its forward ran"), std::string::npos);
}

// ---- errors and names --------------------------------------------------------------------------------

TEST(PipelineSchedule, InterleavedNeedsMicroBatchesDivisibleByStages) {
  const std::string what = error_of([] { pipeline_compute_order(K::interleaved, 4, 0, 6, 2); });
  EXPECT_NE(what.find("micro-batches per step (6)"), std::string::npos) << what;
  EXPECT_NE(what.find("pipeline stages (4)"), std::string::npos) << what;
  EXPECT_THROW(pipeline_actions(K::interleaved, 4, 1, 6, 2), Error);
  EXPECT_THROW(simulate_pipeline(K::interleaved, 4, 6, 2, 1.0, 2.0), Error);
  EXPECT_THROW(ideal_bubble_fraction(K::interleaved, 4, 6, 2), Error);
}

TEST(PipelineSchedule, BadSizesAreErrors) {
  for (K kind : {K::one_f_one_b, K::gpipe, K::interleaved}) {
    const int V = kind == K::interleaved ? 2 : 1;
    EXPECT_NE(error_of([&] { pipeline_compute_order(kind, 0, 0, 4, V); }).find("0 pipeline stages"), std::string::npos);
    EXPECT_NE(error_of([&] { pipeline_compute_order(kind, 2, 0, 0, V); }).find("0 micro-batches"), std::string::npos);
    EXPECT_NE(error_of([&] { pipeline_compute_order(kind, 2, 2, 4, V); }).find("stage 2 is outside [0, 2)"), std::string::npos);
    EXPECT_NE(error_of([&] { pipeline_compute_order(kind, 2, -1, 4, V); }).find("stage -1"), std::string::npos);
    EXPECT_NE(error_of([&] { pipeline_compute_order(kind, 2, 0, 4, 0); }).find("0 model chunks"), std::string::npos);
    EXPECT_THROW(simulate_pipeline(kind, 0, 4, V, 1.0, 2.0), Error);
  }
  EXPECT_NE(error_of([] { pipeline_compute_order(K::one_f_one_b, 2, 0, 4, 2); }).find("need the interleaved schedule"), std::string::npos);
  EXPECT_NE(error_of([] { pipeline_compute_order(K::gpipe, 2, 0, 4, 3); }).find("3 model chunks"), std::string::npos);
  EXPECT_NE(error_of([] { pipeline_compute_order(K::interleaved, 2, 0, 4, 1); }).find("at least 2 model chunks"), std::string::npos);
  EXPECT_NE(error_of([] { pipeline_compute_order(K::interleaved, 1, 0, 4, 2); }).find("at least 2 pipeline stages"), std::string::npos);
  EXPECT_THROW(simulate_actions({}, 1, 1, 1.0, 2.0), Error);
}

TEST(PipelineSchedule, NamesAndParsing) {
  EXPECT_EQ(describe_schedule(K::one_f_one_b, 1), "1F1B");
  EXPECT_EQ(describe_schedule(K::interleaved, 2), "interleaved 1F1B (V=2)");
  EXPECT_EQ(describe_schedule(K::gpipe, 1), "GPipe");
  EXPECT_EQ(parse_schedule_kind("1f1b"), K::one_f_one_b);
  EXPECT_EQ(parse_schedule_kind("interleaved"), K::interleaved);
  EXPECT_EQ(parse_schedule_kind("gpipe"), K::gpipe);
  const std::string what = error_of([] { parse_schedule_kind("zb-h1"); });
  EXPECT_NE(what.find("'zb-h1'"), std::string::npos) << what;
  EXPECT_NE(what.find("1f1b, interleaved, gpipe"), std::string::npos) << what;
}

}  // namespace
}  // namespace dstrain
