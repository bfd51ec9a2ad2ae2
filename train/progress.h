// The progress line of a training run, printed every steps_per_print optimizer steps:
//   step 100/400 | loss 5.8123 | lr 1.00e-03 | grad norm 0.8123 | 41,210 tokens/s | elapsed 1m05s | ETA 3m15s
// with fp16 "| loss scale 65536" after the grad norm, and "| skipped 2" once a step was skipped; a
// mixture of experts adds "| aux 1.0234 | experts 310-702 (x1.42)" (tokens per expert, min-max,
// and max/mean) and "| dropped 12" under a capacity factor; several ranks add "| slowest rank 3: 2.41 s"
// (the last step's slowest rank and its time) after the throughput; "| MFU 41.3%" follows the
// throughput when the run knows its peak (TrainingPlan::mfu_peak_flops: docs/monitoring.md §1).
// DeepSpeed's own line is "step=N, skipped=S, lr=[...], mom=[...]" (docs/monitoring.md §1); this one adds
// what a user watches a run for (loss, norm, speed, time left).
#pragma once

#include <cstdint>
#include <string>

namespace dstrain {

struct ProgressLine {
  std::int64_t step = 0;         // optimizer steps done
  std::int64_t total_steps = 0;  // of the run
  double loss = 0.0;             // mean micro-batch loss of the last step
  double lr = 0.0;
  double grad_norm = 0.0;       // before clipping
  double tokens_per_s = 0.0;    // over the steps since the previous line
  double elapsed_s = 0.0;       // since training started (evaluation included)
  double eta_s = 0.0;           // remaining steps at the average step time so far
  double loss_scale = 0.0;      // fp16's loss scale, shown when > 0
  std::int64_t skipped = 0;     // optimizer steps skipped for overflow so far, shown when > 0
  bool show_throughput = true;  // timers.throughput.enabled: false drops "N tokens/s", as DeepSpeed's ThroughputTimer stops
  // Mixture of experts (models/moe_stats.h), shown when moe: the last micro-batch's load-balancing
  // loss (unweighted), and the tokens each (sparse layer, expert) kept since the previous line —
  // the fewest, the most, max/mean — and the assignments a capacity factor dropped (when any).
  bool moe = false;
  double aux_loss = 0.0;
  double expert_min = 0.0, expert_max = 0.0, expert_imbalance = 0.0;
  std::int64_t expert_dropped = 0;
  // Several ranks: the slowest rank of the last step and its step time ("| slowest rank 3: 2.41 s");
  // -1: not shown (one rank).
  int slowest_rank = -1;
  double slowest_s = 0.0;
  // Model FLOPs utilisation over the same steps as tokens_per_s (a fraction); < 0: not shown.
  double mfu = -1.0;
};

std::string format_progress(const ProgressLine& p);

// "0.4s", "12.3s", "1m05s", "2h03m".
std::string format_duration(double seconds);

// 41210.7 -> "41,211".
std::string format_count(double value);

}  // namespace dstrain
