// Pipeline parallelism (docs/parallelism.md §7) against one rank: a model cut into stages (and
// virtual stages), run by the 1F1B, interleaved and GPipe schedules over local ranks, trains as one
// rank at stage 0 does on the same global batch (mesh_test_util.h's reference): the same losses and
// gradient norms, and parameters within the reduction-order tolerance. The reference knows nothing of
// stages, so each test fails if a stage drops a micro-batch's gradient, a shared parameter's copies
// drift apart, the norm or overflow decision is a stage's own, or the activations sent are not the
// ones the next stage needs.
#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "engine/pipeline_engine.h"
#include "mesh_test_util.h"

namespace dstrain {
namespace {

using namespace mesh_testing;

MeshRun pipeline(int pp, int dp, int gas) {
  MeshRun m;
  m.pp = pp;
  m.dp = dp;
  m.gas = gas;
  return m;
}

// GPT-2 (kModel: embedding, 2 blocks, head; the head's weight tied to the embedding's) on 2 stages:
// the embedding and a block on stage 0, a block and the head on stage 1, which holds a copy of the
// tied weight.
TEST(Pipeline, TwoStagesMatchOneRank) { check_against_one_rank(pipeline(2, 1, 4)); }

TEST(Pipeline, FourStagesMatchOneRank) { check_against_one_rank(pipeline(4, 1, 8)); }

// With dropout the stages must draw one rank's masks: each layer keys them by its index in the whole
// model and the micro-batch's global slot, whatever stage runs it and whenever the schedule does.
TEST(Pipeline, DropoutMasksAreOneRanks) {
  MeshRun m = pipeline(2, 2, 2);
  m.dropout = 0.1f;
  m.vstages = 2;
  m.schedule = PipelineScheduleKind::interleaved;
  check_against_one_rank(m);
}

// With data parallelism inside each stage, ZeRO 1 and 2 partition each stage's state over its data
// group (the shared weight's pieces differ between the stages' layouts).
TEST(Pipeline, WithDataParallelZero1MatchesOneRank) {
  MeshRun m = pipeline(2, 2, 2);
  m.stage = 1;
  check_against_one_rank(m);
}

TEST(Pipeline, WithDataParallelZero2MatchesOneRank) {
  MeshRun m = pipeline(2, 2, 4);
  m.stage = 2;
  check_against_one_rank(m);
}

// 3D: pipeline x data x tensor parallel on 8 ranks, in bf16.
TEST(Pipeline, ThreeDimensionsBf16MatchOneRank) {
  MeshRun m = pipeline(2, 2, 2);
  m.tp = 2;
  m.stage = 1;
  m.precision = Precision::bf16;
  check_against_one_rank(m);
}

// Megatron's interleaved 1F1B: 2 stages of 2 chunks each (virtual stages 0 and 2 on rank 0).
TEST(Pipeline, InterleavedMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 4);
  m.vstages = 2;
  m.schedule = PipelineScheduleKind::interleaved;
  check_against_one_rank(m);
}

// The schedules order the same arithmetic differently: bit-identical results.
TEST(Pipeline, SchedulesAgreeBitForBit) {
  MeshRun a = pipeline(2, 1, 4);
  MeshRun b = a;
  b.schedule = PipelineScheduleKind::gpipe;
  const RunResult ra = merge_pipeline_params(run_mesh(a));
  const RunResult rb = merge_pipeline_params(run_mesh(b));
  EXPECT_EQ(ra.r0().losses, rb.r0().losses);
  EXPECT_EQ(ra.r0().params, rb.r0().params);
  // The interleaved schedule (the model in 4 pieces over the 2 stages) accumulates each layer's
  // micro-batches in the same order: the same bits again.
  MeshRun c = a;
  c.vstages = 2;
  c.schedule = PipelineScheduleKind::interleaved;
  const RunResult rc = merge_pipeline_params(run_mesh(c));
  EXPECT_EQ(ra.r0().losses, rc.r0().losses);
  EXPECT_EQ(ra.r0().params, rc.r0().params);
}

// Sequence parallelism (Ulysses) inside each stage: PP 2 x SP 2.
TEST(Pipeline, WithSequenceParallelMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 2);
  m.sp = 2;
  m.stage = 1;
  check_against_one_rank(m);
}

TEST(Pipeline, LlamaMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 2);
  m.model = kLlamaModel;
  check_against_one_rank(m);
}

// The per-tensor optimizers (Lamb's trust ratio, Muon's orthogonalisation, Adafactor's factored
// moments) read each tensor whole within its stage; the tied copy on the last stage takes the same
// step as its owner (the merge checks them equal).
TEST(Pipeline, PerTensorOptimizersMatchOneRank) {
  const char* blocks[] = {R"({"type": "Lamb", "params": {"lr": 0.02, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.05}})",
                          R"({"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3, "eps": 1e-8, "weight_decay": 0.1}})",
                          R"({"type": "Adafactor", "params": {"lr": 0.05, "weight_decay": 0.1}})"};
  for (const char* block : blocks) {
    SCOPED_TRACE(block);
    MeshRun m = pipeline(2, 2, 2);
    m.stage = 1;
    m.optimizer_json = block;
    check_against_one_rank(m);
  }
}

// The 1-bit family under a pipeline: each stage's compressed exchange runs over its data group (as
// DeepSpeed's NcclBackend(mpu) runs it), and in the compressed phase the tied weight's copies add
// their ranks' local gradients pairwise first, so both take the same step. Through the warm-up,
// freeze and compressed steps, PP 2 x DP 2 follows DP 2 alone on the same global batch: the two
// differ in the compression's scales (each stage's buckets against the whole model's). Bound 2e-3
// relative, as test_tensor_parallel_optimizers.cpp's under TP. 0/1 Adam's local steps leave the data
// replicas apart between its syncs (by design), so there the copies are compared pair by pair.
TEST(Pipeline, OneBitOptimizersFollowTheDataParallelRun) {
  for (const char* type : {"OneBitAdam", "ZeroOneAdam"}) {
    SCOPED_TRACE(type);
    const bool zero_one = std::string_view(type) == "ZeroOneAdam";
    MeshRun m = pipeline(2, 2, 2);
    m.optimizer_json = zero_one ? R"({"type": "ZeroOneAdam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "var_freeze_step": 4, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 2}})"
                                : R"({"type": "OneBitAdam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "freeze_step": 4}})";
    m.steps = 8;
    const RunResult raw = run_mesh(m);
    // The tied weight on stage 0 (world ranks 0, 1) and its copy on stage 1 (ranks 2, 3), data rank by data rank.
    for (int d = 0; d < 2; ++d) EXPECT_EQ(raw.ranks[static_cast<std::size_t>(d)].params.at("wte.weight"), raw.ranks[static_cast<std::size_t>(2 + d)].params.at("wte.weight")) << "data rank " << d;
    const RunResult run = zero_one ? raw : merge_pipeline_params(raw);
    MeshRun dp_only = m;
    dp_only.pp = 1;
    const RunResult ref = run_mesh(dp_only);
    ASSERT_EQ(run.r0().losses.size(), ref.r0().losses.size());
    for (std::size_t k = 0; k < ref.r0().losses.size(); ++k) {
      const double a = run.r0().losses[k], b = ref.r0().losses[k];
      EXPECT_TRUE(std::isfinite(a));
      EXPECT_LE(std::abs(a - b), 2e-3 * std::abs(b)) << "step " << k + 1 << ": PP 2 " << a << ", DP only " << b;
    }
  }
}

// 1-bit LAMB compresses a stage's whole momentum with one scale: with GPT-2's tied weight on two
// stages it is refused before step 1, naming the weight and the fix.
TEST(Pipeline, OneBitLambWithATiedWeightAcrossStagesIsRefused) {
  MeshRun m = pipeline(2, 1, 2);
  m.optimizer_json = R"({"type": "OneBitLamb", "params": {"lr": 1e-3, "freeze_step": 4}})";
  try {
    (void)run_mesh(m);
    FAIL() << "trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share 'wte.weight'"), std::string::npos) << e.what();
  }
}

// ZeRO-2 with the optimizer partition in host memory (offload_optimizer.device cpu): each stage's.
TEST(Pipeline, CpuOffloadMatchesOneRank) {
  MeshRun m = pipeline(2, 2, 2);
  m.stage = 2;
  m.zero_extra_json = R"("offload_optimizer": {"device": "cpu"})";
  check_against_one_rank(m);
}

// fp16 with an overflow injected on the last stage only: every stage skips the step (the same
// parameters as a run of the remaining steps, the loss scale halved everywhere).
TEST(Pipeline, OverflowOnOneStageSkipsTheStepOnAll) {
  MeshRun m = pipeline(2, 1, 2);
  m.precision = Precision::fp16;
  m.inject_overflow = {2};
  const RunResult run = run_mesh(m);
  for (const RankResult& r : run.ranks) EXPECT_EQ(r.skipped_steps, 1);
  MeshRun clean = m;
  clean.inject_overflow = {};
  const RunResult ref = run_mesh(clean);
  for (const RankResult& r : ref.ranks) EXPECT_EQ(r.skipped_steps, 0);
  // The skipped step changed nothing: its neighbours' losses agree with a clean run's first one.
  EXPECT_EQ(run.r0().losses[0], ref.r0().losses[0]);
  EXPECT_NE(run.r0().params, ref.r0().params);
}

// pipeline.activation_checkpoint_interval 2 on 4 blocks: each stage (embedding, h.0, h.1 | h.2, h.3,
// head) recomputes its two blocks as one segment from the segment's kept input, the micro-batches in
// flight sharing the segment's inner activations.
TEST(Pipeline, ActivationCheckpointingMatchesOneRank) {
  MeshRun m = pipeline(2, 1, 4);
  m.model = "gpt2:L4-C32-H2-V96-T16";
  m.pp_ckpt_interval = 2;
  check_against_one_rank(m);
}

// The order each stage ran, from PipelineEngine's trace, against the 1F1B definition written out
// here (DeepSpeed's TrainSchedule, Megatron's non-interleaved schedule): stage s runs
// W = min(P - 1 - s, M) forwards, then alternates a forward and a backward, then the W remaining
// backwards; every forward but stage 0's is preceded by the recv of its activation and followed by
// the send of its output (but the last stage's), every backward likewise with gradients. The
// micro-batches in flight on stage s never exceed P - s.
TEST(Pipeline, FourStagesRunTheOneFOneBOrder) {
  const int P = 4, M = 6;
  const RunResult run = run_mesh(pipeline(P, 1, M));
  ASSERT_EQ(run.ranks.size(), 4u);
  for (int s = 0; s < P; ++s) {
    const std::vector<PipelineEvent>& trace = g_pipeline_traces[static_cast<std::size_t>(s)];
    std::vector<std::pair<char, int>> want, got;
    const int W = std::min(P - 1 - s, M);
    for (int m = 0; m < W; ++m) want.emplace_back('F', m);
    for (int m = 0; m < M - W; ++m) {
      want.emplace_back('F', W + m);
      want.emplace_back('B', m);
    }
    for (int m = M - W; m < M; ++m) want.emplace_back('B', m);
    int in_flight = 0, peak = 0;
    for (std::size_t k = 0; k < trace.size(); ++k) {
      const PipelineEvent& e = trace[k];
      if (e.kind == PipelineEvent::Kind::forward || e.kind == PipelineEvent::Kind::backward) {
        const bool fwd = e.kind == PipelineEvent::Kind::forward;
        got.emplace_back(fwd ? 'F' : 'B', e.micro_batch);
        in_flight += fwd ? 1 : -1;
        peak = std::max(peak, in_flight);
        // Its input arrived before it ran (a recv of the same micro-batch, earlier in the trace).
        const bool needs_input = fwd ? s > 0 : s < P - 1;
        if (needs_input) {
          const auto recv = std::find_if(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(k), [&](const PipelineEvent& x) {
            return x.kind == PipelineEvent::Kind::recv && x.activation == fwd && x.micro_batch == e.micro_batch && x.peer == (fwd ? s - 1 : s + 1);
          });
          EXPECT_NE(recv, trace.begin() + static_cast<std::ptrdiff_t>(k)) << "stage " << s << ": " << (fwd ? 'F' : 'B') << e.micro_batch << " ran before its input came";
        }
        // Its output leaves afterwards (to the next stage after a forward, the previous after a backward).
        const bool sends = fwd ? s < P - 1 : s > 0;
        const auto send = std::find_if(trace.begin() + static_cast<std::ptrdiff_t>(k), trace.end(), [&](const PipelineEvent& x) {
          return x.kind == PipelineEvent::Kind::send && x.activation == fwd && x.micro_batch == e.micro_batch && x.peer == (fwd ? s + 1 : s - 1);
        });
        EXPECT_EQ(send != trace.end(), sends) << "stage " << s << ": " << (fwd ? 'F' : 'B') << e.micro_batch;
      }
    }
    EXPECT_EQ(got, want) << "stage " << s;
    EXPECT_EQ(peak, std::min(P - s, M)) << "stage " << s << ": micro-batches in flight";
  }
}

// Transfers overlap compute: the engine starts each action's transfers (start_send_recv) and waits
// only for those its compute reads or overwrites, so in the steady state a compute runs while a
// transfer of its stage is still pending — the send of the previous output, or the next input's
// recv posted a compute ahead. With blocking batches every compute found none pending. Counted by
// the schedule, not timed: the same on every run.
TEST(Pipeline, ComputesRunWhileTheirStagesTransfersArePending) {
  const int P = 2, M = 4;
  const RunResult run = run_mesh(pipeline(P, 1, M));
  ASSERT_EQ(run.ranks.size(), 2u);
  for (int s = 0; s < P; ++s) {
    int overlapped = 0;
    for (const PipelineEvent& e : g_pipeline_traces[static_cast<std::size_t>(s)])
      if ((e.kind == PipelineEvent::Kind::forward || e.kind == PipelineEvent::Kind::backward) && e.pending_transfers > 0) ++overlapped;
    EXPECT_GT(overlapped, 0) << "stage " << s << ": no compute ran while a transfer was pending";
  }
}

// The 1F1B memory bound, measured: a stage allocates one activation set per micro-batch in flight,
// so its activation bytes are a + b·k with k = min(P - s, M) under 1F1B and k = M under GPipe. Two
// 1F1B runs of stage 0 (M = 2: k = 2; M = 8: k = P = 4) give a and b; GPipe's M = 8 must then be
// a + 8b, twice 1F1B's sets.
TEST(Pipeline, ActivationMemoryFollowsTheMicroBatchesInFlight) {
  const auto activations = [](PipelineScheduleKind kind, int gas) {
    MeshRun m = pipeline(4, 1, gas);
    m.schedule = kind;
    m.steps = 1;
    const RunResult run = run_mesh(m);
    return static_cast<double>(run.r0().memory[MemoryPurpose::activations].peak);
  };
  const double two = activations(PipelineScheduleKind::one_f_one_b, 2);
  const double four = activations(PipelineScheduleKind::one_f_one_b, 8);
  const double gpipe = activations(PipelineScheduleKind::gpipe, 8);
  const double b = (four - two) / 2.0, a = two - 2.0 * b;
  ASSERT_GT(b, 0.0);
  EXPECT_DOUBLE_EQ(gpipe, a + 8.0 * b) << "1F1B k=2: " << two << ", k=4: " << four << ", GPipe k=8: " << gpipe;
}

}  // namespace
}  // namespace dstrain
