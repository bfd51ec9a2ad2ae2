// The progress line and the run summary: formats and JSON fields against hand-written values.
#include <gtest/gtest.h>

#include "train/progress.h"
#include "train/train_summary.h"

namespace dstrain {
namespace {

TEST(Progress, Durations) {
  EXPECT_EQ(format_duration(0.44), "0.4s");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(65.2), "1m05s");
  EXPECT_EQ(format_duration(3600 * 2 + 180 + 10), "2h03m");
  EXPECT_EQ(format_duration(-1.0), "?");
}

TEST(Progress, Counts) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(999.4), "999");
  EXPECT_EQ(format_count(41210.7), "41,211");
  EXPECT_EQ(format_count(1234567), "1,234,567");
  EXPECT_EQ(format_count(-1234), "-1,234");
}

TEST(Progress, Line) {
  ProgressLine p{100, 400, 5.81234, 1e-3, 0.81234, 41210.7, 65.0, 195.0};
  EXPECT_EQ(format_progress(p), "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | 41,211 tokens/s | elapsed 1m05s | ETA 3m15s");
  p.show_throughput = false;  // timers.throughput.enabled: false
  EXPECT_EQ(format_progress(p), "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | elapsed 1m05s | ETA 3m15s");
  // Several ranks: the last step's slowest rank and its time.
  p.show_throughput = true;
  p.slowest_rank = 3;
  p.slowest_s = 2.414;
  EXPECT_EQ(format_progress(p),
            "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | 41,211 tokens/s | slowest rank 3: 2.41 s | elapsed 1m05s | ETA 3m15s");
  // A known peak: MFU after the throughput (dropped with it).
  p.slowest_rank = -1;
  p.mfu = 0.41256;
  EXPECT_EQ(format_progress(p), "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | 41,211 tokens/s | MFU 41.3% | elapsed 1m05s | ETA 3m15s");
  p.show_throughput = false;
  EXPECT_EQ(format_progress(p), "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | elapsed 1m05s | ETA 3m15s");
}

// A mixture of experts: the last micro-batch's aux loss, the tokens per (layer, expert) — fewest,
// most, max/mean — after the loss scaling fields, and the drops only when a capacity dropped any.
TEST(Progress, MixtureOfExpertsLine) {
  ProgressLine p{100, 400, 5.81234, 1e-3, 0.81234, 41210.7, 65.0, 195.0};
  p.moe = true;
  p.aux_loss = 2.090712;
  p.expert_min = 310;
  p.expert_max = 1702.4;
  p.expert_imbalance = 1.42491;
  EXPECT_EQ(format_progress(p),
            "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | aux 2.0907 | experts 310-1,702 (x1.42) | 41,211 tokens/s | elapsed 1m05s | "
            "ETA 3m15s");
  p.expert_dropped = 12345;
  p.loss_scale = 65536;
  p.skipped = 2;
  EXPECT_EQ(format_progress(p),
            "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | loss scale 65536 | skipped 2 | aux 2.0907 | experts 310-1,702 (x1.42) | "
            "dropped 12,345 | 41,211 tokens/s | elapsed 1m05s | ETA 3m15s");
  p.moe = false;  // a dense model: none of it
  EXPECT_EQ(format_progress(p),
            "step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | loss scale 65536 | skipped 2 | 41,211 tokens/s | elapsed 1m05s | ETA 3m15s");
}

// MFU = steady tokens/s x FLOPs per token / peak: 2048 tokens/s x 1e6 FLOP / 4e9 FLOP/s = 51.2%.
TEST(TrainSummary, MfuIsTheSteadyRateAgainstThePeak) {
  TrainSummary s;
  s.train_batch_size = 4;
  s.sequence_length = 256;
  s.step_seconds = {5.0, 0.5, 0.5};
  s.flops_per_token = 1e6;
  EXPECT_EQ(s.steady_mfu(), 0.0);  // no peak: no MFU
  EXPECT_FALSE(to_json(s).contains("mfu"));
  EXPECT_EQ(format_summary(s).find("MFU"), std::string::npos);
  s.peak_flops = 4e9;
  s.peak_source = "a 1024^3 bf16 GEMM";
  EXPECT_DOUBLE_EQ(s.steady_mfu(), 0.512);
  EXPECT_DOUBLE_EQ(to_json(s)["mfu"].get<double>(), 0.512);
  EXPECT_EQ(to_json(s)["peak_flops"], 4e9);
  EXPECT_NE(format_summary(s).find("MFU 51.2% at the steady 2,048 tokens/s: 1,000,000 FLOP per token (6N + 6LCT) against a peak of 4.0 GFLOP/s "
                                   "(a 1024^3 bf16 GEMM)"),
            std::string::npos)
      << format_summary(s);
}

TEST(TrainSummary, JsonFields) {
  TrainSummary s;
  s.steps = 2;
  s.tokens = 2048;
  s.train_seconds = 2.0;
  s.train_losses = {10.5, 9.5};
  s.memory[MemoryPurpose::params].peak = 400;
  s.memory.total.peak = 1000;
  nlohmann::json j = to_json(s);
  EXPECT_EQ(j["final_train_loss"], 9.5);
  EXPECT_TRUE(j["final_val_loss"].is_null());
  EXPECT_EQ(j["tokens_per_s"], 1024.0);
  EXPECT_EQ(j["peak_memory_bytes"]["params"], 400);
  EXPECT_EQ(j["peak_memory_bytes"]["total"], 1000);
  s.val_losses = {{2, 9.25}};
  EXPECT_EQ(to_json(s)["final_val_loss"], 9.25);
  EXPECT_EQ(to_json(s)["val_losses"], nlohmann::json::parse("[[2, 9.25]]"));
}

// The steady rate leaves the first (warm-up) step out and takes the median of the rest:
// 4 sequences of 256 tokens, steps of 5 s (the first), 0.5, 0.4, 0.6, 0.5 s -> 1024 / 0.5 s.
TEST(TrainSummary, SteadyTokensPerSecondIgnoresTheFirstStepAndOutliers) {
  TrainSummary s;
  s.train_batch_size = 4;
  s.sequence_length = 256;
  s.step_seconds = {5.0, 0.5, 0.4, 0.6, 0.5};
  EXPECT_DOUBLE_EQ(s.steady_tokens_per_s(), 2048.0);
  EXPECT_EQ(to_json(s)["step_seconds"].size(), 5u);
  s.step_seconds = {2.0};  // one step: it is all there is
  EXPECT_DOUBLE_EQ(s.steady_tokens_per_s(), 512.0);
  s.step_seconds.clear();
  EXPECT_EQ(s.steady_tokens_per_s(), 0.0);
}

}  // namespace
}  // namespace dstrain
