// StragglerDetector: names a rank whose optimizer step keeps taking much longer than the others'.
// Every rank feeds it the same vector of every rank's step seconds (one all-reduce per step,
// RankTrainer), so every rank reaches the same verdicts; rank 0 logs them.
//
//   StragglerDetector d(2.0, 3);                 // factor x the median, for 3 consecutive steps
//   for (const Straggler& s : d.observe(times))  // once per step, times[r] = rank r's seconds
//     log(s.rank, s.seconds, s.median);
//
// A rank is slow at a step when its time is > factor x the median of that step's times (the median
// of an even count is the mean of the two middle values). It is named once, at the step where it
// has been slow for `steps` consecutive steps, and again only after a step where it was not slow
// (an episode). With 2 ranks the median is their mean, which no rank exceeds by a factor >= 2.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dstrain {

struct Straggler {
  int rank = 0;
  double seconds = 0.0;  // the rank's mean step time over the last `steps` steps
  double median = 0.0;   // the mean of those steps' medians
  double ratio = 0.0;    // seconds / median
};

class StragglerDetector {
 public:
  // factor: 0 turns detection off; else > 1. steps: >= 1. Error (ops/error.h) otherwise.
  StragglerDetector(double factor, int steps);

  bool enabled() const { return factor_ > 0.0; }
  // One step's times, rank r's at [r] (the same length every call). Returns the ranks named at
  // this step, in rank order.
  std::vector<Straggler> observe(std::span<const double> seconds);

  // The median of `values` (empty: 0).
  static double median(std::span<const double> values);

 private:
  double factor_;
  int steps_;
  std::vector<int> slow_run_;             // per rank: consecutive slow steps so far
  std::vector<bool> named_;               // per rank: named in the current episode
  std::vector<std::vector<double>> last_; // per rank: its last `steps` times (ring)
  std::vector<double> medians_;           // the last `steps` medians (ring)
  std::int64_t observed_ = 0;
};

}  // namespace dstrain
