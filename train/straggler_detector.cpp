#include "train/straggler_detector.h"

#include <algorithm>
#include <cmath>

#include "ops/error.h"

namespace dstrain {

StragglerDetector::StragglerDetector(double factor, int steps) : factor_(factor), steps_(steps) {
  if (!std::isfinite(factor) || (factor != 0.0 && factor <= 1.0) || factor < 0.0)
    fail("--straggler-factor {}: must be 0 (no straggler detection) or a number > 1 (a rank slower than the median by this factor)", factor);
  if (steps < 1) fail("--straggler-steps {}: must be >= 1 (consecutive slow steps before a rank is named)", steps);
}

double StragglerDetector::median(std::span<const double> values) {
  if (values.empty()) return 0.0;
  std::vector<double> v(values.begin(), values.end());
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2.0;
}

std::vector<Straggler> StragglerDetector::observe(std::span<const double> seconds) {
  std::vector<Straggler> named;
  if (!enabled() || seconds.empty()) return named;
  const std::size_t n = seconds.size();
  if (slow_run_.size() != n) {
    slow_run_.assign(n, 0);
    named_.assign(n, false);
    last_.assign(n, std::vector<double>(static_cast<std::size_t>(steps_), 0.0));
    medians_.assign(static_cast<std::size_t>(steps_), 0.0);
    observed_ = 0;
  }
  const double m = median(seconds);
  const auto slot = static_cast<std::size_t>(observed_ % steps_);
  ++observed_;
  medians_[slot] = m;
  for (std::size_t r = 0; r < n; ++r) {
    last_[r][slot] = seconds[r];
    const bool slow = seconds[r] > factor_ * m;
    if (!slow) {
      slow_run_[r] = 0;
      named_[r] = false;  // recovered: a later episode is named again
      continue;
    }
    ++slow_run_[r];
    if (slow_run_[r] < steps_ || named_[r]) continue;
    named_[r] = true;
    Straggler s;
    s.rank = static_cast<int>(r);
    for (int k = 0; k < steps_; ++k) {
      s.seconds += last_[r][static_cast<std::size_t>(k)];
      s.median += medians_[static_cast<std::size_t>(k)];
    }
    s.seconds /= steps_;
    s.median /= steps_;
    s.ratio = s.median > 0.0 ? s.seconds / s.median : 0.0;
    named.push_back(s);
  }
  return named;
}

}  // namespace dstrain
