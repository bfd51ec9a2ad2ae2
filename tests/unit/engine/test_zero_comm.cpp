// Communication per optimizer step (report().zero.step_comm) against the ZeRO paper's volumes,
// computed here from the model's ParamSpecs and the layout rules. Bytes follow the ring convention
// of zero/communicator.h: reduce-scatter and all-gather send (W−1)/W of the full buffer, all-reduce
// 2(W−1)/W. With Ψ = padded parameter elements (per layer padded for the stage's W) times the
// storage dtype's bytes s, per optimizer step:
//   stage 0     all-reduce of the gradients 2Ψ·(W−1)/W
//   stages 1-2  reduce-scatter Ψ + all-gather Ψ, each ·(W−1)/W: 2Ψ, not DeepSpeed's 3Ψ (which
//               all-reduces the gradients, docs/zero.md §6); stage 2 reduces every
//               micro-step, so GAS·Ψ reduce-scatter
//   stage 3     all-gather before each forward and backward call, minus what stays gathered
//               between the forward and backward of the last layers, + reduce-scatter Ψ ≈ 3Ψ
// plus ONE small all-reduce per step of (norm², overflow count, loss): 3 fp64 values.
// Also: an fp16 overflow on one rank makes every rank skip the same step.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "zero_test_util.h"
#include "models/gpt2/gpt2_family.h"

namespace dstrain {
namespace {

using namespace zero_testing;

std::uint64_t ring(std::uint64_t bytes, int w) { return bytes * static_cast<std::uint64_t>(w - 1) / static_cast<std::uint64_t>(w); }
// The step's (norm², overflow, loss) all-reduce: 3 fp64 values (docs/training_state.md §4).
std::uint64_t small_all_reduce(int w) { return 2 * static_cast<std::uint64_t>(w - 1) * 24 / static_cast<std::uint64_t>(w); }

std::uint64_t bytes(const CommStats& c, CollectiveKind k) { return c.bytes_sent(k); }
std::uint64_t calls(const CommStats& c, CollectiveKind k) { return c.call_count(k); }

// Σ over layers of the padded elements for `pw` ranks.
std::int64_t psi(int pw, std::size_t s) {
  std::int64_t n = 0;
  for (const auto& l : model_specs()) n += padded_numel(l, pw, s);
  return n;
}

// Stage 3's gathered elements per micro-step (zero_test_util.h stage3_gathers).
std::int64_t stage3_gathered_elements(int w, std::size_t s, std::int64_t persistence_threshold = 0) {
  std::int64_t total = 0;
  for (const Stage3Gather& g : stage3_gathers(w, s, persistence_threshold)) total += g.elements;
  return total;
}

// Collective calls of one pass over every layer when each layer's buffer is cut into chunks of at
// most max_chunk elements rounded up to W·ealign (zero/flat_layout.h): one call per chunk.
std::uint64_t chunk_calls(int w, std::size_t s, std::int64_t max_chunk) {
  const std::int64_t unit = w * (64 / static_cast<std::int64_t>(s));
  std::uint64_t n = 0;
  for (const auto& l : model_specs()) {
    const std::int64_t numel = padded_numel(l, w, s);
    if (numel == 0) continue;
    const std::int64_t chunk = std::min(std::max(numel, unit), round_up(max_chunk, unit));
    n += static_cast<std::uint64_t>((numel + chunk - 1) / chunk);
  }
  return n;
}

using Combo = std::tuple<int, int, Precision>;  // stage, world, precision

class ZeroComm : public ::testing::TestWithParam<Combo> {};

TEST_P(ZeroComm, StepVolumeMatchesThePaper) {
  const auto [stage, w, prec] = GetParam();
  const std::size_t s = storage_bytes(prec);
  RunSpec spec;
  spec.stage = stage;
  spec.world = w;
  spec.gas = 1;
  spec.precision = prec;
  spec.steps = 2;
  spec.knobs.reduce_bucket_size = 3000;  // chunked collectives: the volume does not depend on it
  spec.knobs.allgather_bucket_size = 3000;
  spec.knobs.persistence_threshold = 0;    // stage 3: every layer gathered per call
  spec.knobs.max_reuse_distance = 0;       // released after each call unless the next needs it
  spec.knobs.prefetch_bucket_size = 5000;  // prefetch changes when, not how much
  spec.knobs.overlap_comm = w == 4;
  const RunResult run = run_zero(spec);
  const int pw = stage >= 1 ? w : 1;
  const std::uint64_t P = static_cast<std::uint64_t>(psi(pw, s)) * s;  // Ψ in bytes

  std::uint64_t want_ar = small_all_reduce(w), want_rs = 0, want_ag = 0;
  if (stage == 0) want_ar += 2 * ring(P, w);  // every bucket's bytes divide by W here
  if (stage == 1 || stage == 2) {
    want_rs = ring(P, w);
    want_ag = ring(P, w);
  }
  if (stage == 3) {
    want_rs = ring(P, w);
    want_ag = ring(static_cast<std::uint64_t>(stage3_gathered_elements(w, s)) * s, w);
  }
  for (const RankResult& r : run.ranks) {
    const CommStats& c = r.report.step_comm;
    SCOPED_TRACE(testing::Message() << "rank " << r.report.rank);
    EXPECT_EQ(bytes(c, CollectiveKind::all_reduce), want_ar);
    EXPECT_EQ(bytes(c, CollectiveKind::reduce_scatter), want_rs);
    EXPECT_EQ(bytes(c, CollectiveKind::all_gather), want_ag);
    EXPECT_EQ(bytes(c, CollectiveKind::broadcast), 0u);
    if (stage >= 1) {
      EXPECT_EQ(calls(c, CollectiveKind::all_reduce), 1u);  // only the (norm², overflow, loss) one
      // Chunked: a 12704-element block is cut into 5 pieces of <= 3000 (rounded up to W·ealign).
      const std::uint64_t chunks = chunk_calls(w, s, 3000);
      EXPECT_GT(chunks, 8u);
      EXPECT_EQ(calls(c, CollectiveKind::reduce_scatter), chunks);
      if (stage <= 2) {
        EXPECT_EQ(calls(c, CollectiveKind::all_gather), chunks);
      }
    }
    const double total_in_psi = static_cast<double>(c.total_bytes_sent() - small_all_reduce(w)) / static_cast<double>(ring(P, w));
    if (stage <= 2) {
      EXPECT_NEAR(total_in_psi, 2.0, 1e-9);
    }
    if (stage == 3) {
      // 2Ψ of gathers + Ψ of reduce-scatter, less the last layer kept between its forward and
      // backward, plus the embedding's third gather for the tied head: within [2.5Ψ, 3.5Ψ].
      EXPECT_GT(total_in_psi, 2.5);
      EXPECT_LT(total_in_psi, 3.5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PerStep, ZeroComm,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(2, 4),
                                            ::testing::Values(Precision::fp32, Precision::bf16)),
                         [](const auto& pinfo) {
                           return fmt::format("Stage{}_W{}_{}", std::get<0>(pinfo.param), std::get<1>(pinfo.param),
                                              precision_name(std::get<2>(pinfo.param)));
                         });

// Gradient accumulation: stages 0 and 1 reduce once per step, stages 2 and 3 every micro-step (they
// keep only their partition of the gradients), stage 3 gathers every micro-step too.
TEST(ZeroCommGas, ReductionsPerMicroStep) {
  constexpr int w = 4, gas = 3;
  const std::uint64_t P = static_cast<std::uint64_t>(psi(w, 4)) * 4;
  {
    RunSpec spec;
    spec.stage = 0;
    spec.world = w;
    spec.gas = gas;
    spec.steps = 2;
    const CommStats c = run_zero(spec).r0().report.step_comm;
    EXPECT_EQ(bytes(c, CollectiveKind::all_reduce), 2 * ring(static_cast<std::uint64_t>(psi(1, 4)) * 4, w) + small_all_reduce(w));
    EXPECT_EQ(bytes(c, CollectiveKind::reduce_scatter) + bytes(c, CollectiveKind::all_gather), 0u);
  }
  for (const int stage : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    RunSpec spec;
    spec.stage = stage;
    spec.world = w;
    spec.gas = gas;
    spec.steps = 2;
    spec.knobs.persistence_threshold = 0;
    spec.knobs.max_reuse_distance = 0;
    const CommStats c = run_zero(spec).r0().report.step_comm;
    EXPECT_EQ(bytes(c, CollectiveKind::reduce_scatter), ring(P, w) * (stage == 1 ? 1 : gas));
    const std::uint64_t ag = stage == 3 ? ring(static_cast<std::uint64_t>(stage3_gathered_elements(w, 4)) * 4, w) * gas : ring(P, w);
    EXPECT_EQ(bytes(c, CollectiveKind::all_gather), ag);
    EXPECT_EQ(bytes(c, CollectiveKind::all_reduce), small_all_reduce(w));
  }
}

// Stage 3 with a reuse distance that keeps everything (and no live cap): each layer is gathered
// once per micro-step — Ψ of all-gather instead of ~2Ψ.
TEST(ZeroCommStage3, ReuseDistanceKeepsParamsForBackward) {
  constexpr int w = 4;
  const std::uint64_t P = static_cast<std::uint64_t>(psi(w, 4)) * 4;
  RunSpec spec;
  spec.stage = 3;
  spec.world = w;
  spec.steps = 2;
  spec.knobs.persistence_threshold = 0;
  spec.knobs.max_reuse_distance = 1'000'000'000;
  const CommStats c = run_zero(spec).r0().report.step_comm;
  EXPECT_EQ(bytes(c, CollectiveKind::all_gather), ring(P, w));
  EXPECT_EQ(bytes(c, CollectiveKind::reduce_scatter), ring(P, w));
}

// Stage 3 with persistent layers: they are kept whole, all-gathered once after the update (as
// stages 1-2 do) instead of before every call; the blocks are gathered per call. (The last block
// then stays gathered from its forward to its backward: the final layer between them needs only
// persistent parameters, so the reuse distance is 0.)
TEST(ZeroCommStage3, PersistentLayersGatherAfterTheStep) {
  constexpr int w = 4;
  const auto specs = model_specs();
  constexpr std::int64_t threshold = 5000;  // the embedding (4608) and the final norm (64) persist
  std::int64_t persistent = 0;
  for (const auto& l : specs)
    if (owned_params(l) < threshold) persistent += padded_numel(l, w, 4);
  ASSERT_GT(persistent, 0);
  const std::int64_t gathered = stage3_gathered_elements(w, 4, threshold);
  ASSERT_GT(gathered, 0);
  RunSpec spec;
  spec.stage = 3;
  spec.world = w;
  spec.steps = 2;
  spec.knobs.persistence_threshold = threshold;
  spec.knobs.max_reuse_distance = 0;
  const CommStats c = run_zero(spec).r0().report.step_comm;
  EXPECT_EQ(bytes(c, CollectiveKind::all_gather), ring(static_cast<std::uint64_t>(persistent + gathered) * 4, w));
  EXPECT_EQ(bytes(c, CollectiveKind::reduce_scatter), ring(static_cast<std::uint64_t>(psi(w, 4)) * 4, w));
}

// fp16: an inf gradient on one rank makes EVERY rank skip that step (the overflow count is in the
// step's one all-reduce), update the loss scale the same way, and end with the same parameters as
// one rank of the same stage that overflowed at the same step. (Same stage: the loss-scale rules
// differ by design between stage 0 — FP16_Optimizer, no hysteresis — and ZeRO 1-3 —
// DynamicLossScaler, hysteresis 2; docs/precision.md §4.)
TEST(ZeroCommOverflow, EveryRankSkipsTheSameStep) {
  constexpr int w = 2;
  RunSpec at_init;
  at_init.precision = Precision::fp16;
  at_init.steps = 0;
  const RunResult init = run_zero(at_init);
  for (const int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "stage " << stage);
    RunSpec ref;
    ref.stage = stage;
    ref.world = 1;
    ref.gas = 2 * w;
    ref.precision = Precision::fp16;
    ref.steps = 4;
    ref.knobs.persistence_threshold = 0;
    ref.inject_overflow = {{2}};
    const RunResult one = run_zero(ref);
    ASSERT_EQ(one.r0().skipped_steps, 1);
    RunSpec s = ref;
    s.world = w;
    s.gas = 2;
    // Stages 1-3: the inf lands in rank 1's own gradient partition only. Stage 0: every rank holds
    // the same all-reduced gradients (a real overflow reaches all of them through the all-reduce)
    // and rank 0 alone checks them, so the injection goes to every rank.
    s.inject_overflow = stage == 0 ? std::vector<std::vector<std::int64_t>>{{2}, {2}} : std::vector<std::vector<std::int64_t>>{{}, {2}};
    const RunResult run = run_zero(s);
    for (const RankResult& r : run.ranks) {
      EXPECT_EQ(r.skipped_steps, 1) << "rank " << r.report.rank;
      EXPECT_EQ(r.loss_scales, one.r0().loss_scales) << "rank " << r.report.rank;
      EXPECT_EQ(r.grad_norms[1], -1.0) << "rank " << r.report.rank;
      EXPECT_EQ(r.params, run.r0().params) << "rank " << r.report.rank;
    }
    // The same trajectory as one rank that skipped the same step: fp16 tolerances of the
    // equivalence matrix (zero_test_util.h).
    const Tolerance tol = tolerance(Precision::fp16);
    const ParamDiff d = compare_params(run.r0().params, one.r0().params, init.r0().params, tol.atol, tol.rtol);
    EXPECT_TRUE(d.finite);
    EXPECT_LE(d.max_excess, 1.0) << d.worst_element;
    EXPECT_LE(d.update_rel, tol.update_rel);
    EXPECT_LE(d.key_bias_max_abs, tol.key_bias_abs);
    for (std::size_t k = 0; k < one.r0().losses.size(); ++k) {
      EXPECT_NEAR(run.r0().losses[k], one.r0().losses[k], tol.loss_rtol * std::abs(one.r0().losses[k])) << "step " << k + 1;
    }
  }
}

// Forwards every collective to the rank's local communicator and records when synchronize() was
// called: the sequence number of the last collective it covered.
class SyncRecorder final : public Communicator {
 public:
  explicit SyncRecorder(Communicator& inner) : Communicator(inner.rank(), inner.world_size()), inner_(inner) {}
  std::string_view backend() const override { return inner_.backend(); }
  void synchronize() override {
    inner_.synchronize();
    ++syncs;
    synced_through = inner_.sequence();
  }
  void order_compute_after_collectives() override { inner_.order_compute_after_collectives(); }
  std::uint64_t issued() const { return inner_.sequence(); }
  int syncs = 0;
  std::uint64_t synced_through = 0;

 protected:
  void do_all_reduce(const Tensor& buf, ReduceOp op) override { inner_.all_reduce(buf, op); }
  void do_reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) override { inner_.reduce_scatter(send, recv, op); }
  void do_all_gather(const Tensor& send, const Tensor& recv) override { inner_.all_gather(send, recv); }
  void do_broadcast(const Tensor& buf, int root) override { inner_.broadcast(buf, root); }
  void do_barrier() override { inner_.barrier(); }
  void do_all_to_all(const Tensor& send, const Tensor& recv) override { inner_.all_to_all(send, recv); }
  void do_all_to_all_v(const Tensor& send, std::span<const std::int64_t> send_counts, const Tensor& recv,
                       std::span<const std::int64_t> recv_counts) override {
    inner_.all_to_all_v(send, send_counts, recv, recv_counts);
  }
  void do_send(const Tensor& buf, int peer) override { inner_.send(buf, peer); }
  void do_recv(const Tensor& buf, int peer) override { inner_.recv(buf, peer); }
  void do_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> /*calls*/) override { inner_.send_recv(ops); }
  // The sub-group's own communicator, unrecorded: these tests record the world group only.
  std::unique_ptr<Communicator> do_split(int color, int key) override { return inner_.split(color, key); }

 private:
  Communicator& inner_;
};

// On a GPU the collectives run on NCCL's stream and only NcclCommunicator::synchronize() bounds a
// wait for them by the timeout: the host's next blocking read (the loss, the grad norm, a batch
// upload) would otherwise hang on a dead peer. So every backward, optimizer step and host-value
// all-reduce ends with every collective it issued synchronized.
TEST(ZeroEngineComm, EveryPassEndsSynchronized) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec s;
    s.stage = stage;
    s.world = 2;
    s.gas = 2;
    const std::string json = zero_config_json(s);
    run_local_ranks(s.world, [&](Communicator& local) {
      SyncRecorder comm(local);
      config::ConfigOptions copts;
      copts.world_size = s.world;
      const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
      EngineOptions o;
      o.seed = 11;
      o.comm = &comm;
      o.sequence_length = kT;
      Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
      for (int step = 0; step < 2; ++step) {
        for (int m = 0; m < s.gas; ++m) {
          Tokens t = slot_batch(step, m * s.world + comm.rank());
          e.forward(t.batch());
          e.backward();
          EXPECT_EQ(comm.synced_through, comm.issued()) << "stage " << stage << " after backward, step " << step << " micro " << m;
          e.step();
          EXPECT_EQ(comm.synced_through, comm.issued()) << "stage " << stage << " after step(), step " << step << " micro " << m;
        }
      }
      EXPECT_GT(comm.syncs, 0) << "stage " << stage;
    });
  }
}

// comms_logger at every stage (stage 3 and 2 with overlap_comm: the collectives run on the queue's
// worker thread): the logger sees every collective the communicator counts, op by op, and its
// message sizes (the input tensor's bytes) add up to the communicator's own ring-byte counters —
// at W = 2 all_reduce sends N, reduce_scatter N/2 of its N-byte input, all_gather its n-byte shard.
TEST(ZeroEngineComm, CommsLoggerSeesEveryCollective) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunSpec s;
    s.stage = stage;
    s.world = 2;
    s.gas = 2;
    s.knobs.overlap_comm = stage >= 2;
    s.knobs.extra_json = R"("comms_logger": {"enabled": true})";
    const std::string json = zero_config_json(s);
    run_local_ranks(s.world, [&](Communicator& local) {
      config::ConfigOptions copts;
      copts.world_size = s.world;
      const config::DsConfig c = config::parse_ds_config(config::Json::parse(json), copts);
      EngineOptions o;
      o.seed = 11;
      o.comm = &local;
      o.sequence_length = kT;
      Engine e = initialize(make_gpt2_model(model_config(0.0f)), c, o);
      for (int step = 0; step < 2; ++step) {
        for (int m = 0; m < s.gas; ++m) {
          Tokens t = slot_batch(step, m * s.world + local.rank());
          e.forward(t.batch());
          e.backward();
          e.step();
        }
      }
      const CommsLog* log = e.report().comms;
      ASSERT_NE(log, nullptr);
      std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_op;  // calls, Σ message bytes
      for (const CommsLogRow& r : log->rows()) {
        by_op[r.op].first += r.count;
        by_op[r.op].second += r.count * r.msg_bytes;
      }
      const CommStats& st = local.stats();
      const auto got = [&](const char* op) { return by_op.count(op) ? by_op[op] : std::pair<std::uint64_t, std::uint64_t>{0, 0}; };
      EXPECT_EQ(got("all_reduce").first, calls(st, CollectiveKind::all_reduce)) << "stage " << stage;
      EXPECT_EQ(got("reduce_scatter_tensor").first, calls(st, CollectiveKind::reduce_scatter)) << "stage " << stage;
      EXPECT_EQ(got("all_gather_into_tensor").first, calls(st, CollectiveKind::all_gather)) << "stage " << stage;
      EXPECT_EQ(got("all_reduce").second, bytes(st, CollectiveKind::all_reduce)) << "stage " << stage;
      EXPECT_EQ(got("reduce_scatter_tensor").second, 2 * bytes(st, CollectiveKind::reduce_scatter)) << "stage " << stage;
      EXPECT_EQ(got("all_gather_into_tensor").second, bytes(st, CollectiveKind::all_gather)) << "stage " << stage;
      EXPECT_EQ(log->total_calls(), st.total_calls()) << "stage " << stage;
      EXPECT_GT(st.total_calls(), 0u);
      if (stage >= 1) {
        EXPECT_GT(calls(st, CollectiveKind::all_gather), 0u) << "stage " << stage;
      }
    });
  }
}

}  // namespace
}  // namespace dstrain
