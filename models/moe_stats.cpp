#include "models/moe_stats.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "ops/error.h"

namespace dstrain {

void MoeStats::begin(bool report) {
  report_ = report;
  std::fill(assigned_.begin(), assigned_.end(), 0.0);
  std::fill(prob_sum_.begin(), prob_sum_.end(), 0.0);
  layers_ = 0;
  tokens_ = 0;
  recording = true;
}

void MoeStats::record(std::int64_t layer, std::span<const double> assigned, std::span<const double> prob_sum, std::span<const std::int32_t> kept,
                      std::int64_t dropped, std::int64_t tokens, double aux_weight) {
  if (!recording) return;
  const std::size_t E = assigned.size();
  if (prob_sum.size() != E || kept.size() != E) fail("MoeStats::record: layer {}: {} / {} / {} values for one expert count", layer, E, prob_sum.size(), kept.size());
  if (assigned_.empty()) {
    assigned_.assign(E, 0.0);
    prob_sum_.assign(E, 0.0);
  }
  if (assigned_.size() != E) fail("MoeStats::record: layer {} has {} experts, an earlier sparse layer {}", layer, E, assigned_.size());
  if (layers_ > 0 && tokens != tokens_) fail("MoeStats::record: layer {} routed {} tokens, an earlier sparse layer {}", layer, tokens, tokens_);
  for (std::size_t e = 0; e < E; ++e) {
    assigned_[e] += assigned[e];
    prob_sum_[e] += prob_sum[e];
  }
  ++layers_;
  tokens_ = tokens;
  aux_weight_ = aux_weight;
  if (layer < 0) fail("MoeStats::record: layer index {}", layer);
  if (!report_) return;
  if (kept_.size() <= static_cast<std::size_t>(layer)) kept_.resize(static_cast<std::size_t>(layer) + 1);
  std::vector<double>& k = kept_[static_cast<std::size_t>(layer)];
  if (k.empty()) k.assign(E, 0.0);
  for (std::size_t e = 0; e < E; ++e) k[e] += kept[e];
  dropped_ += dropped;
}

double MoeStats::aux_loss() const {
  if (layers_ == 0 || tokens_ == 0) return 0.0;
  const double rows = static_cast<double>(layers_) * static_cast<double>(tokens_);
  double s = 0.0;
  for (std::size_t e = 0; e < assigned_.size(); ++e) s += (assigned_[e] / rows) * (prob_sum_[e] / rows);
  return static_cast<double>(assigned_.size()) * s;
}

std::vector<float> MoeStats::aux_grad(float dloss) const {
  std::vector<float> g(assigned_.size(), 0.0f);
  if (layers_ == 0 || tokens_ == 0 || aux_weight_ == 0.0) return g;
  const double rows = static_cast<double>(layers_) * static_cast<double>(tokens_);
  const double E = static_cast<double>(assigned_.size());
  for (std::size_t e = 0; e < g.size(); ++e) g[e] = static_cast<float>(static_cast<double>(dloss) * aux_weight_ * E * assigned_[e] / (rows * rows));
  return g;
}

std::vector<double> MoeStats::pack() const {
  std::vector<double> v(assigned_);
  v.insert(v.end(), prob_sum_.begin(), prob_sum_.end());
  v.push_back(static_cast<double>(layers_));
  v.push_back(static_cast<double>(tokens_));
  return v;
}

void MoeStats::unpack(std::span<const double> v) {
  const std::size_t E = assigned_.size();
  if (v.size() != 2 * E + 2) fail("MoeStats::unpack: {} values for {} experts (2·E + 2 expected)", v.size(), E);
  std::copy_n(v.begin(), E, assigned_.begin());
  std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(E), E, prob_sum_.begin());
  // Summed over the group: the layers are the same on every rank (L stays), the tokens add up.
  tokens_ = static_cast<std::int64_t>(v[2 * E + 1]);
}

void MoeStats::load(std::span<const double> v, double aux_weight) {
  if (v.size() < 2 || v.size() % 2 != 0) fail("MoeStats::load: {} values (2·E + 2 expected)", v.size());
  const std::size_t E = (v.size() - 2) / 2;
  assigned_.assign(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(E));
  prob_sum_.assign(v.begin() + static_cast<std::ptrdiff_t>(E), v.begin() + static_cast<std::ptrdiff_t>(2 * E));
  layers_ = static_cast<std::int64_t>(v[2 * E]);
  tokens_ = static_cast<std::int64_t>(v[2 * E + 1]);
  aux_weight_ = aux_weight;
}

std::vector<double> MoeStats::report_pack(std::int64_t layers, std::int64_t experts) const {
  const auto L = static_cast<std::size_t>(layers), E = static_cast<std::size_t>(experts);
  if (kept_.size() > L) fail("MoeStats::report_pack: layer {} recorded, the model has {}", kept_.size() - 1, layers);
  std::vector<double> v(L + L * E + 1, 0.0);
  for (std::size_t l = 0; l < kept_.size(); ++l) {
    if (kept_[l].empty()) continue;
    if (kept_[l].size() != E) fail("MoeStats::report_pack: layer {} has {} experts, the model {}", l, kept_[l].size(), experts);
    v[l] = 1.0;
    std::copy(kept_[l].begin(), kept_[l].end(), v.begin() + static_cast<std::ptrdiff_t>(L + l * E));
  }
  v[L + L * E] = static_cast<double>(dropped_);
  return v;
}

void MoeStats::report_unpack(std::span<const double> v, std::int64_t layers, std::int64_t experts) {
  const auto L = static_cast<std::size_t>(layers), E = static_cast<std::size_t>(experts);
  if (v.size() != L + L * E + 1) fail("MoeStats::report_unpack: {} values for {} layers of {} experts", v.size(), layers, experts);
  kept_.assign(L, {});
  for (std::size_t l = 0; l < L; ++l)
    if (v[l] > 0.0) kept_[l].assign(v.begin() + static_cast<std::ptrdiff_t>(L + l * E), v.begin() + static_cast<std::ptrdiff_t>(L + (l + 1) * E));
  dropped_ = static_cast<std::int64_t>(v[L + L * E]);
}

MoeStats::Report MoeStats::take_report() { return take_report(nullptr); }

MoeStats::Report MoeStats::take_report(const std::function<void(std::span<double>)>& sum_over_ranks) {
  Report r;
  r.last_aux = last_aux_;
  r.dropped = dropped_;
  if (sum_over_ranks) {
    std::vector<double> v{1.0, r.last_aux, static_cast<double>(dropped_)};
    for (const std::vector<double>& k : kept_) v.insert(v.end(), k.begin(), k.end());
    sum_over_ranks(v);
    r.last_aux = v[0] > 0.0 ? v[1] / v[0] : 0.0;
    r.dropped = static_cast<std::int64_t>(v[2]);
    std::size_t at = 3;
    for (std::vector<double>& k : kept_) {
      std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(at), k.size(), k.begin());
      at += k.size();
    }
  }
  double sum = 0.0, n = 0.0;
  r.min = std::numeric_limits<double>::infinity();
  for (const std::vector<double>& k : kept_) {
    if (k.empty()) continue;
    ++r.layers;
    r.experts = static_cast<std::int64_t>(k.size());
    for (double c : k) {
      r.min = std::min(r.min, c);
      r.max = std::max(r.max, c);
      r.idle += c == 0.0 ? 1 : 0;
      sum += c;
      n += 1.0;
    }
  }
  if (n == 0.0) r.min = 0.0;
  r.mean = n > 0.0 ? sum / n : 0.0;
  kept_.clear();
  dropped_ = 0;
  return r;
}

}  // namespace dstrain
